package viewsyncer

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/jetsync/jetsync/consumers/auth"
	"github.com/jetsync/jetsync/consumers/auth/authtest"
	"github.com/jetsync/jetsync/streams"
)

// The keys and tokens of authtest, by their names in these tests.
var (
	testKeys = authtest.Keys
	jwkJSON  = authtest.JWKJSON
	signJWT  = authtest.SignJWT
)

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
		c.AuthJWK = jwkJSON(t, &k.RSA.PublicKey, "", "")
		c.AuthIssuer, c.AuthAudience = "https://issuer.test", "my-app"
	})
	ecSrv := withAuth(t, e, func(c *Config) { c.AuthJWK = jwkJSON(t, &k.EC.PublicKey, "ignored-kid", "ES256") })
	edSrv := withAuth(t, e, func(c *Config) { c.AuthJWK = jwkJSON(t, k.Ed.Public(), "", "") })
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
		{"RS256", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.RSA, "", good), ""},
		{"RS512", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS512, k.RSA, "any-kid", good), ""},
		{"PS256", rsaSrv, "u1", signJWT(t, jwt.SigningMethodPS256, k.RSA, "", good), ""},
		{"ES256", ecSrv, "u1", signJWT(t, jwt.SigningMethodES256, k.EC, "", jwt.MapClaims{"sub": "u1"}), ""},
		{"EdDSA", edSrv, "u1", signJWT(t, jwt.SigningMethodEdDSA, k.Ed, "", jwt.MapClaims{"sub": "u1"}), ""},
		{"OctHS384", octSrv, "u1", signJWT(t, jwt.SigningMethodHS384, []byte(captureSecret), "", jwt.MapClaims{"sub": "u1"}), ""},
		{"OtherRSAKey", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.RSA2, "", good),
			"JWSSignatureVerificationFailed: signature verification failed"},
		{"OtherECKey", ecSrv, "u1", signJWT(t, jwt.SigningMethodES256, k.EC2, "", jwt.MapClaims{"sub": "u1"}),
			"JWSSignatureVerificationFailed: signature verification failed"},
		{"AlgPinnedByJWK", ecSrv, "u1", signJWT(t, jwt.SigningMethodES384, k.EC384, "", jwt.MapClaims{"sub": "u1"}),
			"TypeError: Invalid key for this operation, when present its alg must be ES384"},
		{"HMACAgainstRSAKey", rsaSrv, "u1", signJWT(t, jwt.SigningMethodHS256, []byte("secret"), "", good),
			`TypeError: JSON Web Key for symmetric algorithms must have JWK "kty" (Key Type) equal to "oct"`},
		{"ECAgainstRSAKey", rsaSrv, "u1", signJWT(t, jwt.SigningMethodES256, k.EC, "", good),
			"TypeError: Invalid key for this operation, its asymmetricKeyType must be ec"},
		{"WrongIssuer", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.RSA, "", with("iss", "https://evil.test")),
			`JWTClaimValidationFailed: unexpected "iss" claim value`},
		{"MissingIssuer", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.RSA, "", with("iss", nil)),
			`JWTClaimValidationFailed: missing required "iss" claim`},
		{"WrongAudience", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.RSA, "", with("aud", []string{"other", "apps"})),
			`JWTClaimValidationFailed: unexpected "aud" claim value`},
		{"AudienceInList", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.RSA, "", with("aud", []string{"other", "my-app"})), ""},
		{"WrongSubject", rsaSrv, "u2", signJWT(t, jwt.SigningMethodRS256, k.RSA, "", good),
			`JWTClaimValidationFailed: unexpected "sub" claim value`},
		{"MissingSubject", ecSrv, "u1", signJWT(t, jwt.SigningMethodES256, k.EC, "", jwt.MapClaims{"name": "u1"}),
			`JWTClaimValidationFailed: missing required "sub" claim`},
		// jose checks iss, sub and aud before the times.
		{"ExpiredAndWrongSubject", rsaSrv, "u2", signJWT(t, jwt.SigningMethodRS256, k.RSA, "", with("exp", now-60)),
			`JWTClaimValidationFailed: unexpected "sub" claim value`},
		{"Expired", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.RSA, "", with("exp", now-60)),
			`JWTExpired: "exp" claim timestamp check failed`},
		{"NotYetValid", rsaSrv, "u1", signJWT(t, jwt.SigningMethodRS256, k.RSA, "", with("nbf", now+600)),
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

// withJWKS serves e with ZERO_AUTH_JWKS_URL = js.URL and a fake clock.
func withJWKS(t *testing.T, e *env, url string) (*env, *authtest.Clock) {
	t.Helper()
	clk := authtest.NewClock(time.Now())
	s := withAuthPrep(t, e, func(c *Config) { c.AuthJWKSURL = url }, func(s *Server) {
		keys := s.cfg.authKeys()
		keys.Now = clk.Now
		v, err := auth.NewVerifier(keys)
		if err != nil {
			t.Fatal(err)
		}
		s.auth = v
	})
	return s, clk
}

func TestAuth_JWKS(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	k := testKeys()
	js := authtest.NewJWKSServer(t, jwkJSON(t, &k.RSA.PublicKey, "k1", "RS256"), jwkJSON(t, &k.EC.PublicKey, "k-ec", ""))
	srv, clk := withJWKS(t, e, js.URL)
	tok := func(m jwt.SigningMethod, key any, kid, sub string) string {
		return signJWT(t, m, key, kid, jwt.MapClaims{"sub": sub})
	}
	wantHits := func(t *testing.T, n int64) {
		t.Helper()
		if got := js.Hits.Load(); got != n {
			t.Fatalf("JWKS fetched %d times; want %d", got, n)
		}
	}

	t.Run("FetchedOnFirstToken", func(t *testing.T) {
		wantHits(t, 0)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.RSA, "k1", "u1")).hydrated()
		wantHits(t, 1)
		dialToken(t, srv, "u2", tok(jwt.SigningMethodES256, k.EC, "k-ec", "u2")).hydrated()
		wantHits(t, 1)
	})
	t.Run("NoKidPicksTheOnlyCandidate", func(t *testing.T) {
		dialToken(t, srv, "u1", tok(jwt.SigningMethodES256, k.EC, "", "u1")).hydrated()
	})
	t.Run("AlgPinnedByKey", func(t *testing.T) {
		// k1 is RS256 only: an RS512 token finds no key.
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS512, k.RSA, "k1", "u1")).expectError(kindAuthInvalidated,
			"Failed to decode auth token: JWKSNoMatchingKey: no applicable key found in the JSON Web Key Set", closeAuth)
	})
	t.Run("WrongSubject", func(t *testing.T) {
		dialToken(t, srv, "u2", tok(jwt.SigningMethodRS256, k.RSA, "k1", "u1")).expectError(kindAuthInvalidated,
			`Failed to decode auth token: JWTClaimValidationFailed: unexpected "sub" claim value`, closeAuth)
	})
	t.Run("HMACRefused", func(t *testing.T) {
		dialToken(t, srv, "u1", tok(jwt.SigningMethodHS256, []byte("x"), "k1", "u1")).expectError(kindAuthInvalidated,
			`Failed to decode auth token: JOSENotSupported: Unsupported "alg" value for a JSON Web Key Set`, closeAuth)
	})
	t.Run("UnknownKidIsRateLimited", func(t *testing.T) {
		// Within the cooldown of the last fetch, unknown kids cost nothing.
		start := js.Hits.Load()
		for i := range 5 {
			dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.RSA2, fmt.Sprintf("bogus%d", i), "u1")).expectError(kindAuthInvalidated,
				"Failed to decode auth token: JWKSNoMatchingKey: no applicable key found in the JSON Web Key Set", closeAuth)
		}
		wantHits(t, start)
		// Past it, the first costs one fetch and the rest nothing.
		clk.Advance(auth.JWKSCooldown)
		for i := range 5 {
			dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.RSA2, fmt.Sprintf("bogus%d", i), "u1")).expectError(kindAuthInvalidated,
				"Failed to decode auth token: JWKSNoMatchingKey", closeAuth)
		}
		wantHits(t, start+1)
	})
	t.Run("Rotation", func(t *testing.T) {
		start := js.Hits.Load()
		js.Set(http.StatusOK, jwkJSON(t, &k.RSA.PublicKey, "k1", "RS256"), jwkJSON(t, &k.RSA2.PublicKey, "k2", "RS256"))
		clk.Advance(auth.JWKSCooldown)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.RSA2, "k2", "u1")).hydrated()
		wantHits(t, start+1)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.RSA2, "k2", "u1")).hydrated()
		wantHits(t, start+1)
		// k1 retired: tokens still carrying it pass until the cached set
		// ages out.
		js.Set(http.StatusOK, jwkJSON(t, &k.RSA2.PublicKey, "k2", "RS256"))
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.RSA, "k1", "u1")).hydrated()
		clk.Advance(auth.JWKSMaxAge)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.RSA, "k1", "u1")).expectError(kindAuthInvalidated,
			"Failed to decode auth token: JWKSNoMatchingKey", closeAuth)
		wantHits(t, start+2)
	})
	t.Run("MultipleCandidates", func(t *testing.T) {
		js.Set(http.StatusOK, jwkJSON(t, &k.RSA.PublicKey, "", ""), jwkJSON(t, &k.RSA2.PublicKey, "", ""))
		clk.Advance(auth.JWKSMaxAge)
		dialToken(t, srv, "u1", tok(jwt.SigningMethodRS256, k.RSA, "", "u1")).expectError(kindAuthInvalidated,
			"Failed to decode auth token: JWKSMultipleMatchingKeys: multiple matching keys found in the JSON Web Key Set", closeAuth)
	})
}

func TestAuth_JWKSDown(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	k := testKeys()
	js := authtest.NewJWKSServer(t, jwkJSON(t, &k.RSA.PublicKey, "k1", "RS256"))
	srv, clk := withJWKS(t, e, js.URL)
	token := signJWT(t, jwt.SigningMethodRS256, k.RSA, "k1", jwt.MapClaims{"sub": "u1"})
	issue := `{"table":"issue","orderBy":[["id","asc"]]}`

	// A client connected while the set was reachable.
	a := connect(t, srv, dialOpts{group: "down-a", client: "c1", user: "u1", token: token, init: initFrame(testSchema, put("q", issue, 0))})
	a.hydrated()

	t.Run("Non200", func(t *testing.T) {
		js.Set(http.StatusInternalServerError)
		clk.Advance(auth.JWKSMaxAge)
		before := js.Hits.Load()
		dialToken(t, srv, "u1", token).expectError(kindAuthInvalidated,
			"Failed to decode auth token: JOSEError: Expected 200 OK from the JSON Web Key Set HTTP response", closeAuth)
		// Within JWKSRetry the failure is reused, not refetched.
		dialToken(t, srv, "u1", token).expectError(kindAuthInvalidated, "Failed to decode auth token: JOSEError", closeAuth)
		if got := js.Hits.Load() - before; got != 1 {
			t.Errorf("JWKS fetched %d times after the failure; want 1", got)
		}
	})
	t.Run("Unreachable", func(t *testing.T) {
		js.CloseClientConnections()
		js.Close()
		clk.Advance(auth.JWKSRetry)
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
		js2 := authtest.NewJWKSServer(t, jwkJSON(t, &k.RSA.PublicKey, "k1", "RS256"))
		srv2, clk2 := withJWKS(t, e, js2.URL)
		js2.Set(http.StatusServiceUnavailable)
		dialToken(t, srv2, "u1", token).expectError(kindAuthInvalidated, "Failed to decode auth token: JOSEError", closeAuth)
		js2.Set(http.StatusOK, jwkJSON(t, &k.RSA.PublicKey, "k1", "RS256"))
		clk2.Advance(auth.JWKSRetry)
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
