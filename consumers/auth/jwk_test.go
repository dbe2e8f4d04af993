package auth_test

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"

	"github.com/jetsync/jetsync/consumers/auth"
	"github.com/jetsync/jetsync/consumers/auth/authtest"
	"github.com/jetsync/jetsync/internal/polltest"
)

func TestJWKSCache_ConcurrentUnknownKids(t *testing.T) {
	k := authtest.Keys()
	js := authtest.NewJWKSServer(t, authtest.JWKJSON(t, &k.RSA.PublicKey, "k1", "RS256"))
	clk := authtest.NewClock(time.Now())
	c := auth.NewJWKSCache(js.URL, slog.New(slog.DiscardHandler), clk.Now)
	ctx := context.Background()
	if _, err := c.KeyFor(ctx, "RS256", "k1"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(auth.JWKSCooldown)
	gate := make(chan struct{})
	js.Gate(gate)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			_, err := c.KeyFor(ctx, "RS256", fmt.Sprintf("bogus%d", i))
			errs <- err
		})
	}
	// Every caller is waiting on the one fetch in flight once the server
	// has it.
	polltest.Until(t, 10*time.Second, "the refetch to reach the JWKS server", func() bool { return js.Hits.Load() == 2 })
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil || !strings.HasPrefix(err.Error(), "JWKSNoMatchingKey") {
			t.Errorf("keyFor(bogus) = %v; want JWKSNoMatchingKey", err)
		}
	}
	if got := js.Hits.Load(); got != 2 {
		t.Errorf("JWKS fetched %d times; want 2", got)
	}
}

func TestJWKSCache_StaleWhileDown(t *testing.T) {
	k := authtest.Keys()
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		stale time.Duration
	}{{"Grace", time.Hour}, {"NoGrace", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			js := authtest.NewJWKSServer(t, authtest.JWKJSON(t, &k.RSA.PublicKey, "k1", "RS256"))
			clk := authtest.NewClock(time.Now())
			c := auth.NewJWKSCache(js.URL, slog.New(slog.DiscardHandler), clk.Now)
			c.SetStale(tc.stale)
			if _, err := c.KeyFor(ctx, "RS256", "k1"); err != nil {
				t.Fatal(err)
			}
			js.Set(http.StatusInternalServerError)
			clk.Advance(auth.JWKSMaxAge)
			_, err := c.KeyFor(ctx, "RS256", "k1")
			if tc.stale == 0 {
				if err == nil || !strings.Contains(err.Error(), "Expected 200 OK") {
					t.Fatalf("KeyFor with the set aged out and the server down = %v; want the fetch's error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("KeyFor within the stale period = %v; want the cached key", err)
			}
			// Refetches go on, at most once per JWKSRetry, and keep failing.
			clk.Advance(auth.JWKSRetry)
			if _, err := c.KeyFor(ctx, "RS256", "k1"); err != nil {
				t.Fatalf("KeyFor after another failed refetch = %v; want the cached key", err)
			}
			if got := js.Hits.Load(); got != 3 {
				t.Errorf("JWKS fetched %d times; want 3 (the first, then one per JWKSRetry)", got)
			}
			clk.Advance(tc.stale)
			if _, err := c.KeyFor(ctx, "RS256", "k1"); err == nil || !strings.Contains(err.Error(), "Expected 200 OK") {
				t.Fatalf("KeyFor past the stale period = %v; want the fetch's error", err)
			}
			js.Set(http.StatusOK, authtest.JWKJSON(t, &k.RSA.PublicKey, "k1", "RS256"))
			clk.Advance(auth.JWKSRetry)
			if _, err := c.KeyFor(ctx, "RS256", "k1"); err != nil {
				t.Fatalf("KeyFor once the server is back = %v", err)
			}
		})
	}
}

func TestKeys_Validate(t *testing.T) {
	k := authtest.Keys()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	x, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaJWK := authtest.JWKJSON(t, &k.RSA.PublicKey, "k1", "")
	private, err := jwkset.NewJWKFromKey(k.EC, jwkset.JWKOptions{Marshal: jwkset.JWKMarshalOptions{Private: true}})
	if err != nil {
		t.Fatal(err)
	}
	privateJSON, _ := json.Marshal(private.Marshal())
	ecPub := map[string]any{}
	_ = json.Unmarshal([]byte(authtest.JWKJSON(t, &k.EC.PublicKey, "", "")), &ecPub)
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
		keys auth.Keys
		err  string // "" for valid
	}{
		{"None", auth.Keys{}, ""},
		{"Secret", auth.Keys{Secret: "s"}, ""},
		{"RSAJWK", auth.Keys{JWK: rsaJWK}, ""},
		{"ECJWK", auth.Keys{JWK: authtest.JWKJSON(t, &k.EC384.PublicKey, "", "")}, ""},
		{"Ed25519JWK", auth.Keys{JWK: authtest.JWKJSON(t, k.Ed.Public(), "", "")}, ""},
		{"OctJWK", auth.Keys{JWK: `{"kty":"oct","k":"c2VjcmV0"}`}, ""},
		{"JWKSURL", auth.Keys{JWKSURL: "https://auth.example.com/.well-known/jwks.json"}, ""},
		{"SecretAndJWK", auth.Keys{Secret: "s", JWK: rsaJWK}, "only one of ZERO_AUTH_JWK, ZERO_AUTH_SECRET and ZERO_AUTH_JWKS_URL may be set, got ZERO_AUTH_JWK, ZERO_AUTH_SECRET"},
		{"AllThree", auth.Keys{Secret: "s", JWK: rsaJWK, JWKSURL: "https://x/"}, "only one of"},
		{"NotJSON", auth.Keys{JWK: "-----BEGIN PUBLIC KEY-----"}, "ZERO_AUTH_JWK: not a JSON Web Key"},
		{"JSONArray", auth.Keys{JWK: `[` + rsaJWK + `]`}, "not a JSON Web Key"},
		{"NoKty", auth.Keys{JWK: `{"n":"AQAB","e":"AQAB"}`}, `missing "kty"`},
		{"UnknownKty", auth.Keys{JWK: `{"kty":"DSA"}`}, "ZERO_AUTH_JWK"},
		{"RSAMissingN", auth.Keys{JWK: `{"kty":"RSA","e":"AQAB"}`}, `requires parameters "n" and "e"`},
		{"BadBase64", auth.Keys{JWK: jwkWith(rsaJWK, "n", `"!!!"`)}, "ZERO_AUTH_JWK"},
		{"ECPointOffCurve", auth.Keys{JWK: jwkWith(authtest.JWKJSON(t, &k.EC.PublicKey, "", ""), "y", fmt.Sprintf("%q", ecPub["x"]))}, "ZERO_AUTH_JWK"},
		{"UnknownCurve", auth.Keys{JWK: jwkWith(authtest.JWKJSON(t, &k.EC.PublicKey, "", ""), "crv", `"P-192"`)}, "unsupported curve"},
		{"PrivateKey", auth.Keys{JWK: string(privateJSON)}, "a private key"},
		{"RSA1024", auth.Keys{JWK: authtest.JWKJSON(t, &small.PublicKey, "", "")}, "RS256 requires key modulusLength to be 2048 bits or larger"},
		{"X25519", auth.Keys{JWK: authtest.JWKJSON(t, x.PublicKey(), "", "")}, "asymmetricKeyType must be ed25519"},
		{"UseEnc", auth.Keys{JWK: jwkWith(rsaJWK, "use", `"enc"`)}, "its use must be sig"},
		{"KeyOpsWithoutVerify", auth.Keys{JWK: jwkWith(rsaJWK, "key_ops", `["sign"]`)}, "key_ops must include verify"},
		{"EncryptionAlg", auth.Keys{JWK: jwkWith(rsaJWK, "alg", `"RSA-OAEP"`)}, `alg "RSA-OAEP"`},
		{"AlgForOtherKeyType", auth.Keys{JWK: jwkWith(rsaJWK, "alg", `"ES256"`)}, "asymmetricKeyType must be ec"},
		{"OctWithoutK", auth.Keys{JWK: `{"kty":"oct"}`}, `requires parameter "k"`},
		{"URLScheme", auth.Keys{JWKSURL: "ftp://x/jwks"}, `ZERO_AUTH_JWKS_URL: scheme "ftp"`},
		{"PlainHTTP", auth.Keys{JWKSURL: "http://auth.example.com/jwks"}, "ZERO_AUTH_JWKS_URL: http:// to a host other than loopback"},
		{"PlainHTTPAllowed", auth.Keys{JWKSURL: "http://auth.example.com/jwks", JWKSAllowHTTP: true}, ""},
		{"PlainHTTPLoopback", auth.Keys{JWKSURL: "http://127.0.0.1:8080/jwks"}, ""},
		{"PlainHTTPLocalhost", auth.Keys{JWKSURL: "http://localhost/jwks"}, ""},
		{"PlainHTTPLoopbackV6", auth.Keys{JWKSURL: "http://[::1]:8080/jwks"}, ""},
		{"NegativeStale", auth.Keys{JWKSURL: "https://x/", JWKSStale: -time.Second}, "must not be negative"},
		{"URLNoHost", auth.Keys{JWKSURL: "https:///jwks"}, "no host"},
		{"URLRelative", auth.Keys{JWKSURL: "/jwks"}, "scheme"},
		{"URLUnparsable", auth.Keys{JWKSURL: "http://[::1"}, "ZERO_AUTH_JWKS_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.keys.Validate()
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.err != "" && err == nil:
				t.Fatalf("Validate passed; want %q", tt.err)
			case tt.err != "" && !strings.Contains(err.Error(), tt.err):
				t.Fatalf("Validate: %v; want %q", err, tt.err)
			}
			if err == nil {
				if _, err := auth.NewVerifier(tt.keys); err != nil {
					t.Fatalf("NewVerifier: %v", err)
				}
			}
		})
	}
}

// FuzzParseConfigJWK: no input panics, and a JWK that passes verifies some
// algorithm.
func FuzzParseConfigJWK(f *testing.F) {
	k := authtest.Keys()
	f.Add(authtest.JWKJSON(f, &k.RSA.PublicKey, "k", "RS256"))
	f.Add(authtest.JWKJSON(f, &k.EC.PublicKey, "", ""))
	f.Add(authtest.JWKJSON(f, k.Ed.Public(), "", ""))
	f.Add(`{"kty":"oct","k":"c2VjcmV0","alg":"HS512"}`)
	f.Add(`{"kty":"EC","crv":"P-256","x":"","y":""}`)
	f.Add(`{"kty":"RSA","n":"AQAB","e":"AQAB","key_ops":null}`)
	f.Add(`{"keys":[]}`)
	f.Fuzz(func(t *testing.T, s string) {
		j, err := auth.ParseConfigJWK(s)
		if err != nil {
			return
		}
		for _, alg := range auth.SigningMethods {
			if key, err := j.VerifyKey(alg); err == nil && key != nil {
				return
			}
		}
		t.Fatalf("parseConfigJWK(%q) passed but verifies no algorithm", s)
	})
}
