package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/auth"
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
	gc        cvrstore.GCConfig

	// api is the app's API server (ZERO_QUERY_*, ZERO_MUTATE_* and their
	// deprecated aliases); revalidate and retransform pace auth maintenance.
	api                     appapi.Config
	revalidate, retransform time.Duration
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
	a.gc.Inactivity = e.units("ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS", cvrstore.DefaultGCInactivity, time.Hour)
	fs.Var(units{&a.gc.Inactivity, time.Hour}, "cvr-garbage-collection-inactivity-threshold-hours", "hours (fractions allowed) after which an inactive client group's CVR may be purged; its clients then start over [ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS]")
	a.gc.Interval = e.units("ZERO_CVR_GARBAGE_COLLECTION_INITIAL_INTERVAL_SECONDS", cvrstore.DefaultGCInterval, time.Second)
	fs.Var(units{&a.gc.Interval, time.Second}, "cvr-garbage-collection-initial-interval-seconds", "seconds between CVR garbage-collection passes while there is work; doubles up to 16 minutes while there is none [ZERO_CVR_GARBAGE_COLLECTION_INITIAL_INTERVAL_SECONDS]")
	a.registerAPI(fs, e)
	fs.IntVar(&a.gc.BatchSize, "cvr-garbage-collection-initial-batch-size", e.int("ZERO_CVR_GARBAGE_COLLECTION_INITIAL_BATCH_SIZE", cvrstore.DefaultGCBatchSize), "CVRs purged per pass at first, growing while inactive ones accumulate; 0 disables garbage collection [ZERO_CVR_GARBAGE_COLLECTION_INITIAL_BATCH_SIZE]")
}

// registerAPI registers the API-server settings. Their environment goes
// through appapi.LoadEnv, which resolves zero-cache's deprecated aliases
// (ZERO_GET_QUERIES_*, ZERO_PUSH_*); a flag beats any of them.
func (a *syncFlags) registerAPI(fs *flag.FlagSet, e *env) {
	cfg, err := appapi.LoadEnv(func(k string) string { v, _ := e.lookup(k); return v })
	if err != nil {
		e.errs = append(e.errs, err)
	}
	a.api = cfg
	for _, ep := range []struct {
		flag, env string
		e         *appapi.Endpoint
		alias     string
	}{{"query", "ZERO_QUERY", &a.api.Query, "ZERO_GET_QUERIES_URL"}, {"mutate", "ZERO_MUTATE", &a.api.Mutate, "ZERO_PUSH_URL"}} {
		fs.Var(list{&ep.e.URLs}, ep.flag+"-url", "comma-separated URL patterns of the app's "+ep.flag+" endpoint; the first is the default, a client's own URL must match one (alias "+ep.alias+") ["+ep.env+"_URL]")
		fs.Var(hidden{&ep.e.APIKey}, ep.flag+"-api-key", "sent to the "+ep.flag+" endpoint as X-Api-Key ["+ep.env+"_API_KEY]")
		fs.BoolVar(&ep.e.ForwardCookies, ep.flag+"-forward-cookies", ep.e.ForwardCookies, "forward the websocket upgrade request's Cookie header to the "+ep.flag+" endpoint ["+ep.env+"_FORWARD_COOKIES]")
		fs.Var(list{&ep.e.AllowedClientHeaders}, ep.flag+"-allowed-client-headers", "comma-separated header names the client's own "+ep.flag+" headers may set ["+ep.env+"_ALLOWED_CLIENT_HEADERS]")
		fs.Var(list{&ep.e.AllowedRequestHeaders}, ep.flag+"-allowed-request-headers", "comma-separated header names copied from the upgrade request to the "+ep.flag+" endpoint ["+ep.env+"_ALLOWED_REQUEST_HEADERS]")
	}
	a.revalidate = e.units(auth.EnvRevalidateInterval, auth.DefaultRevalidateInterval, time.Second)
	fs.Var(units{&a.revalidate, time.Second}, "auth-revalidate-interval-seconds", "seconds after which a validated connection's credentials are checked again with the query endpoint; 0 disables ["+auth.EnvRevalidateInterval+"]")
	a.retransform = e.units(auth.EnvRetransformInterval, auth.DefaultRetransformInterval, time.Second)
	fs.Var(units{&a.retransform, time.Second}, "auth-retransform-interval-seconds", "seconds between re-transforms of a client group's synced queries with its background connection's credentials; 0 disables ["+auth.EnvRetransformInterval+"]")
}

// list is a comma-separated list flag.
type list struct{ v *[]string }

func (l list) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, ",")
}

func (l list) Set(v string) error {
	*l.v = appapi.SplitList(v)
	return nil
}

// units is a duration flag given as a number, fractions allowed, of unit:
// zero-cache's hour and second settings.
type units struct {
	d    *time.Duration
	unit time.Duration
}

func (u units) String() string {
	if u.d == nil {
		return ""
	}
	return strconv.FormatFloat(float64(*u.d)/float64(u.unit), 'g', -1, 64)
}

func (u units) Set(v string) error {
	d, err := parseUnits(v, u.unit)
	if err != nil {
		return err
	}
	*u.d = d
	return nil
}

func parseUnits(v string, unit time.Duration) (time.Duration, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || f*float64(unit) > math.MaxInt64 {
		return 0, fmt.Errorf("%q is not a non-negative number", v)
	}
	return time.Duration(f * float64(unit)), nil
}

// units reads a setting given as a number of unit (parseUnits).
func (e *env) units(name string, def, unit time.Duration) time.Duration {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return def
	}
	d, err := parseUnits(v, unit)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not a non-negative number", name, v))
		return def
	}
	return d
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
		ReplicaFile:         file,
		Replica:             cons,
		Shard:               rl.shard,
		AuthSecret:          a.secret,
		AuthJWK:             a.jwk,
		AuthJWKSURL:         a.jwksURL,
		AuthIssuer:          a.issuer,
		AuthAudience:        a.audience,
		CVR:                 store,
		GroupIdle:           a.groupIdle,
		GC:                  a.gc,
		API:                 a.api,
		RevalidateInterval:  a.revalidate,
		RetransformInterval: a.retransform,
		Logger:              log,
		Registerer:          rl.metrics.For("view-syncer"),
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
