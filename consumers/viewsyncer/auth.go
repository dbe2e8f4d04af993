package viewsyncer

import (
	"errors"

	"github.com/golang-jwt/jwt/v5"
)

// hmacMethods are the algorithms a ZERO_AUTH_SECRET verifies.
var hmacMethods = []string{"HS256", "HS384", "HS512"}

// authenticate resolves a connection's token as zero-cache's resolveAuth
// does (server-model.md §10.2): no token is a logged-out connection; with a
// secret configured a token must be a valid JWT for userID; without one it
// is opaque and passed through. It returns the claims the read rules bind
// as authData: a verified JWT's payload, else an empty object.
func (s *Server) authenticate(token, userID string) (map[string]any, *protocolError) {
	none := map[string]any{}
	if token == "" {
		return none, nil
	}
	if userID == "" {
		return nil, authError(kindUnauthorized, "Authenticated connections require a userID.")
	}
	if s.cfg.AuthSecret == "" {
		return none, nil
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(hmacMethods), jwt.WithSubject(userID)}
	if s.cfg.AuthIssuer != "" {
		opts = append(opts, jwt.WithIssuer(s.cfg.AuthIssuer))
	}
	if s.cfg.AuthAudience != "" {
		opts = append(opts, jwt.WithAudience(s.cfg.AuthAudience))
	}
	key := []byte(s.cfg.AuthSecret)
	claims := jwt.MapClaims{}
	if _, err := jwt.ParseWithClaims(token, claims, func(*jwt.Token) (any, error) { return key, nil }, opts...); err != nil {
		return nil, authError(kindAuthInvalidated, "Failed to decode auth token: "+joseMessage(err))
	}
	return claims, nil
}

func authError(kind, msg string) *protocolError {
	e := newProtocolError(kind, "%s", msg)
	e.closeCode = closeAuth
	return e
}

// joseMessage renders a verification error as the jose library that
// zero-cache uses words it, since clients and tests match on it.
func joseMessage(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "JWSInvalid: Invalid Compact JWS"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "JWSSignatureVerificationFailed: signature verification failed"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return `JOSEAlgNotAllowed: "alg" (Algorithm) Header Parameter value not allowed`
	case errors.Is(err, jwt.ErrTokenExpired):
		return `JWTExpired: "exp" claim timestamp check failed`
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return `JWTClaimValidationFailed: "nbf" claim timestamp check failed`
	case errors.Is(err, jwt.ErrTokenInvalidSubject):
		return `JWTClaimValidationFailed: unexpected "sub" claim value`
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return `JWTClaimValidationFailed: unexpected "iss" claim value`
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return `JWTClaimValidationFailed: unexpected "aud" claim value`
	}
	return err.Error()
}
