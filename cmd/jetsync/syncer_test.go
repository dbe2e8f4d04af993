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
