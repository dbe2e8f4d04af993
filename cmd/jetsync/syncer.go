package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/replica"
	"github.com/jetsync/jetsync/consumers/viewsyncer"
)

// syncFlags are the Zero sync endpoint's settings: its token settings,
// under zero-cache's names, and where client groups' CVRs live.
type syncFlags struct {
	secret   string
	jwk      string
	jwksURL  string
	issuer   string
	audience string

	groupIdle time.Duration
	leaseTTL  time.Duration
	advertise string
	cvrFile   string
}

func (a *syncFlags) register(fs *flag.FlagSet, e *env) {
	a.secret = e.str("ZERO_AUTH_SECRET", "")
	fs.Var(hidden{&a.secret}, "auth-secret", "shared secret verifying HS256/384/512 JWTs [ZERO_AUTH_SECRET]")
	// A JWK is usually public, but an "oct" one is a secret.
	a.jwk = e.str("ZERO_AUTH_JWK", "")
	fs.Var(hidden{&a.jwk}, "auth-jwk", "JSON Web Key verifying JWTs (RS*, PS*, ES*, EdDSA; HS* for an oct key) [ZERO_AUTH_JWK]")
	fs.StringVar(&a.jwksURL, "auth-jwks-url", e.str("ZERO_AUTH_JWKS_URL", ""), "URL of a JSON Web Key Set verifying JWTs; cached, refetched for an unknown kid [ZERO_AUTH_JWKS_URL]")
	fs.StringVar(&a.issuer, "auth-issuer", e.str("ZERO_AUTH_ISSUER", ""), "required iss claim [ZERO_AUTH_ISSUER]")
	fs.StringVar(&a.audience, "auth-audience", e.str("ZERO_AUTH_AUDIENCE", ""), "required aud claim [ZERO_AUTH_AUDIENCE]")
	fs.DurationVar(&a.groupIdle, "group-idle", e.duration("JETSYNC_GROUP_IDLE", viewsyncer.DefaultGroupIdle), "how long a client group without connections stays in memory before its pipelines and lease are let go [JETSYNC_GROUP_IDLE]")
	fs.DurationVar(&a.leaseTTL, "cvr-lease-ttl", e.duration("JETSYNC_CVR_LEASE_TTL", cvrstore.DefaultLeaseTTL), "how long a view-syncer's ownership of a client group lasts unrenewed; a peer takes a dead one's groups after it [JETSYNC_CVR_LEASE_TTL]")
	fs.StringVar(&a.advertise, "advertise-address", e.str("JETSYNC_ADVERTISE_ADDRESS", ""), "where peers reach this view-syncer's sync endpoint (ws://host:port); default ws://<hostname>:<port> [JETSYNC_ADVERTISE_ADDRESS]")
	fs.StringVar(&a.cvrFile, "cvr-file", e.str("JETSYNC_CVR_FILE", ""), "SQLite file caching the CVR projection; default <data-dir>/cvr.db [JETSYNC_CVR_FILE]")
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

// newSyncServer builds the Zero sync endpoint over cons's replica, with the
// CVRs in the JetStream CVR stream, and mounts it on h. The store it opens
// is closed by the returned func, after the server's Run returned.
func newSyncServer(ctx context.Context, h *httpServer, rl role, js jetstream.JetStream, file string, cons *replica.Consumer, a syncFlags) (*viewsyncer.Server, func(), error) {
	addr := a.advertise
	if addr == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "localhost"
		}
		addr = "ws://" + net.JoinHostPort(host, strconv.Itoa(h.Port()))
	}
	cvrFile := a.cvrFile
	if cvrFile == "" {
		cvrFile = filepath.Join(rl.dataDir, "cvr.db")
	}
	log := rl.log.With("component", "view-syncer")
	store, err := cvrstore.Open(ctx, cvrstore.Config{
		JS: js, Shard: rl.shard, File: cvrFile, OwnerID: rl.id, Address: addr, LeaseTTL: a.leaseTTL, Logger: log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("cvr store: %w", err)
	}
	srv, err := viewsyncer.New(viewsyncer.Config{
		ReplicaFile:  file,
		Replica:      cons,
		Shard:        rl.shard,
		AuthSecret:   a.secret,
		AuthJWK:      a.jwk,
		AuthJWKSURL:  a.jwksURL,
		AuthIssuer:   a.issuer,
		AuthAudience: a.audience,
		CVR:          store,
		GroupIdle:    a.groupIdle,
		Logger:       log,
		Registerer:   rl.metrics.For("view-syncer"),
	})
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	for _, p := range viewsyncer.Patterns {
		h.Handle(p, srv.Handler())
	}
	rl.log.Info("cvr store open", "file", cvrFile, "stream", rl.shard.CVRStream(), "owner", rl.id, "address", addr)
	return srv, func() { srv.Close(); store.Close() }, nil
}
