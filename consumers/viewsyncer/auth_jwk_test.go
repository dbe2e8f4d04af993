package viewsyncer

import (
	"context"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"

	"github.com/jetsync/jetsync/streams"
)

// testKeys are the key pairs the tests sign with, generated once: RSA
// generation is slow.
var testKeys = sync.OnceValue(func() (k struct {
	rsa, rsa2 *rsa.PrivateKey
	ec, ec2   *ecdsa.PrivateKey
	ec384     *ecdsa.PrivateKey
	ed        ed25519.PrivateKey
}) {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	var err error
	k.rsa, err = rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	k.rsa2, err = rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	k.ec2, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	k.ec384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	must(err)
	_, k.ed, err = ed25519.GenerateKey(rand.Reader)
	must(err)
	return k
})

// jwkJSON is pub as a JSON Web Key with the given kid and alg ("" for none).
func jwkJSON(t testing.TB, pub any, kid, alg string) string {
	t.Helper()
	j, err := jwkset.NewJWKFromKey(pub, jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: kid, ALG: jwkset.ALG(alg)}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(j.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func signJWT(t testing.TB, m jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// withAuth serves e's replica from a second view-syncer whose auth
// settings set chooses, and returns e pointed at it.
func withAuth(t *testing.T, e *env, set func(*Config)) *env {
	t.Helper()
	return withAuthPrep(t, e, set, func(*Server) {})
}

// withAuthPrep is withAuth with prep run on the server before it serves.
func withAuthPrep(t *testing.T, e *env, set func(*Config), prep func(*Server)) *env {
	t.Helper()
	cfg := e.srv.cfg
	cfg.AuthSecret, cfg.AuthJWK, cfg.AuthJWKSURL, cfg.AuthIssuer, cfg.AuthAudience = "", "", "", "", ""
	set(&cfg)
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	prep(srv)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	mux := http.NewServeMux()
	for _, p := range Patterns {
		mux.Handle(p, srv.Handler())
	}
	hs := httptest.NewServer(mux)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		srv.Close()
	})
	e2 := *e
	e2.srv, e2.http = srv, hs
	return &e2
}

var groupSeq atomic.Int64

// dialToken connects a fresh client group as user with token.
func dialToken(t *testing.T, e *env, user, token string) *tc {
	t.Helper()
	g := fmt.Sprintf("jwk%d", groupSeq.Add(1))
	return connect(t, e, dialOpts{group: g, client: "c1", user: user, token: token, init: initFrame(testSchema)})
}

func TestAuth_JWK(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	k := testKeys()
	now := time.Now().Unix()
	rsaSrv := withAuth(t, e, func(c *Config) {
		c.AuthJWK = jwkJSON(t, &k.rsa.PublicKey, "", "")
		c.AuthIssuer, c.AuthAudience = "https://issuer.test", "my-app"
	})
	ecSrv := withAuth(t, e, func(c *Config) { c.AuthJWK = jwkJSON(t, &k.ec.PublicKey, "ignored-kid", "ES256") })
	edSrv := withAuth(t, e, func(c *Config) { c.AuthJWK = jwkJSON(t, k.ed.Public(), "", "") })
	octSrv := withAuth(t, e, func(c *Config) {
		c.AuthJWK = `{"kty":"oct","k":"` + base64.RawURLEncoding.EncodeToString([]byte(captureSecret)) + `"}`
	})
	good := jwt.MapClaims{"sub": "u1", "iss": "https://issuer.test", "aud": "my-app", "exp": now + 60}
	with := func(kv ...any) jwt.MapClaims {
		c := jwt.MapClaims{}
		for k, v := range good {
			c[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(c, kv[i].(string))
			} else {
				c[kv[i].(string)] = kv[i+1]
			}
		}
		return c
	}
	tests := []struct {
		name  string
		srv   *env
		user  string
		token string
		msg   string // "" when the client is accepted
	}{
		{"RS256", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.rsa, "", good), ""},
		{"RS512", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS512, k.rsa, "any-kid", good), ""},
		{"PS256", rsaSrv, "u1", signJWT(t, jwt.SigningMethodPS256, k.rsa, "", good), ""},
		{"ES256", ecSrv, "u1", signJWT(t, jwt.SigningMethodES256, k.ec, "", jwt.MapClaims{"sub": "u1"}), ""},
		{"EdDSA", edSrv, "u1", signJWT(t, jwt.SigningMethodEdDSA, k.ed, "", jwt.MapClaims{"sub": "u1"}), ""},
		{"OctHS384", octSrv, "u1", signJWT(t, jwt.SigningMethodHS384, []byte(captureSecret), "", jwt.MapClaims{"sub": "u1"}), ""},
		{"OtherRSAKey", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.rsa2, "", good),
			"JWSSignatureVerificationFailed: signature verification failed"},
		{"OtherECKey", ecSrv, "u1", signJWT(t, jwt.SigningMethodES256, k.ec2, "", jwt.MapClaims{"sub": "u1"}),
			"JWSSignatureVerificationFailed: signature verification failed"},
		{"AlgPinnedByJWK", ecSrv, "u1", signJWT(t, jwt.SigningMethodES384, k.ec384, "", jwt.MapClaims{"sub": "u1"}),
			"TypeError: Invalid key for this operation, when present its alg must be ES384"},
		{"HMACAgainstRSAKey", rsaSrv, "u1", signJWT(t, jwt.SigningMethodHS256, []byte("secret"), "", good),
			`TypeError: JSON Web Key for symmetric algorithms must have JWK "kty" (Key Type) equal to "oct"`},
		{"ECAgainstRSAKey", rsaSrv, "u1", signJWT(t, jwt.SigningMethodES256, k.ec, "", good),
			"TypeError: Invalid key for this operation, its asymmetricKeyType must be ec"},
		{"WrongIssuer", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.rsa, "", with("iss", "https://evil.test")),
			`JWTClaimValidationFailed: unexpected "iss" claim value`},
		{"MissingIssuer", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.rsa, "", with("iss", nil)),
			`JWTClaimValidationFailed: missing required "iss" claim`},
		{"WrongAudience", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.rsa, "", with("aud", []string{"other", "apps"})),
			`JWTClaimValidationFailed: unexpected "aud" claim value`},
		{"AudienceInList", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.rsa, "", with("aud", []string{"other", "my-app"})), ""},
		{"WrongSubject", rsaSrv, "u2", signJWT(t, jwt.SigningMethodRS256, k.rsa, "", good),
			`JWTClaimValidationFailed: unexpected "sub" claim value`},
		{"MissingSubject", ecSrv, "u1", signJWT(t, jwt.SigningMethodES256, k.ec, "", jwt.MapClaims{"name": "u1"}),
			`JWTClaimValidationFailed: missing required "sub" claim`},
		// jose checks iss, sub and aud before the times.
		{"ExpiredAndWrongSubject", rsaSrv, "u2", signJWT(t, jwt.SigningMethodRS256, k.rsa, "", with("exp", now-60)),
			`JWTClaimValidationFailed: unexpected "sub" claim value`},
		{"Expired", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.rsa, "", with("exp", now-60)),
			`JWTExpired: "exp" claim timestamp check failed`},
		{"NotYetValid", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.rsa, "", with("nbf", now+600)),
			`JWTClaimValidationFailed: "nbf" claim timestamp check failed`},
		{"Garbage", rsaSrv, "u1", "not.a-jwt", "JWSInvalid: Invalid Compact JWS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dialToken(t, tt.srv, tt.user, tt.token)
			if tt.msg == "" {
				c.hydrated()
				return
			}
			c.expectError(kindAuthInvalidated, "Failed to decode auth token: "+tt.msg, closeAuth)
		})
	}
}

// jwksServer serves a key set the test can change, counting requests.
type jwksServer struct {
	*httptest.Server
	hits   atomic.Int64
	mu     sync.Mutex
	keys   []string
	status int
	gate   chan struct{} // if set, requests wait for it to close
}

func newJWKSServer(t *testing.T, keys ...string) *jwksServer {
	s := &jwksServer{keys: keys, status: http.StatusOK}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		s.mu.Lock()
		status, body, gate := s.status, `{"keys":[`+strings.Join(s.keys, ",")+`]}`, s.gate
		s.mu.Unlock()
		if gate != nil {
			<-gate
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(status int, keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.keys = status, keys
}

// fakeClock is the JWKS cache's clock, moved by the test.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// withJWKS serves e with ZERO_AUTH_JWKS_URL = js.URL and a fake clock.
func withJWKS(t *testing.T, e *env, url string) (*env, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Now()}
	s := withAuthPrep(t, e, func(c *Config) { c.AuthJWKSURL = url }, func(s *Server) { s.auth.jwks.now = clk.now })
	return s, clk
}

func TestAuth_JWKS(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	k := testKeys()
	js := newJWKSServer(t, jwkJSON(t, &k.rsa.PublicKey, "k1", "RS256"), jwkJSON(t, &k.ec.PublicKey, "k-ec", ""))
	srv, clk := withJWKS(t, e, js.URL)
	tok := func(m jwt.SigningMethod, key any, kid, sub string) string {
		return signJWT(t, m, key, kid, jwt.MapClaims{"sub": sub})
	}
	wantHits := func(t *testing.T, n int64) {
		t.Helper()
		if got := js.hits.Load(); got != n {
			t.Fatalf("JWKS fetched %d times; want %d", got, n)
		}
	}

	t.Run("FetchedOnFirstToken", func(t *testing.T) {
		wantHits(t, 0)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.rsa, "k1", "u1")).hydrated()
		wantHits(t, 1)
		dialToken(t, srv, "u2", tok(jwt.SigningMethodES256, k.ec, "k-ec", "u2")).hydrated()
		wantHits(t, 1)
	})
	t.Run("NoKidPicksTheOnlyCandidate", func(t *testing.T) {
		dialToken(t, srv, "u1", tok(jwt.SigningMethodES256, k.ec, "", "u1")).hydrated()
	})
	t.Run("AlgPinnedByKey", func(t *testing.T) {
		// k1 is RS256 only: an RS512 token finds no key.
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS512, k.rsa, "k1", "u1")).expectError(kindAuthInvalidated,
			"Failed to decode auth token: JWKSNoMatchingKey: no applicable key found in the JSON Web Key Set", closeAuth)
	})
	t.Run("WrongSubject", func(t *testing.T) {
		dialToken(t, srv, "u2", tok(jwt.SigningMethodRS256, k.rsa, "k1", "u1")).expectError(kindAuthInvalidated,
			`Failed to decode auth token: JWTClaimValidationFailed: unexpected "sub" claim value`, closeAuth)
	})
	t.Run("HMACRefused", func(t *testing.T) {
		dialToken(t, srv, "u1", tok(jwt.SigningMethodHS256, []byte("x"), "k1", "u1")).expectError(kindAuthInvalidated,
			`Failed to decode auth token: JOSENotSupported: Unsupported "alg" value for a JSON Web Key Set`, closeAuth)
	})
	t.Run("UnknownKidIsRateLimited", func(t *testing.T) {
		// Within the cooldown of the last fetch, unknown kids cost nothing.
		start := js.hits.Load()
		for i := range 5 {
			dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.rsa2, fmt.Sprintf("bogus%d", i), "u1")).expectError(kindAuthInvalidated,
				"Failed to decode auth token: JWKSNoMatchingKey: no applicable key found in the JSON Web Key Set", closeAuth)
		}
		wantHits(t, start)
		// Past it, the first costs one fetch and the rest nothing.
		clk.advance(jwksCooldown)
		for i := range 5 {
			dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.rsa2, fmt.Sprintf("bogus%d", i), "u1")).expectError(kindAuthInvalidated,
				"Failed to decode auth token: JWKSNoMatchingKey", closeAuth)
		}
		wantHits(t, start+1)
	})
	t.Run("Rotation", func(t *testing.T) {
		start := js.hits.Load()
		js.set(http.StatusOK, jwkJSON(t, &k.rsa.PublicKey, "k1", "RS256"), jwkJSON(t, &k.rsa2.PublicKey, "k2", "RS256"))
		clk.advance(jwksCooldown)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.rsa2, "k2", "u1")).hydrated()
		wantHits(t, start+1)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.rsa2, "k2", "u1")).hydrated()
		wantHits(t, start+1)
		// k1 retired: tokens still carrying it pass until the cached set
		// ages out.
		js.set(http.StatusOK, jwkJSON(t, &k.rsa2.PublicKey, "k2", "RS256"))
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.rsa, "k1", "u1")).hydrated()
		clk.advance(jwksMaxAge)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.rsa, "k1", "u1")).expectError(kindAuthInvalidated,
			"Failed to decode auth token: JWKSNoMatchingKey", closeAuth)
		wantHits(t, start+2)
	})
	t.Run("MultipleCandidates", func(t *testing.T) {
		js.set(http.StatusOK, jwkJSON(t, &k.rsa.PublicKey, "", ""), jwkJSON(t, &k.rsa2.PublicKey, "", ""))
		clk.advance(jwksMaxAge)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.rsa, "", "u1")).expectError(kindAuthInvalidated,
			"Failed to decode auth token: JWKSMultipleMatchingKeys: multiple matching keys found in the JSON Web Key Set", closeAuth)
	})
}

func TestAuth_JWKSConcurrentUnknownKids(t *testing.T) {
	k := testKeys()
	js := newJWKSServer(t, jwkJSON(t, &k.rsa.PublicKey, "k1", "RS256"))
	c := newJWKSCache(js.URL, slog.New(slog.DiscardHandler))
	clk := &fakeClock{t: time.Now()}
	c.now = clk.now
	ctx := context.Background()
	if _, err := c.keyFor(ctx, "RS256", "k1"); err != nil {
		t.Fatal(err)
	}
	clk.advance(jwksCooldown)
	gate := make(chan struct{})
	js.mu.Lock()
	js.gate = gate
	js.mu.Unlock()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			_, err := c.keyFor(ctx, "RS256", fmt.Sprintf("bogus%d", i))
			errs <- err
		})
	}
	// Every caller is waiting on the one fetch in flight once the server
	// has it.
	waitFor(t, "the refetch to reach the JWKS server", func() bool { return js.hits.Load() == 2 })
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil || !strings.HasPrefix(err.Error(), "JWKSNoMatchingKey") {
			t.Errorf("keyFor(bogus) = %v; want JWKSNoMatchingKey", err)
		}
	}
	if got := js.hits.Load(); got != 2 {
		t.Errorf("JWKS fetched %d times; want 2", got)
	}
}

func TestAuth_JWKSDown(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	k := testKeys()
	js := newJWKSServer(t, jwkJSON(t, &k.rsa.PublicKey, "k1", "RS256"))
	srv, clk := withJWKS(t, e, js.URL)
	token := signJWT(t, jwt.SigningMethodRS256, k.rsa, "k1", jwt.MapClaims{"sub": "u1"})
	issue := `{"table":"issue","orderBy":[["id","asc"]]}`

	// A client connected while the set was reachable.
	a := connect(t, srv, dialOpts{group: "down-a", client: "c1", user: "u1", token: token, init: initFrame(testSchema, put("q", issue, 0))})
	a.hydrated()

	t.Run("Non200", func(t *testing.T) {
		js.set(http.StatusInternalServerError)
		clk.advance(jwksMaxAge)
		before := js.hits.Load()
		dialToken(t, srv, "u1", token).expectError(kindAuthInvalidated,
			"Failed to decode auth token: JOSEError: Expected 200 OK from the JSON Web Key Set HTTP response", closeAuth)
		// Within jwksRetry the failure is reused, not refetched.
		dialToken(t, srv, "u1", token).expectError(kindAuthInvalidated, "Failed to decode auth token: JOSEError", closeAuth)
		if got := js.hits.Load() - before; got != 1 {
			t.Errorf("JWKS fetched %d times after the failure; want 1", got)
		}
	})
	t.Run("Unreachable", func(t *testing.T) {
		js.CloseClientConnections()
		js.Close()
		clk.advance(jwksRetry)
		dialToken(t, srv, "u1", token).expectError(kindAuthInvalidated,
			"Failed to decode auth token: Error: fetch JSON Web Key Set: dial tcp", closeAuth)
	})
	t.Run("OthersUnaffected", func(t *testing.T) {
		// A logged-out client connects, and the one connected before keeps
		// syncing.
		connect(t, srv, dialOpts{group: "down-b", client: "c1", init: initFrame(testSchema)}).hydrated()
		srv.tx("public", "issue", streams.Change{Op: streams.OpUpdate, New: streams.Row{"id": raw("i0000001"), "title": raw("still synced")}})
		p := a.poke()
		if countPrefix(p, "row ") == 0 {
			t.Fatalf("poke after the JWKS went down has no rows: %+v", p)
		}
	})
	t.Run("RecoversWhenBack", func(t *testing.T) {
		js2 := newJWKSServer(t, jwkJSON(t, &k.rsa.PublicKey, "k1", "RS256"))
		srv2, clk2 := withJWKS(t, e, js2.URL)
		js2.set(http.StatusServiceUnavailable)
		dialToken(t, srv2, "u1", token).expectError(kindAuthInvalidated, "Failed to decode auth token: JOSEError", closeAuth)
		js2.set(http.StatusOK, jwkJSON(t, &k.rsa.PublicKey, "k1", "RS256"))
		clk2.advance(jwksRetry)
		dialToken(t, srv2, "u1", token).hydrated()
	})
}

func TestAuth_NoKeyConfigured(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	token := signJWT(t, jwt.SigningMethodHS256, []byte(captureSecret), "", jwt.MapClaims{"sub": "u1"})
	for _, user := range []string{"u1", ""} {
		t.Run("User"+user, func(t *testing.T) {
			dialToken(t, e, user, token).expectError(kindInternal, "Exactly one of jwk, secret, or jwksUrl must be set", closeNormal)
		})
	}
	t.Run("LoggedOut", func(t *testing.T) {
		dialToken(t, e, "u1", "").hydrated()
	})
}

func TestConfig_ValidateAuth(t *testing.T) {
	k := testKeys()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	x, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaJWK := jwkJSON(t, &k.rsa.PublicKey, "k1", "")
	private, err := jwkset.NewJWKFromKey(k.ec, jwkset.JWKOptions{Marshal: jwkset.JWKMarshalOptions{Private: true}})
	if err != nil {
		t.Fatal(err)
	}
	privateJSON, _ := json.Marshal(private.Marshal())
	ecPub := map[string]any{}
	_ = json.Unmarshal([]byte(jwkJSON(t, &k.ec.PublicKey, "", "")), &ecPub)
	jwkWith := func(base string, kv ...string) string {
		m := map[string]any{}
		_ = json.Unmarshal([]byte(base), &m)
		for i := 0; i < len(kv); i += 2 {
			var v any
			if err := json.Unmarshal([]byte(kv[i+1]), &v); err != nil {
				t.Fatal(err)
			}
			m[kv[i]] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	tests := []struct {
		name string
		cfg  Config
		err  string // "" for valid
	}{
		{"None", Config{}, ""},
		{"Secret", Config{AuthSecret: "s"}, ""},
		{"RSAJWK", Config{AuthJWK: rsaJWK}, ""},
		{"ECJWK", Config{AuthJWK: jwkJSON(t, &k.ec384.PublicKey, "", "")}, ""},
		{"Ed25519JWK", Config{AuthJWK: jwkJSON(t, k.ed.Public(), "", "")}, ""},
		{"OctJWK", Config{AuthJWK: `{"kty":"oct","k":"c2VjcmV0"}`}, ""},
		{"JWKSURL", Config{AuthJWKSURL: "https://auth.example.com/.well-known/jwks.json"}, ""},
		{"SecretAndJWK", Config{AuthSecret: "s", AuthJWK: rsaJWK}, "only one of ZERO_AUTH_JWK, ZERO_AUTH_SECRET and ZERO_AUTH_JWKS_URL may be set, got ZERO_AUTH_JWK, ZERO_AUTH_SECRET"},
		{"AllThree", Config{AuthSecret: "s", AuthJWK: rsaJWK, AuthJWKSURL: "https://x/"}, "only one of"},
		{"NotJSON", Config{AuthJWK: "-----BEGIN PUBLIC KEY-----"}, "ZERO_AUTH_JWK: not a JSON Web Key"},
		{"JSONArray", Config{AuthJWK: `[` + rsaJWK + `]`}, "not a JSON Web Key"},
		{"NoKty", Config{AuthJWK: `{"n":"AQAB","e":"AQAB"}`}, `missing "kty"`},
		{"UnknownKty", Config{AuthJWK: `{"kty":"DSA"}`}, "ZERO_AUTH_JWK"},
		{"RSAMissingN", Config{AuthJWK: `{"kty":"RSA","e":"AQAB"}`}, `requires parameters "n" and "e"`},
		{"BadBase64", Config{AuthJWK: jwkWith(rsaJWK, "n", `"!!!"`)}, "ZERO_AUTH_JWK"},
		{"ECPointOffCurve", Config{AuthJWK: jwkWith(jwkJSON(t, &k.ec.PublicKey, "", ""), "y", fmt.Sprintf("%q", ecPub["x"]))}, "ZERO_AUTH_JWK"},
		{"UnknownCurve", Config{AuthJWK: jwkWith(jwkJSON(t, &k.ec.PublicKey, "", ""), "crv", `"P-192"`)}, "unsupported curve"},
		{"PrivateKey", Config{AuthJWK: string(privateJSON)}, "a private key"},
		{"RSA1024", Config{AuthJWK: jwkJSON(t, &small.PublicKey, "", "")}, "RS256 requires key modulusLength to be 2048 bits or larger"},
		{"X25519", Config{AuthJWK: jwkJSON(t, x.PublicKey(), "", "")}, "asymmetricKeyType must be ed25519"},
		{"UseEnc", Config{AuthJWK: jwkWith(rsaJWK, "use", `"enc"`)}, "its use must be sig"},
		{"KeyOpsWithoutVerify", Config{AuthJWK: jwkWith(rsaJWK, "key_ops", `["sign"]`)}, "key_ops must include verify"},
		{"EncryptionAlg", Config{AuthJWK: jwkWith(rsaJWK, "alg", `"RSA-OAEP"`)}, `alg "RSA-OAEP"`},
		{"AlgForOtherKeyType", Config{AuthJWK: jwkWith(rsaJWK, "alg", `"ES256"`)}, "asymmetricKeyType must be ec"},
		{"OctWithoutK", Config{AuthJWK: `{"kty":"oct"}`}, `requires parameter "k"`},
		{"URLScheme", Config{AuthJWKSURL: "ftp://x/jwks"}, `ZERO_AUTH_JWKS_URL: scheme "ftp"`},
		{"URLNoHost", Config{AuthJWKSURL: "https:///jwks"}, "no host"},
		{"URLRelative", Config{AuthJWKSURL: "/jwks"}, "scheme"},
		{"URLUnparsable", Config{AuthJWKSURL: "http://[::1"}, "ZERO_AUTH_JWKS_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.validateAuth()
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("validateAuth: %v", err)
			case tt.err != "" && err == nil:
				t.Fatalf("validateAuth passed; want %q", tt.err)
			case tt.err != "" && !strings.Contains(err.Error(), tt.err):
				t.Fatalf("validateAuth: %v; want %q", err, tt.err)
			}
			if err == nil {
				if _, err := newTokenVerifier(tt.cfg); err != nil {
					t.Fatalf("newTokenVerifier: %v", err)
				}
			}
		})
	}
}

// FuzzParseConfigJWK: no input panics, and a JWK that passes verifies some
// algorithm.
func FuzzParseConfigJWK(f *testing.F) {
	k := testKeys()
	f.Add(jwkJSON(f, &k.rsa.PublicKey, "k", "RS256"))
	f.Add(jwkJSON(f, &k.ec.PublicKey, "", ""))
	f.Add(jwkJSON(f, k.ed.Public(), "", ""))
	f.Add(`{"kty":"oct","k":"c2VjcmV0","alg":"HS512"}`)
	f.Add(`{"kty":"EC","crv":"P-256","x":"","y":""}`)
	f.Add(`{"kty":"RSA","n":"AQAB","e":"AQAB","key_ops":null}`)
	f.Add(`{"keys":[]}`)
	f.Fuzz(func(t *testing.T, s string) {
		j, err := parseConfigJWK(s)
		if err != nil {
			return
		}
		for _, alg := range signingMethods {
			if key, err := j.verifyKey(alg); err == nil && key != nil {
				return
			}
		}
		t.Fatalf("parseConfigJWK(%q) passed but verifies no algorithm", s)
	})
}
