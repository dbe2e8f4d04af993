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
	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/consumers/viewsyncer"
	"github.com/jetsync/jetsync/internal/logkey"
)

// syncFlags are the Zero sync endpoint's settings: its token settings,
// under zero-cache's names, and where client groups' CVRs live.
type syncFlags struct {
	secret   string
	jwk      string
	jwksURL  string
	issuer   string
	audience string
	// jwksStale and jwksHTTP are the JWKS cache's grace period while
	// refetches fail and its permission to fetch over plain HTTP.
	jwksStale time.Duration
	jwksHTTP  bool
	// peerSecret signs ownership records; without it nothing is relayed.
	peerSecret string

	groupIdle time.Duration
	leaseTTL  time.Duration
	advertise string
	cvrFile   string
	// maxPayload is zero-cache's ZERO_WEBSOCKET_MAX_PAYLOAD_BYTES.
	maxPayload int
	gc         cvrstore.GCConfig
	// The bounds of admission.go; memoryLimit is JETSYNC_MEMORY_LIMIT.
	maxConns, maxQueries int
	sendBudget           int
	memoryLimit          int64
	pruneAge             time.Duration

	// api is the app's API server (ZERO_QUERY_*, ZERO_MUTATE_* and their
	// deprecated aliases); revalidate and retransform pace auth maintenance.
	api                     appapi.Config
	revalidate, retransform time.Duration

	crud crudFlags
}

func (a *syncFlags) register(fs *flag.FlagSet, e *env) {
	a.secret = e.str("ZERO_AUTH_SECRET", "")
	bindVar(fs, hidden{&a.secret}, "ZERO_AUTH_SECRET", "")
	// A JWK is usually public, but an "oct" one is a secret.
	a.jwk = e.str("ZERO_AUTH_JWK", "")
	bindVar(fs, hidden{&a.jwk}, "ZERO_AUTH_JWK", "")
	e.strVar(fs, &a.jwksURL, "ZERO_AUTH_JWKS_URL", "")
	e.strVar(fs, &a.issuer, "ZERO_AUTH_ISSUER", "")
	e.strVar(fs, &a.audience, "ZERO_AUTH_AUDIENCE", "")
	e.durationVar(fs, &a.jwksStale, "JETSYNC_AUTH_JWKS_STALE", time.Hour)
	e.boolVar(fs, &a.jwksHTTP, "JETSYNC_AUTH_JWKS_ALLOW_HTTP", false)
	a.peerSecret = e.str("JETSYNC_PEER_SECRET", "")
	bindVar(fs, hidden{&a.peerSecret}, "JETSYNC_PEER_SECRET", "")
	e.durationVar(fs, &a.groupIdle, "JETSYNC_GROUP_IDLE", viewsyncer.DefaultGroupIdle)
	e.durationVar(fs, &a.leaseTTL, "JETSYNC_CVR_LEASE_TTL", cvrstore.DefaultLeaseTTL)
	e.strVar(fs, &a.advertise, "JETSYNC_ADVERTISE_ADDRESS", "")
	e.strVar(fs, &a.cvrFile, "JETSYNC_CVR_FILE", "")
	a.gc.Inactivity = e.units("ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS", cvrstore.DefaultGCInactivity, time.Hour)
	bindVar(fs, units{&a.gc.Inactivity, time.Hour}, "ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS", "")
	a.gc.Interval = e.units("ZERO_CVR_GARBAGE_COLLECTION_INITIAL_INTERVAL_SECONDS", cvrstore.DefaultGCInterval, time.Second)
	bindVar(fs, units{&a.gc.Interval, time.Second}, "ZERO_CVR_GARBAGE_COLLECTION_INITIAL_INTERVAL_SECONDS", "")
	e.intVar(fs, &a.maxPayload, "ZERO_WEBSOCKET_MAX_PAYLOAD_BYTES", viewsyncer.DefaultMaxPayloadBytes)
	e.durationVar(fs, &a.pruneAge, "JETSYNC_CVR_PRUNE_AGE", viewsyncer.DefaultCVRPruneAge)
	e.intVar(fs, &a.maxConns, "JETSYNC_MAX_CONNECTIONS", viewsyncer.DefaultMaxConnections)
	e.intVar(fs, &a.sendBudget, "JETSYNC_SEND_BUDGET_BYTES", viewsyncer.DefaultSendBudgetBytes)
	e.intVar(fs, &a.maxQueries, "JETSYNC_MAX_QUERIES_PER_CLIENT", viewsyncer.DefaultMaxQueriesPerClient)
	if v, ok := e.lookup(envMemoryLimit); ok && v != "" {
		// A malformed value stops the process in setupRuntime already.
		a.memoryLimit, _ = parseBytes(v)
	}
	a.registerAPI(fs, e)
	a.crud.register(fs, e)
	e.intVar(fs, &a.gc.BatchSize, "ZERO_CVR_GARBAGE_COLLECTION_INITIAL_BATCH_SIZE", cvrstore.DefaultGCBatchSize)
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
		env string
		e   *appapi.Endpoint
	}{{"ZERO_QUERY", &a.api.Query}, {"ZERO_MUTATE", &a.api.Mutate}} {
		bindVar(fs, list{&ep.e.URLs}, ep.env+"_URL", "")
		bindVar(fs, hidden{&ep.e.APIKey}, ep.env+"_API_KEY", "")
		fc := settingFor(ep.env + "_FORWARD_COOKIES")
		fs.BoolVar(&ep.e.ForwardCookies, fc.flag, ep.e.ForwardCookies, fc.usageText(""))
		bindVar(fs, list{&ep.e.AllowedClientHeaders}, ep.env+"_ALLOWED_CLIENT_HEADERS", "")
		bindVar(fs, list{&ep.e.AllowedRequestHeaders}, ep.env+"_ALLOWED_REQUEST_HEADERS", "")
	}
	a.revalidate = e.units(auth.EnvRevalidateInterval, auth.DefaultRevalidateInterval, time.Second)
	bindVar(fs, units{&a.revalidate, time.Second}, auth.EnvRevalidateInterval, "")
	a.retransform = e.units(auth.EnvRetransformInterval, auth.DefaultRetransformInterval, time.Second)
	bindVar(fs, units{&a.retransform, time.Second}, auth.EnvRetransformInterval, "")
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
func newSyncServer(ctx context.Context, h *httpServer, rl role, js jetstream.JetStream, file string, cons *replicator.Consumer, a syncFlags) (*viewsyncer.Server, func(), error) {
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
	log := rl.log.With(logkey.Component, "view-syncer")
	switch {
	case a.peerSecret == "":
		log.Info("JETSYNC_PEER_SECRET is unset: a connection for a client group a peer owns is sent away, not relayed; route each client group to one view-syncer")
	case strings.HasPrefix(addr, "ws://"):
		// Relayed connections carry the clients' tokens and cookies.
		log.Warn("relayed connections, with their tokens, travel unencrypted between view-syncers: JETSYNC_ADVERTISE_ADDRESS is ws://, not wss://", "address", addr)
	}
	store, err := cvrstore.Open(ctx, cvrstore.Config{
		JS: js, Shard: rl.shard, File: cvrFile, OwnerID: rl.id, Address: addr, LeaseTTL: a.leaseTTL, Logger: log,
		PeerSecret: []byte(a.peerSecret),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("cvr store: %w", err)
	}
	mg, closeMutagen, err := a.crud.mutagen(ctx, rl)
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	srv, err := viewsyncer.New(viewsyncer.Config{
		ReplicaFile:         file,
		Replica:             cons,
		Shard:               rl.shard,
		AuthSecret:          a.secret,
		AuthJWK:             a.jwk,
		AuthJWKSURL:         a.jwksURL,
		AuthJWKSStale:       a.jwksStale,
		AuthJWKSAllowHTTP:   a.jwksHTTP,
		AuthIssuer:          a.issuer,
		AuthAudience:        a.audience,
		CVR:                 store,
		GroupIdle:           a.groupIdle,
		GC:                  a.gc,
		API:                 a.api,
		RevalidateInterval:  a.revalidate,
		RetransformInterval: a.retransform,
		Mutagen:             mg,
		MaxPayloadBytes:     int64(a.maxPayload),
		MaxConnections:      a.maxConns,
		SendBudgetBytes:     int64(a.sendBudget),
		MaxQueriesPerClient: a.maxQueries,
		MemoryLimit:         a.memoryLimit,
		CVRPruneAge:         a.pruneAge,
		AdminPassword:       h.admin.password,
		DevelopmentMode:     h.admin.dev,
		ServerVersion:       readVersion().inspectorVersion(),
		Logger:              log,
		Registerer:          rl.metrics.For("view-syncer"),
	})
	if err != nil {
		closeMutagen()
		store.Close()
		return nil, nil, err
	}
	for _, p := range viewsyncer.Patterns {
		h.Handle(p, srv.Handler())
	}
	rl.log.Info("cvr store open", "file", cvrFile, logkey.Stream, rl.shard.CVRStream(), logkey.Owner, rl.id, "address", addr)
	return srv, func() { srv.Close(); closeMutagen(); store.Close() }, nil
}
