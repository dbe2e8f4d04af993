package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/cvrstore"
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

func TestSyncFlags_GC(t *testing.T) {
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		want cvrstore.GCConfig
		bad  bool
	}{
		{name: "Defaults", want: cvrstore.GCConfig{Inactivity: 48 * time.Hour, Interval: time.Minute, BatchSize: 25}},
		{name: "FractionsFromEnv", vars: map[string]string{
			"ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS": "0.001",
			"ZERO_CVR_GARBAGE_COLLECTION_INITIAL_INTERVAL_SECONDS":   "0.5",
			"ZERO_CVR_GARBAGE_COLLECTION_INITIAL_BATCH_SIZE":         "0",
		}, want: cvrstore.GCConfig{Inactivity: 3600 * time.Millisecond, Interval: 500 * time.Millisecond}},
		{name: "FlagsWin", vars: map[string]string{"ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS": "2"},
			args: []string{"-cvr-garbage-collection-inactivity-threshold-hours", "1.5", "-cvr-garbage-collection-initial-batch-size", "5"},
			want: cvrstore.GCConfig{Inactivity: 90 * time.Minute, Interval: time.Minute, BatchSize: 5}},
		{name: "BadEnv", vars: map[string]string{"ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS": "2h"}, bad: true},
		{name: "BadFlag", args: []string{"-cvr-garbage-collection-initial-interval-seconds", "-1"}, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{lookup: func(k string) (string, bool) { v, ok := tc.vars[k]; return v, ok }}
			fs := flag.NewFlagSet("jetsync view-syncer", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var a syncFlags
			a.register(fs, e)
			err := errors.Join(e.err(), fs.Parse(tc.args))
			if (err != nil) != tc.bad {
				t.Fatalf("register and parse: %v; want error %v", err, tc.bad)
			}
			if !tc.bad && a.gc != tc.want {
				t.Errorf("gc = %+v; want %+v", a.gc, tc.want)
			}
		})
	}
}

func TestSyncFlags_API(t *testing.T) {
	vars := map[string]string{
		"ZERO_GET_QUERIES_URL":                  "http://api.test/query",
		"ZERO_PUSH_URL":                         "http://api.test/push",
		"ZERO_MUTATE_API_KEY":                   "k",
		"ZERO_AUTH_REVALIDATE_INTERVAL_SECONDS": "1.5",
	}
	e := &env{lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
	fs := flag.NewFlagSet("jetsync view-syncer", flag.ContinueOnError)
	var a syncFlags
	a.register(fs, e)
	if err := fs.Parse([]string{"-auth-retransform-interval-seconds", "0", "-query-allowed-client-headers", "x-a, x-b"}); err != nil {
		t.Fatal(err)
	}
	if err := e.err(); err != nil {
		t.Fatal(err)
	}
	if got := a.api.Query.URLs; len(got) != 1 || got[0] != "http://api.test/query" {
		t.Errorf("query URLs = %v; want the ZERO_GET_QUERIES_URL alias", got)
	}
	if got := a.api.Mutate; len(got.URLs) != 1 || got.URLs[0] != "http://api.test/push" || got.APIKey != "k" {
		t.Errorf("mutate = %+v; want the ZERO_PUSH_URL alias and the key", got)
	}
	if h := a.api.Query.AllowedClientHeaders; len(h) != 2 || h[1] != "x-b" {
		t.Errorf("allowed client headers = %q; want the flag's", h)
	}
	if a.revalidate != 1500*time.Millisecond || a.retransform != 0 {
		t.Errorf("intervals = %v, %v; want 1.5s from env and 0 from the flag", a.revalidate, a.retransform)
	}
}
