package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// signingMethods are the algorithms a token may be signed with; the key
// decides which of them it verifies (keyFor), as jose does for zero-cache.
// jose's ES256K, Ed448 and "Ed25519" algorithms have no golang-jwt method
// and are refused.
var signingMethods = []string{
	"HS256", "HS384", "HS512",
	"RS256", "RS384", "RS512",
	"PS256", "PS384", "PS512",
	"ES256", "ES384", "ES512",
	"EdDSA",
}

// Keys are the token settings: ZERO_AUTH_SECRET, ZERO_AUTH_JWK,
// ZERO_AUTH_JWKS_URL (at most one of the three), ZERO_AUTH_ISSUER and
// ZERO_AUTH_AUDIENCE.
type Keys struct {
	Secret, JWK, JWKSURL string
	// Issuer and Audience, when set, are required iss and aud claims.
	Issuer, Audience string
	// Logger gets the JWKS fetch failures; nil means slog.Default().
	Logger *slog.Logger
	// Now is the JWKS cache's clock; nil means time.Now.
	Now func() time.Time
	// JWKSStale is how long past JWKSMaxAge a fetched set still verifies
	// tokens while refetching it fails; 0 refuses tokens at once, as
	// zero-cache does.
	JWKSStale time.Duration
	// JWKSAllowHTTP allows an http:// JWKS URL to a host other than
	// loopback.
	JWKSAllowHTTP bool
}

// Validate checks k: at most one key source (a misconfiguration
// zero-cache reports only when the first token arrives, by crashing its
// syncer), and a JWK or JWKS URL that can be used.
func (k Keys) Validate() error {
	var set []string
	for _, s := range []struct{ name, v string }{
		{"ZERO_AUTH_JWK", k.JWK}, {"ZERO_AUTH_SECRET", k.Secret}, {"ZERO_AUTH_JWKS_URL", k.JWKSURL},
	} {
		if s.v != "" {
			set = append(set, s.name)
		}
	}
	if len(set) > 1 {
		return fmt.Errorf("auth: only one of ZERO_AUTH_JWK, ZERO_AUTH_SECRET and ZERO_AUTH_JWKS_URL may be set, got %s", strings.Join(set, ", "))
	}
	if k.JWK != "" {
		if _, err := parseConfigJWK(k.JWK); err != nil {
			return fmt.Errorf("auth: ZERO_AUTH_JWK: %w", err)
		}
	}
	if k.JWKSStale < 0 {
		return fmt.Errorf("auth: JWKS stale period %v: must not be negative", k.JWKSStale)
	}
	if k.JWKSURL != "" {
		if err := validateJWKSURL(k.JWKSURL, k.JWKSAllowHTTP); err != nil {
			return fmt.Errorf("auth: ZERO_AUTH_JWKS_URL: %w", err)
		}
	}
	return nil
}

// Verifier checks JWTs as zero-cache's verifyToken does with jose:
// signature by the configured key, then iss, sub and aud, then nbf and exp.
type Verifier struct {
	// keyFor returns the key verifying a token signed with alg whose header
	// names kid ("" if none), or a joseError.
	keyFor           func(ctx context.Context, alg, kid string) (any, error)
	issuer, audience string
	jwks             *jwksCache // for a JWKS URL, else nil
}

// NewVerifier returns the verifier for k (validated), or nil when no key
// source is set.
func NewVerifier(k Keys) (*Verifier, error) {
	v := &Verifier{issuer: k.Issuer, audience: k.Audience}
	switch {
	case k.Secret != "":
		secret := []byte(k.Secret)
		v.keyFor = func(_ context.Context, alg, _ string) (any, error) {
			if !strings.HasPrefix(alg, "HS") {
				return nil, joseError("TypeError: Key for the " + alg + " algorithm must be one of type KeyObject or CryptoKey. Received an instance of Uint8Array")
			}
			return secret, nil
		}
	case k.JWK != "":
		key, err := parseConfigJWK(k.JWK)
		if err != nil {
			return nil, err
		}
		v.keyFor = func(_ context.Context, alg, _ string) (any, error) { return key.verifyKey(alg) }
	case k.JWKSURL != "":
		log := k.Logger
		if log == nil {
			log = slog.Default()
		}
		v.jwks = newJWKSCache(k.JWKSURL, log)
		v.jwks.stale = k.JWKSStale
		if k.Now != nil {
			v.jwks.now = k.Now
		}
		v.keyFor = v.jwks.keyFor
	default:
		return nil, nil
	}
	return v, nil
}

// Verify returns token's claims if it is a valid JWT for userID, else an
// error worded as jose words it (JoseMessage).
func (v *Verifier) Verify(ctx context.Context, token, userID string) (map[string]any, error) {
	claims := jwt.MapClaims{}
	keyfunc := func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		return v.keyFor(ctx, t.Method.Alg(), kid)
	}
	// Claims are checked below, in jose's order, so that the first failure
	// is the one zero-cache would name.
	_, err := jwt.ParseWithClaims(token, claims, keyfunc, jwt.WithValidMethods(signingMethods), jwt.WithoutClaimsValidation())
	if err != nil {
		return nil, err
	}
	if err := v.checkClaims(claims, userID); err != nil {
		return nil, err
	}
	return claims, nil
}

// checkClaims is jose's jwtVerify claim validation with zero-cache's
// options: presence of the expected claims, their values, then the times.
func (v *Verifier) checkClaims(claims jwt.MapClaims, userID string) error {
	expected := []struct{ claim, want string }{{"iss", v.issuer}, {"sub", userID}, {"aud", v.audience}}
	for _, e := range expected {
		if _, ok := claims[e.claim]; e.want != "" && !ok {
			return joseError(fmt.Sprintf(`JWTClaimValidationFailed: missing required %q claim`, e.claim))
		}
	}
	if iss, _ := claims["iss"].(string); v.issuer != "" && iss != v.issuer {
		return joseError(`JWTClaimValidationFailed: unexpected "iss" claim value`)
	}
	if sub, _ := claims["sub"].(string); sub != userID {
		return joseError(`JWTClaimValidationFailed: unexpected "sub" claim value`)
	}
	if v.audience != "" {
		aud, _ := claims.GetAudience()
		if !slices.Contains(aud, v.audience) {
			return joseError(`JWTClaimValidationFailed: unexpected "aud" claim value`)
		}
	}
	now := float64(time.Now().Unix())
	if iat, ok := claims["iat"]; ok {
		if _, num := iat.(float64); !num {
			return joseError(`JWTClaimValidationFailed: "iat" claim must be a number`)
		}
	}
	if x, ok := claims["nbf"]; ok {
		nbf, num := x.(float64)
		if !num {
			return joseError(`JWTClaimValidationFailed: "nbf" claim must be a number`)
		}
		if nbf > now {
			return joseError(`JWTClaimValidationFailed: "nbf" claim timestamp check failed`)
		}
	}
	if x, ok := claims["exp"]; ok {
		exp, num := x.(float64)
		if !num {
			return joseError(`JWTClaimValidationFailed: "exp" claim must be a number`)
		}
		if exp <= now {
			return joseError(`JWTExpired: "exp" claim timestamp check failed`)
		}
	}
	return nil
}

// joseError is a verification failure already worded as jose's String(e):
// "<error class>: <message>".
type joseError string

func (e joseError) Error() string { return string(e) }

// JoseMessage renders a verification error as the jose library that
// zero-cache uses words it, since clients and tests match on it.
func JoseMessage(err error) string {
	var je joseError
	switch {
	case errors.As(err, &je):
		return string(je)
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "JWSInvalid: Invalid Compact JWS"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "JWSSignatureVerificationFailed: signature verification failed"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return `JOSEAlgNotAllowed: "alg" (Algorithm) Header Parameter value not allowed`
	}
	return err.Error()
}
