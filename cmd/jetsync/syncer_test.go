package main

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func TestAuthFlags_Register(t *testing.T) {
	const jwk = `{"kty":"oct","k":"c2VjcmV0LWtleQ"}`
	vars := map[string]string{"ZERO_AUTH_JWK": jwk, "ZERO_AUTH_JWKS_URL": "https://env.test/jwks", "ZERO_AUTH_ISSUER": "iss"}
	e := &env{lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
	fs := flag.NewFlagSet("jetsync view-syncer", flag.ContinueOnError)
	var a syncFlags
	a.register(fs, e)
	if err := fs.Parse([]string{"-auth-jwks-url", "https://flag.test/jwks"}); err != nil {
		t.Fatal(err)
	}
	if a.jwk != jwk || a.jwksURL != "https://flag.test/jwks" || a.issuer != "iss" || a.secret != "" {
		t.Errorf("syncFlags = %+v; want the JWK and issuer from env, the JWKS URL from the flag", a)
	}
	var usage bytes.Buffer
	fs.SetOutput(&usage)
	fs.PrintDefaults()
	for _, name := range []string{"ZERO_AUTH_SECRET", "ZERO_AUTH_JWK", "ZERO_AUTH_JWKS_URL"} {
		if !strings.Contains(usage.String(), "["+name+"]") {
			t.Errorf("usage lacks %s:\n%s", name, usage.String())
		}
	}
	// An "oct" JWK is a secret.
	if strings.Contains(usage.String(), "c2VjcmV0") {
		t.Errorf("usage shows the JWK:\n%s", usage.String())
	}
}
