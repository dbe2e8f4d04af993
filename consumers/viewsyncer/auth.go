package viewsyncer

import (
	"context"
	"errors"
	"fmt"
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

// errNoAuthConfigured is zero-cache's answer to a token on a connection
// when none of the three key settings is set.
const errNoAuthConfigured = "Exactly one of jwk, secret, or jwksUrl must be set in order to verify tokens but actually the following were set: []. " +
	"You may also set both ZERO_MUTATE_URL and ZERO_QUERY_URL to enable custom mutations and queries without passing token verification options."

// validateAuth checks the token settings of c: at most one key source (a
// misconfiguration zero-cache reports only when the first token arrives,
// by crashing its syncer), and a JWK or JWKS URL that can be used.
func (c Config) validateAuth() error {
	var set []string
	for _, s := range []struct{ name, v string }{
		{"ZERO_AUTH_JWK", c.AuthJWK}, {"ZERO_AUTH_SECRET", c.AuthSecret}, {"ZERO_AUTH_JWKS_URL", c.AuthJWKSURL},
	} {
		if s.v != "" {
			set = append(set, s.name)
		}
	}
	if len(set) > 1 {
		return fmt.Errorf("auth: only one of ZERO_AUTH_JWK, ZERO_AUTH_SECRET and ZERO_AUTH_JWKS_URL may be set, got %s", strings.Join(set, ", "))
	}
	if c.AuthJWK != "" {
		if _, err := parseConfigJWK(c.AuthJWK); err != nil {
			return fmt.Errorf("auth: ZERO_AUTH_JWK: %w", err)
		}
	}
	if c.AuthJWKSURL != "" {
		if err := validateJWKSURL(c.AuthJWKSURL); err != nil {
			return fmt.Errorf("auth: ZERO_AUTH_JWKS_URL: %w", err)
		}
	}
	return nil
}

// tokenVerifier checks JWTs as zero-cache's verifyToken does with jose:
// signature by the configured key, then iss, sub and aud, then nbf and exp.
type tokenVerifier struct {
	// keyFor returns the key verifying a token signed with alg whose header
	// names kid ("" if none), or a joseError.
	keyFor           func(ctx context.Context, alg, kid string) (any, error)
	issuer, audience string
	jwks             *jwksCache // for a JWKS URL, else nil
}

// newTokenVerifier returns the verifier for c's settings (validated), or
// nil when no key source is set.
func newTokenVerifier(c Config) (*tokenVerifier, error) {
	v := &tokenVerifier{issuer: c.AuthIssuer, audience: c.AuthAudience}
	switch {
	case c.AuthSecret != "":
		secret := []byte(c.AuthSecret)
		v.keyFor = func(_ context.Context, alg, _ string) (any, error) {
			if !strings.HasPrefix(alg, "HS") {
				return nil, joseError("TypeError: Key for the " + alg + " algorithm must be one of type KeyObject or CryptoKey. Received an instance of Uint8Array")
			}
			return secret, nil
		}
	case c.AuthJWK != "":
		k, err := parseConfigJWK(c.AuthJWK)
		if err != nil {
			return nil, err
		}
		v.keyFor = func(_ context.Context, alg, _ string) (any, error) { return k.verifyKey(alg) }
	case c.AuthJWKSURL != "":
		v.jwks = newJWKSCache(c.AuthJWKSURL, c.Logger)
		v.keyFor = v.jwks.keyFor
	default:
		return nil, nil
	}
	return v, nil
}

// verify returns token's claims if it is a valid JWT for userID, else an
// error worded as jose words it.
func (v *tokenVerifier) verify(ctx context.Context, token, userID string) (jwt.MapClaims, error) {
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
func (v *tokenVerifier) checkClaims(claims jwt.MapClaims, userID string) error {
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

// authenticate resolves a connection's token as zero-cache's resolveAuth
// does (docs/protocol.md §13): no token is a logged-out connection; with a
// key configured a token must be a valid JWT for userID; without one it is
// opaque and passed through to the API server when both its query and
// mutate URLs are configured; otherwise zero-cache refuses it on connect
// (connecting). It returns a verified JWT's claims, nil for an opaque token
// or none.
func (s *Server) authenticate(ctx context.Context, token, userID string, connecting bool) (map[string]any, *protocolError) {
	if token == "" {
		return nil, nil
	}
	if s.auth == nil && connecting && !s.opaqueTokens() {
		// zero-cache throws here, outside its protocol errors, and the
		// unhandled rejection takes its syncer down; one failed
		// connection is the useful part of that.
		s.log.Error("token sent but no ZERO_AUTH_SECRET, ZERO_AUTH_JWK or ZERO_AUTH_JWKS_URL is set")
		return nil, newProtocolError(kindInternal, "%s", errNoAuthConfigured)
	}
	if userID == "" {
		return nil, authError(kindUnauthorized, "Authenticated connections require a userID.")
	}
	if s.auth == nil {
		return nil, nil
	}
	claims, err := s.auth.verify(ctx, token, userID)
	if err != nil {
		return nil, authError(kindAuthInvalidated, "Failed to decode auth token: "+joseMessage(err))
	}
	return claims, nil
}

// opaqueTokens reports whether tokens may be opaque without a key: the API
// server, at both endpoints, is then their authority (docs/protocol.md §13).
func (s *Server) opaqueTokens() bool {
	return s.api.QueryConfigured() && s.api.MutateConfigured()
}

func authError(kind, msg string) *protocolError {
	e := newProtocolError(kind, "%s", msg)
	e.closeCode = closeAuth
	return e
}

// joseError is a verification failure already worded as jose's String(e):
// "<error class>: <message>".
type joseError string

func (e joseError) Error() string { return string(e) }

// joseMessage renders a verification error as the jose library that
// zero-cache uses words it, since clients and tests match on it.
func joseMessage(err error) string {
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
