package main

import (
	"flag"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/consumers/replica"
	"github.com/jetsync/jetsync/consumers/viewsyncer"
	"github.com/jetsync/jetsync/streams"
)

// authFlags are the Zero sync endpoint's token settings, under zero-cache's
// names.
type authFlags struct {
	secret   string
	jwk      string
	jwksURL  string
	issuer   string
	audience string
}

func (a *authFlags) register(fs *flag.FlagSet, e *env) {
	a.secret = e.str("ZERO_AUTH_SECRET", "")
	fs.Var(hidden{&a.secret}, "auth-secret", "shared secret verifying HS256/384/512 JWTs [ZERO_AUTH_SECRET]")
	// A JWK is usually public, but an "oct" one is a secret.
	a.jwk = e.str("ZERO_AUTH_JWK", "")
	fs.Var(hidden{&a.jwk}, "auth-jwk", "JSON Web Key verifying JWTs (RS*, PS*, ES*, EdDSA; HS* for an oct key) [ZERO_AUTH_JWK]")
	fs.StringVar(&a.jwksURL, "auth-jwks-url", e.str("ZERO_AUTH_JWKS_URL", ""), "URL of a JSON Web Key Set verifying JWTs; cached, refetched for an unknown kid [ZERO_AUTH_JWKS_URL]")
	fs.StringVar(&a.issuer, "auth-issuer", e.str("ZERO_AUTH_ISSUER", ""), "required iss claim [ZERO_AUTH_ISSUER]")
	fs.StringVar(&a.audience, "auth-audience", e.str("ZERO_AUTH_AUDIENCE", ""), "required aud claim [ZERO_AUTH_AUDIENCE]")
}

// hidden is a string flag that never shows its value, not even redacted.
type hidden struct{ v *string }

func (h hidden) String() string {
	if h.v == nil || *h.v == "" {
		return ""
	}
	return "(set)"
}

func (h hidden) Set(v string) error { *h.v = v; return nil }

// newSyncServer builds the Zero sync endpoint over cons's replica and mounts
// it on h.
func newSyncServer(h *httpServer, file string, cons *replica.Consumer, shard streams.Shard, a authFlags, log *slog.Logger, reg prometheus.Registerer) (*viewsyncer.Server, error) {
	srv, err := viewsyncer.New(viewsyncer.Config{
		ReplicaFile:  file,
		Replica:      cons,
		Shard:        shard,
		AuthSecret:   a.secret,
		AuthJWK:      a.jwk,
		AuthJWKSURL:  a.jwksURL,
		AuthIssuer:   a.issuer,
		AuthAudience: a.audience,
		Logger:       log.With("component", "view-syncer"),
		Registerer:   reg,
	})
	if err != nil {
		return nil, err
	}
	for _, p := range viewsyncer.Patterns {
		h.Handle(p, srv.Handler())
	}
	return srv, nil
}
