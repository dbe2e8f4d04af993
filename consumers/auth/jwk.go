package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/MicahParks/jwkset"
)

// jose's createRemoteJWKSet defaults, which zero-cache keeps.
const (
	// JWKSMaxAge is how long a fetched set is used before it is fetched
	// again.
	JWKSMaxAge = 10 * time.Minute
	// JWKSCooldown is how soon after a fetch a token with an unknown key
	// may fetch again: a flood of unknown kids costs one request per
	// cooldown.
	JWKSCooldown = 30 * time.Second
	jwksTimeout  = 5 * time.Second
)

const (
	// JWKSRetry spaces the fetches after a failed one. jose retries on
	// every token, which would hammer a JWKS URL that is down.
	JWKSRetry = time.Second
	// jwksMaxBytes bounds a JWKS response.
	jwksMaxBytes = 1 << 20
)

// jwk is one JSON Web Key, decoded by jwkset, with the members jose checks
// before verifying with it.
type jwk struct {
	kty, alg, use, crv, kid string
	keyOps                  []string // nil when absent
	// key is *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey or, for
	// kty "oct", the secret's []byte.
	key any
	// err, if set, is why this key verifies nothing (a JWKS member jose
	// would refuse once a token picks it).
	err error
}

// parseJWK decodes one JSON Web Key. A private key is refused: jose
// verifies with public keys only.
func parseJWK(raw []byte, allowSecret bool) (*jwk, error) {
	var m jwkset.JWKMarshal
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("not a JSON Web Key: %w", err)
	}
	k := &jwk{kty: string(m.KTY), alg: string(m.ALG), use: string(m.USE), crv: string(m.CRV), kid: m.KID}
	if m.KEYOPS != nil {
		k.keyOps = make([]string, len(m.KEYOPS))
		for i, o := range m.KEYOPS {
			k.keyOps[i] = string(o)
		}
	}
	switch {
	case k.kty == "":
		return k, errors.New(`missing "kty"`)
	case k.kty == string(jwkset.KtyOct) && !allowSecret:
		return k, errors.New(`a symmetric ("oct") key has no place in a JSON Web Key Set`)
	case k.kty != string(jwkset.KtyOct) && m.D != "":
		return k, errors.New(`a private key (it has "d"): give its public key`)
	}
	// jose ignores unknown use and key_ops values (checkKey refuses keys
	// whose use or key_ops exclude verifying).
	opts := jwkset.JWKValidateOptions{SkipUse: true, SkipKeyOps: true}
	j, err := jwkset.NewJWKFromMarshal(m, jwkset.JWKMarshalOptions{Private: k.kty == string(jwkset.KtyOct)}, opts)
	if err != nil {
		return k, err
	}
	k.key = j.Key()
	return k, nil
}

// parseConfigJWK decodes ZERO_AUTH_JWK and checks it verifies some
// algorithm, so that a key no token could pass fails at startup rather
// than on every connection, as it would in zero-cache.
func parseConfigJWK(s string) (*jwk, error) {
	k, err := parseJWK([]byte(s), true)
	if err != nil {
		return nil, err
	}
	probe := k.alg
	if probe == "" {
		probe = map[string]string{"RSA": "RS256", "OKP": "EdDSA", "oct": "HS256"}[k.kty]
		if k.kty == "EC" {
			probe = map[string]string{"P-384": "ES384", "P-521": "ES512"}[k.crv]
			if probe == "" {
				probe = "ES256"
			}
		}
	}
	if !slices.Contains(signingMethods, probe) {
		return nil, fmt.Errorf("alg %q: want one of %s", probe, strings.Join(signingMethods, ", "))
	}
	if _, err := k.verifyKey(probe); err != nil {
		return nil, err
	}
	return k, nil
}

// verifyKey returns the key verifying tokens signed with alg, or why it
// can't, in jose's words (its checkKeyType and keyForCrypto).
func (k *jwk) verifyKey(alg string) (any, error) {
	if k.err != nil {
		return nil, k.err
	}
	if strings.HasPrefix(alg, "HS") {
		if k.kty != string(jwkset.KtyOct) {
			return nil, joseError(`TypeError: JSON Web Key for symmetric algorithms must have JWK "kty" (Key Type) equal to "oct" and the JWK "k" (Key Value) present`)
		}
	} else if k.kty == string(jwkset.KtyOct) {
		return nil, joseError("TypeError: JSON Web Key for this operation be a public JWK")
	}
	if k.use != "" && k.use != string(jwkset.UseSig) {
		return nil, joseError("TypeError: Invalid key for this operation, when present its use must be sig")
	}
	if k.keyOps != nil && !slices.Contains(k.keyOps, string(jwkset.KeyOpsVerify)) {
		return nil, joseError("TypeError: Invalid key for this operation, when present its key_ops must include verify")
	}
	if k.alg != "" && k.alg != alg {
		return nil, joseError("TypeError: Invalid key for this operation, when present its alg must be " + alg)
	}
	switch alg[:2] {
	case "HS":
		if b, ok := k.key.([]byte); ok {
			return b, nil
		}
	case "RS", "PS":
		pub, ok := k.key.(*rsa.PublicKey)
		if !ok {
			return nil, joseError("TypeError: Invalid key for this operation, its asymmetricKeyType must be rsa")
		}
		if pub.N.BitLen() < 2048 {
			return nil, joseError("TypeError: " + alg + " requires key modulusLength to be 2048 bits or larger")
		}
		return pub, nil
	case "ES":
		pub, ok := k.key.(*ecdsa.PublicKey)
		if !ok {
			return nil, joseError("TypeError: Invalid key for this operation, its asymmetricKeyType must be ec")
		}
		want := map[string]string{"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}[alg]
		if got := pub.Curve.Params().Name; got != want {
			return nil, joseError(fmt.Sprintf("TypeError: Invalid key curve for the algorithm, its curve must be %s, got %s", want, got))
		}
		return pub, nil
	case "Ed":
		if pub, ok := k.key.(ed25519.PublicKey); ok {
			return pub, nil
		}
		return nil, joseError("TypeError: Invalid key for this operation, its asymmetricKeyType must be ed25519 or ed448")
	}
	return nil, joseError(fmt.Sprintf("JOSENotSupported: alg %s is not supported either by JOSE or your javascript runtime", alg))
}

// matches reports whether k is a candidate for a token's alg and kid, by
// jose's LocalJWKSet rules.
func (k *jwk) matches(alg, kty, kid string) bool {
	if k.kty != kty || (kid != "" && k.kid != kid) || (k.alg != "" && k.alg != alg) || (k.use != "" && k.use != "sig") {
		return false
	}
	if k.keyOps != nil && !slices.Contains(k.keyOps, "verify") {
		return false
	}
	switch alg {
	case "ES256":
		return k.crv == "P-256"
	case "ES384":
		return k.crv == "P-384"
	case "ES512":
		return k.crv == "P-521"
	case "EdDSA":
		return k.crv == "Ed25519" || k.crv == "Ed448"
	}
	return true
}

// parseJWKS decodes a JSON Web Key Set. Members that don't decode are kept
// with their error, as jose only imports a member once a token picks it.
func parseJWKS(b []byte) ([]*jwk, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, joseError("JOSEError: Failed to parse the JSON Web Key Set HTTP response as JSON")
	}
	if set.Keys == nil {
		return nil, joseError("JWKSInvalid: JSON Web Key Set malformed")
	}
	keys := make([]*jwk, 0, len(set.Keys))
	for _, raw := range set.Keys {
		if !strings.HasPrefix(strings.TrimSpace(string(raw)), "{") {
			return nil, joseError("JWKSInvalid: JSON Web Key Set malformed")
		}
		k, err := parseJWK(raw, false)
		if k == nil {
			k = &jwk{}
		}
		if err != nil {
			k.err = joseError("JWKSInvalid: " + err.Error())
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func validateJWKSURL(s string, allowHTTP bool) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" {
		return errors.New("no host")
	}
	// Whoever can answer a plain-HTTP fetch on the way picks the keys
	// that sign every token. Loopback traffic does not cross a network.
	if u.Scheme == "http" && !allowHTTP && !loopbackHost(u.Hostname()) {
		return errors.New("http:// to a host other than loopback: use https://, or set JETSYNC_AUTH_JWKS_ALLOW_HTTP")
	}
	return nil
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// jwksCache is ZERO_AUTH_JWKS_URL's key set: fetched when a token first
// needs it, used for JWKSMaxAge, and fetched again early when a token names
// a key it lacks, at most once per JWKSCooldown. Concurrent fetches are
// merged into one.
type jwksCache struct {
	url    string
	stale  time.Duration // how long past JWKSMaxAge a set serves while refetches fail
	client *http.Client
	log    *slog.Logger
	now    func() time.Time // time.Now; tests move it

	mu       sync.Mutex
	keys     []*jwk
	fetched  time.Time     // when keys were fetched; zero before that
	failed   time.Time     // when a fetch last failed
	failure  error         // that fetch's error, nil once one succeeds
	inflight chan struct{} // closed when the fetch in flight ends
}

func newJWKSCache(u string, log *slog.Logger) *jwksCache {
	return &jwksCache{
		url: u,
		log: log,
		now: time.Now,
		client: &http.Client{
			// fetch's context bounds it too; this covers what escapes it.
			Timeout: jwksTimeout,
			// As Node's http.get, which jose uses: a redirect is an
			// answer other than 200.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// keyFor returns the set's key for a token's alg and kid.
func (c *jwksCache) keyFor(ctx context.Context, alg, kid string) (any, error) {
	var kty string
	switch {
	case strings.HasPrefix(alg, "RS"), strings.HasPrefix(alg, "PS"):
		kty = "RSA"
	case strings.HasPrefix(alg, "ES"):
		kty = "EC"
	case strings.HasPrefix(alg, "Ed"):
		kty = "OKP"
	default:
		return nil, joseError(`JOSENotSupported: Unsupported "alg" value for a JSON Web Key Set`)
	}
	var match []*jwk
	for _, unknown := range []bool{false, true} {
		keys, err := c.get(ctx, unknown)
		if err != nil {
			return nil, err
		}
		match = match[:0]
		for _, k := range keys {
			if k.matches(alg, kty, kid) {
				match = append(match, k)
			}
		}
		if len(match) > 0 {
			break
		}
	}
	switch len(match) {
	case 0:
		return nil, joseError("JWKSNoMatchingKey: no applicable key found in the JSON Web Key Set")
	case 1:
		return match[0].verifyKey(alg)
	}
	return nil, joseError("JWKSMultipleMatchingKeys: multiple matching keys found in the JSON Web Key Set")
}

// get returns the set, fetching it first if it is missing or stale, or if
// unknown (a token named a key the set lacks) and the cooldown has passed.
func (c *jwksCache) get(ctx context.Context, unknown bool) ([]*jwk, error) {
	for {
		c.mu.Lock()
		if ch := c.inflight; ch != nil {
			c.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		now := c.now()
		stale := c.fetched.IsZero() || now.Sub(c.fetched) >= JWKSMaxAge
		if !stale && (!unknown || now.Sub(c.fetched) < JWKSCooldown) {
			keys := c.keys
			c.mu.Unlock()
			return keys, nil
		}
		if c.failure != nil && now.Sub(c.failed) < JWKSRetry {
			keys, err := c.keys, c.failure
			graced := c.graced(now)
			c.mu.Unlock()
			if stale && !graced {
				return nil, err
			}
			return keys, nil
		}
		ch := make(chan struct{})
		c.inflight = ch
		c.mu.Unlock()

		keys, err := c.fetch(ctx)

		c.mu.Lock()
		c.inflight = nil
		close(ch)
		var graced bool
		if err != nil {
			c.failure, c.failed = err, c.now()
			graced = stale && c.graced(c.failed)
			keys = c.keys
		} else {
			c.keys, c.fetched, c.failure = keys, c.now(), nil
		}
		fetched := c.fetched
		c.mu.Unlock()
		if graced {
			// An outage of the key server would otherwise log every
			// user out at once.
			c.log.Warn("fetch JWKS; using the cached set", "url", c.url, "err", err,
				"fetched", fetched.UTC().Format(time.RFC3339), "until", fetched.Add(JWKSMaxAge+c.stale).UTC().Format(time.RFC3339))
			return keys, nil
		}
		if err != nil {
			c.log.Warn("fetch JWKS", "url", c.url, "err", err)
			return nil, err
		}
		return keys, nil
	}
}

// graced reports whether a set past JWKSMaxAge may still serve at now
// because refetching it fails. c.mu is held.
func (c *jwksCache) graced(now time.Time) bool {
	return c.stale > 0 && !c.fetched.IsZero() && now.Sub(c.fetched) < JWKSMaxAge+c.stale
}

// fetch GETs the set. It is shared by every token waiting on it, so one
// caller's cancellation doesn't end it; jwksTimeout does.
func (c *jwksCache) fetch(ctx context.Context) ([]*jwk, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jwksTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return nil, joseError("TypeError: " + err.Error())
	}
	resp, err := c.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, joseError("JWKSTimeout: request timed out")
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, joseError("Error: fetch JSON Web Key Set: " + err.Error())
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, joseError("JOSEError: Expected 200 OK from the JSON Web Key Set HTTP response")
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, jwksMaxBytes+1))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, joseError("JWKSTimeout: request timed out")
		}
		return nil, joseError("Error: read JSON Web Key Set: " + err.Error())
	}
	if len(b) > jwksMaxBytes {
		return nil, joseError(fmt.Sprintf("JOSEError: JSON Web Key Set response over %d bytes", jwksMaxBytes))
	}
	return parseJWKS(b)
}
