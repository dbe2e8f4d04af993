package authtest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"sync"
	"testing"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
)

// TestKeys are the key pairs tests sign with.
type TestKeys struct {
	RSA, RSA2 *rsa.PrivateKey
	EC, EC2   *ecdsa.PrivateKey
	EC384     *ecdsa.PrivateKey
	Ed        ed25519.PrivateKey
}

// Keys returns the test key pairs, generated once per test binary: RSA
// generation is slow.
var Keys = sync.OnceValue(func() (k TestKeys) {
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	var err error
	k.RSA, err = rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	k.RSA2, err = rsa.GenerateKey(rand.Reader, 2048)
	must(err)
	k.EC, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	k.EC2, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	k.EC384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	must(err)
	_, k.Ed, err = ed25519.GenerateKey(rand.Reader)
	must(err)
	return k
})

// JWKJSON is pub as a JSON Web Key with the given kid and alg ("" for none).
func JWKJSON(t testing.TB, pub any, kid, alg string) string {
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

// SignJWT signs claims with key by m, naming kid in the header unless it
// is "".
func SignJWT(t testing.TB, m jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
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
