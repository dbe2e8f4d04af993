// Package viewsyncer is jetsync's view-syncer: it speaks the Zero sync
// protocol, version 51 (docs/protocol.md), to
// @rocicorp/zero clients over websockets, answering their AST queries from
// the SQLite replica that a replica.Consumer keeps, and poking them as the
// replica advances.
//
// Each client group has a CVR (cvr.go) and a set of pipelines (group.go);
// all of a group's work is serialised by its lock. Run follows the
// replica's subscription and advances every group; connections (conn.go)
// drive the groups' config changes.
package viewsyncer

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite" // the replica's driver

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/connctx"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/replica"
	"github.com/jetsync/jetsync/consumers/zql"
	projreplica "github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// Defaults.
const (
	// DefaultMaxPayloadBytes is zero-cache's ZERO_WEBSOCKET_MAX_PAYLOAD_BYTES.
	DefaultMaxPayloadBytes = 10 << 20
	// DefaultMaxQueueBytes bounds what waits to be written to one socket; a
	// client that falls further behind is closed and catches up on
	// reconnect. It fits a whole hydration of the bench's issue table.
	DefaultMaxQueueBytes = 64 << 20
	// DefaultReadConns is the size of the replica read pool.
	DefaultReadConns = 8
	// DefaultGroupIdle is how long a client group without connections
	// stays in memory: zero-cache's idle view-syncer keepalive. A group
	// that comes back later loads its CVR from the local projection.
	DefaultGroupIdle = 5 * time.Second
)

// evictInterval is how often Run looks for queries whose TTL ran out.
const evictInterval = 50 * time.Millisecond

// Config configures a Server.
type Config struct {
	// ReplicaFile is the SQLite replica Replica keeps.
	ReplicaFile string
	// Replica tells the server when the replica advances.
	Replica *replica.Consumer
	// Shard names the app's internal tables (<app>_<num>.clients).
	Shard streams.Shard
	// AuthSecret is ZERO_AUTH_SECRET: when set, tokens are verified as
	// HS256/384/512 JWTs with it.
	AuthSecret string
	// AuthJWK is ZERO_AUTH_JWK: when set, tokens are verified with this
	// public JSON Web Key (RS*, PS*, ES*, EdDSA, or HS* for an "oct" key).
	AuthJWK string
	// AuthJWKSURL is ZERO_AUTH_JWKS_URL: when set, tokens are verified with
	// the JSON Web Key Set it serves (jwk.go: cached, refetched for an
	// unknown kid). At most one of AuthSecret, AuthJWK and AuthJWKSURL.
	AuthJWKSURL string
	// AuthIssuer and AuthAudience are ZERO_AUTH_ISSUER and
	// ZERO_AUTH_AUDIENCE, checked when set.
	AuthIssuer, AuthAudience string
	// MaxPayloadBytes defaults to DefaultMaxPayloadBytes.
	MaxPayloadBytes int64
	// MaxQueueBytes defaults to DefaultMaxQueueBytes.
	MaxQueueBytes int
	// CVR, if set, keeps the client groups' CVRs durable on JetStream and
	// gives each group one owner among the view-syncers sharing it; Run
	// renews the leases. Nil keeps CVRs in this process's memory.
	CVR *cvrstore.Store
	// GroupIdle is how long a group without connections keeps its
	// pipelines and lease; DefaultGroupIdle when 0.
	GroupIdle time.Duration
	// GC, when CVR is set and GC.BatchSize is not 0, has Run purge the
	// groups inactive longer than GC.Inactivity (cvrstore.Purger); peers
	// sharing the CVR stream take turns.
	GC cvrstore.GCConfig
	// API configures the app's API server: the query endpoint that
	// transforms synced queries and the mutate endpoint that runs custom
	// mutators (ZERO_QUERY_URL, ZERO_MUTATE_URL and their settings). Its
	// AppID and ShardNum come from Shard.
	API appapi.Config
	// RevalidateInterval and RetransformInterval are
	// ZERO_AUTH_REVALIDATE_INTERVAL_SECONDS and
	// ZERO_AUTH_RETRANSFORM_INTERVAL_SECONDS: how often a validated
	// connection's credentials are checked again, and how often a group's
	// synced queries are transformed again with its background
	// connection's. 0 disables either.
	RevalidateInterval, RetransformInterval time.Duration
	// Clock drives auth maintenance; nil means the system clock.
	Clock connctx.Clock
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer, if set, gets the server's metrics.
	Registerer prometheus.Registerer
}

// apiConfig is API with the shard's app ID and number.
func (c Config) apiConfig() appapi.Config {
	a := c.API
	a.AppID, a.ShardNum = c.Shard.App, c.Shard.Num
	if a.Logger == nil {
		a.Logger = c.Logger
	}
	return a
}

func (c Config) withDefaults() Config {
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.MaxQueueBytes == 0 {
		c.MaxQueueBytes = DefaultMaxQueueBytes
	}
	if c.GroupIdle == 0 {
		c.GroupIdle = DefaultGroupIdle
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	if c.ReplicaFile == "" {
		return errors.New("replica file is required")
	}
	if c.Replica == nil {
		return errors.New("replica consumer is required")
	}
	if err := c.Shard.Validate(); err != nil {
		return err
	}
	if c.MaxPayloadBytes < 1 || c.MaxQueueBytes < 1 {
		return errors.New("max payload and queue bytes must be positive")
	}
	if c.GroupIdle < 0 {
		return errors.New("group idle time must not be negative")
	}
	if c.CVR != nil && c.GC.BatchSize != 0 {
		if err := c.GC.Validate(); err != nil {
			return err
		}
	}
	if err := (connctx.Config{RevalidateInterval: c.RevalidateInterval, RetransformInterval: c.RetransformInterval}).Validate(); err != nil {
		return err
	}
	if err := c.apiConfig().Validate(); err != nil {
		return err
	}
	return c.validateAuth()
}

// Server is the view-syncer.
type Server struct {
	cfg     Config
	log     *slog.Logger
	db      *sql.DB
	store   cvrStore
	purger  *cvrstore.Purger // nil: no garbage collection
	auth    *tokenVerifier   // nil: no key configured
	api     *appapi.Client   // nil: no query or mutate URL configured
	metrics *metrics
	// bg tracks the groups' pushers, which closeAll waits for.
	bg             sync.WaitGroup
	clientsTable   string
	mutationsTable string
	permsTable     string

	// draining is set once Run ends: new connections are sent away.
	draining atomic.Bool

	// loadMu serializes the schema and permissions loads of openSnapshot:
	// two racing ones would each build their own copy of an unchanged
	// schema, and pipelines prepared with the copy that was not kept would
	// take the next snapshot for a schema change and re-hydrate.
	loadMu sync.Mutex

	mu     sync.Mutex
	groups map[string]*group
	schema *schema      // last loaded
	perms  *permissions // last loaded
}

// New returns a Server; Run follows the replica, Handler serves clients.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	auth, err := newTokenVerifier(cfg)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	var api *appapi.Client
	if ac := cfg.apiConfig(); ac.Query.Configured() || ac.Mutate.Configured() {
		if api, err = appapi.New(ac); err != nil {
			return nil, err
		}
	}
	db, err := sql.Open("sqlite", "file:"+cfg.ReplicaFile+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		return nil, fmt.Errorf("open replica: %w", err)
	}
	db.SetMaxOpenConns(DefaultReadConns)
	log := cfg.Logger.With("component", "view-syncer")
	var store cvrStore = newMemStore()
	var purger *cvrstore.Purger
	if cfg.CVR != nil {
		store = &durableStore{s: cfg.CVR, log: log}
		if cfg.GC.BatchSize != 0 {
			if purger, err = cfg.CVR.NewPurger(cfg.GC); err != nil {
				return nil, err
			}
		}
	}
	return &Server{
		cfg:            cfg,
		log:            log,
		db:             db,
		store:          store,
		purger:         purger,
		auth:           auth,
		api:            api,
		metrics:        m,
		clientsTable:   projreplica.TableName(cfg.Shard.ID(), "clients"),
		mutationsTable: projreplica.TableName(cfg.Shard.ID(), "mutations"),
		permsTable:     projreplica.TableName(cfg.Shard.App, "permissions"),
		groups:         map[string]*group{},
	}, nil
}

// Close releases the replica connections.
func (s *Server) Close() error { return s.db.Close() }

// Patterns are the http.ServeMux patterns to mount Handler on: zero-cache's
// [/<base>]/sync/v<N>/<action> (docs/protocol.md §2.1).
var Patterns = []string{"/sync/{version}/{action}", "/{base}/sync/{version}/{action}"}

// Handler serves the sync endpoint; mount it on Patterns. Any protocol
// version other than 30..51 gets VersionNotSupported, and paths that are not
// [/<base>]/sync/v<N>/<action> get 404.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// Run follows the replica and advances every client group, evicts
// queries whose TTL ran out, unloads idle groups and renews the durable
// store's leases, until ctx ends. It then closes every connection, which
// reconnect elsewhere or later, and gives the groups' leases up.
func (s *Server) Run(ctx context.Context) error {
	defer s.closeAll()
	sub := s.cfg.Replica.Subscribe()
	defer sub.Close()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { s.evictLoop(ctx) })
	if s.cfg.CVR != nil {
		wg.Go(func() {
			if err := s.cfg.CVR.Run(ctx); err != nil {
				s.log.Error("cvr leases", "err", err)
			}
		})
	}
	if s.purger != nil {
		wg.Go(func() {
			if err := s.purger.Run(ctx); err != nil {
				s.log.Error("cvr garbage collection", "err", err)
			}
		})
	}
	for {
		u, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("replica subscription: %w", err)
		}
		if err := s.advance(ctx, sub, u); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Error("advance", "err", err)
		}
	}
}

// advance opens a snapshot at u.To (taking in later updates until the
// snapshot and the updates agree) and advances each group to it.
func (s *Server) advance(ctx context.Context, sub *replica.Subscription, u replica.Update) error {
	changed := &changeSet{tables: map[string]bool{}}
	changed.add(u.Changes)
	reset := u.Reset
	for {
		snap, err := s.openSnapshot(ctx)
		if err != nil {
			return err
		}
		if snap == nil {
			return nil
		}
		if snap.version == u.To || reset {
			snap.from = u.From
			if reset {
				changed = nil
			}
			s.metrics.advances.Inc()
			s.advanceGroups(ctx, snap, changed)
			return nil
		}
		snap.close()
		// The snapshot saw commits the subscription has not told yet: they
		// are published right after commit, so Next returns soon.
		next, err := sub.Next(ctx)
		if err != nil {
			return err
		}
		if !reset && !next.Reset {
			changed.add(next.Changes)
		}
		reset = reset || next.Reset
		u.To = next.To
	}
}

// advanceGroups advances every group to snap, in parallel: each worker
// reads its own snapshot at snap's watermark, and takes the next group
// when done with one, so a slow group holds up one worker only. It closes
// snap.
func (s *Server) advanceGroups(ctx context.Context, snap *snapshot, changed *changeSet) {
	groups := s.groupList()
	snaps := []*snapshot{snap}
	workers := min(len(groups), runtime.GOMAXPROCS(0), maxAdvanceWorkers)
	for len(snaps) < workers {
		sn, err := s.openSnapshotLike(ctx, snap)
		if err != nil {
			s.log.Warn("open a snapshot for a parallel advance", "err", err)
		}
		if sn == nil {
			break // the replica moved on: fewer workers this time
		}
		snaps = append(snaps, sn)
	}
	next := make(chan *group)
	var wg sync.WaitGroup
	for _, sn := range snaps {
		wg.Go(func() {
			defer sn.close()
			for g := range next {
				if err := g.advance(ctx, sn, changed); err != nil && ctx.Err() == nil {
					g.log.Error("advance group", "err", err)
				}
			}
		})
	}
	for _, g := range groups {
		select {
		case next <- g:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
}

// maxAdvanceWorkers bounds the groups advanced at once, leaving read
// connections for the clients' own hydrations.
const maxAdvanceWorkers = DefaultReadConns / 2

// evictLoop evicts expired queries, stops serving groups whose lease was
// lost and unloads idle groups, until ctx ends.
func (s *Server) evictLoop(ctx context.Context) {
	t := time.NewTicker(evictInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, g := range s.groupList() {
				select {
				case <-g.leaseDone:
					s.leaseLost(g)
					continue
				default:
				}
				if g.maintenanceDue() {
					g.maintain(ctx)
				}
				if g.unloadIfIdle(ctx, now) {
					s.removeGroup(g)
					s.store.unload(ctx, g.cvr)
					continue
				}
				if err := g.evict(ctx, now); err != nil && ctx.Err() == nil {
					g.log.Error("evict", "err", err)
				}
			}
		}
	}
}

// groupList lists the loaded groups.
func (s *Server) groupList() []*group {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*group, 0, len(s.groups))
	for _, g := range s.groups {
		if g.cvr != nil {
			out = append(out, g)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// Drain pacing (zero-cache's drain-coordinator.ts): after a group's
// clients are sent away, the next group waits the group's hydration time
// divided by drainUtilization, so that the servers they reconnect to are
// not swamped. jetsync bounds each wait and the whole drain, which must
// end before the orchestrator's kill.
const (
	drainUtilization = 0.6
	drainPadding     = 2 * time.Millisecond
	maxDrainPause    = time.Second
	maxDrain         = 10 * time.Second
)

// closeAll drains the server: group by group, paced, it stops the group,
// persists its TTL clock, gives its lease up, so that a peer can serve it
// at once, and closes its connections with a plain close, on which the
// clients reconnect (zero-cache's drain). Connections that arrive
// meanwhile are sent away with Rehome.
func (s *Server) closeAll() {
	s.draining.Store(true)
	defer s.bg.Wait()
	groups := s.groupList()
	if len(groups) == 0 {
		return
	}
	start := time.Now()
	s.log.Info("draining client groups", "groups", len(groups))
	for i, g := range groups {
		pause := s.drainGroup(g)
		if i == len(groups)-1 {
			break
		}
		pause = min(time.Duration(float64(pause)/drainUtilization)+drainPadding, maxDrainPause, maxDrain-time.Since(start))
		if pause > 0 {
			time.Sleep(pause)
		}
	}
	s.log.Info("drained client groups", "groups", len(groups), "elapsed", time.Since(start).Round(time.Millisecond))
}

// drainGroup unloads g and closes its connections; it returns the time g
// spent hydrating, which its clients' reconnection costs elsewhere.
func (s *Server) drainGroup(g *group) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock := g.lock()
	defer unlock()
	for _, c := range g.conns {
		c.ready = false
	}
	if !g.unloaded {
		g.persistClock(ctx)
		g.unloaded = true
		g.stopLocked()
		s.removeGroup(g)
		s.store.unload(ctx, g.cvr)
	}
	for _, c := range g.conns {
		c.closeQuietly()
	}
	return g.syncTime
}

func (s *Server) removeGroup(g *group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groups[g.id] == g {
		delete(s.groups, g.id)
	}
}

// group returns the client group id, loading it, or creating it, once:
// concurrent connections of a group wait for the first one's load.
func (s *Server) group(ctx context.Context, id string) (*group, error) {
	s.mu.Lock()
	g := s.groups[id]
	if g == nil {
		g = &group{
			s: s, id: id, log: s.log.With("client_group", id),
			pipelines: map[string]*pipeline{}, conns: map[string]*conn{},
			loaded: make(chan struct{}), maint: make(chan struct{}, 1),
		}
		g.cc = s.newAuthManager(g)
		s.groups[id] = g
		s.mu.Unlock()
		c, err := s.store.load(ctx, id)
		if c == nil && err == nil {
			c = newCVR(id)
		}
		s.mu.Lock()
		if err != nil {
			g.loadErr = err
			delete(s.groups, id)
		} else {
			g.cvr, g.cold, g.idleSince = c, c.version != "", time.Now()
			if c.dg != nil {
				g.leaseDone = c.dg.lease.Done()
			}
		}
		close(g.loaded)
	}
	s.mu.Unlock()
	select {
	case <-g.loaded:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if g.loadErr != nil {
		return nil, fmt.Errorf("load cvr %s: %w", id, g.loadErr)
	}
	return g, nil
}

// leaseLost stops serving a group whose ownership moved: its clients are
// sent to reconnect at once, as zero-cache's OwnershipError does.
func (s *Server) leaseLost(g *group) {
	g.mu.Lock()
	if !g.unloaded {
		g.unloaded = true
		g.stopLocked()
		g.log.Info("cvr lease lost; closing the group's connections", "err", g.cvr.dg.lease.Err())
		perr := ownershipError(s.ownerOf(g.id), time.Now())
		for _, c := range g.conns {
			c.ready = false
			c.fail(perr)
		}
	}
	g.mu.Unlock()
	s.removeGroup(g)
}

// snapshot is one consistent read of the replica.
type snapshot struct {
	tx             *sql.Tx
	version        string
	replicaVersion string
	schema         *schema
	// perms are the read rules at this snapshot.
	perms *permissions
	// from is where the changes an advance reports start; pipelines at an
	// older version must re-hydrate fully.
	from string
}

func (sn *snapshot) close() { _ = sn.tx.Rollback() }

// openSnapshotLike opens another read transaction at like's watermark,
// sharing its schema and rules; nil means the replica is past it already.
func (s *Server) openSnapshotLike(ctx context.Context, like *snapshot) (*snapshot, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("begin replica read: %w", err)
	}
	st, err := projreplica.LoadState(ctx, tx)
	if err != nil || st.Watermark != like.version {
		_ = tx.Rollback()
		return nil, err
	}
	sn := *like
	sn.tx = tx
	return &sn, nil
}

// openSnapshot opens a read transaction on the replica; nil means there is
// no replica yet.
func (s *Server) openSnapshot(ctx context.Context) (*snapshot, error) {
	if s.cfg.Replica.State().Watermark == "" {
		return nil, nil
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("begin replica read: %w", err)
	}
	st, err := projreplica.LoadState(ctx, tx)
	if err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	if st.Watermark == "" {
		_ = tx.Rollback()
		return nil, nil
	}
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	s.mu.Lock()
	prev, prevPerms := s.schema, s.perms
	s.mu.Unlock()
	sch, err := loadSchema(ctx, tx, prev)
	if err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	perms, err := loadPermissions(ctx, tx, s.permsTable, sch, prevPerms)
	if err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	if perms == noPermissions && prevPerms != noPermissions {
		s.log.Warn("No upstream permissions deployed. Run 'npx zero-deploy-permissions --app-id=" + s.cfg.Shard.App + "' to enforce permissions.")
	}
	s.mu.Lock()
	s.schema, s.perms = sch, perms
	s.mu.Unlock()
	return &snapshot{tx: tx, version: st.Watermark, replicaVersion: st.ReplicaVersion, schema: sch, perms: perms, from: st.Watermark}, nil
}

// lmidsAST is the internal query for a group's rows of the clients table,
// or nil when the replica has no such table.
func (s *Server) lmidsAST(groupID string, sch *schema) *zql.AST {
	return internalAST(s.clientsTable, groupID, sch, "clientGroupID", "clientID", "lastMutationID")
}

// mutationsAST is the internal query for a group's rows of the mutations
// table (the results of custom mutations), or nil when the replica has no
// such table.
func (s *Server) mutationsAST(groupID string, sch *schema) *zql.AST {
	return internalAST(s.mutationsTable, groupID, sch, "clientGroupID", "clientID", "mutationID", "result")
}

// internalAST selects a group's rows of one of the shard's tables, which
// must have the columns cols.
func internalAST(table, groupID string, sch *schema, cols ...string) *zql.AST {
	ts, ok := sch.tables[table]
	if !ok {
		return nil
	}
	need := map[string]bool{}
	for _, c := range cols {
		need[c] = true
	}
	for _, c := range ts.columns {
		delete(need, c.Name)
	}
	if len(need) > 0 {
		return nil
	}
	b, _ := json.Marshal(map[string]any{
		"table": table,
		"where": map[string]any{
			"type":  "simple",
			"op":    "=",
			"left":  map[string]any{"type": "column", "name": "clientGroupID"},
			"right": map[string]any{"type": "literal", "value": groupID},
		},
	})
	ast, err := zql.ParseAST(b)
	if err != nil {
		return nil
	}
	return ast
}

// advance moves the group to snap, updating the queries that read a
// changed table (re-hydrating all of them when changed is nil). Groups without
// connections wait: they re-hydrate when a client returns.
func (g *group) advance(ctx context.Context, snap *snapshot, changed *changeSet) error {
	unlock := g.lock()
	defer unlock()
	if !g.hasReady() || g.unloaded || snap.version <= stateOf(g.cvr.version) {
		return nil
	}
	g.transformPending(ctx)
	err := g.sync(ctx, snap, changed)
	if err == nil {
		// The pipelines are synced: background retransforms may run.
		g.cc.SetRetransformReady(true)
	}
	g.dropIfBroken()
	return err
}

// transformPending transforms the synced queries that are still waiting
// for their AST. A config change transforms only when there is a snapshot
// to sync at, so the queries of clients that connected before the replica
// existed wait for the first advance. They go through a ready connection,
// as a config change of its client would; a failure is that client's, and
// it is sent away with it (its reconnect transforms again), while the
// group's other queries advance.
func (g *group) transformPending(ctx context.Context) {
	if !g.s.api.QueryConfigured() {
		return
	}
	for _, c := range g.sortedConns() {
		if !g.hasPendingTransform() {
			return
		}
		if !c.ready {
			continue
		}
		v, err := g.viaConn(c, false)
		if err != nil {
			continue
		}
		val, err := g.transform(ctx, v, g.ttlClock(time.Now()))
		if err == nil {
			err = g.validateVia(v, val)
		} else if appapi.IsAuth(err) {
			g.cc.Fail(v.ac.Selector, v.ac.Revision)
		}
		if err != nil {
			g.log.Warn("transform queued synced queries", "client", c.clientID, "err", err)
			c.ready = false
			c.failErr(err)
		}
	}
}

// hasPendingTransform reports whether a live synced query waits for its AST.
func (g *group) hasPendingTransform() bool {
	clock := g.ttlClock(time.Now())
	for h, q := range g.cvr.queries {
		if q.pendingTransform() && !g.queryExpired(h, clock) {
			return true
		}
	}
	return false
}

// dropIfBroken forgets a group whose sync failed halfway. Its clients are
// sent away with Rehome; when they return, the group is unknown and they
// start over (ClientNotFound), as after a lost CVR.
func (g *group) dropIfBroken() {
	if !g.broken || g.unloaded {
		return
	}
	g.unloaded = true
	g.stopLocked()
	g.s.dropGroup(g)
	for _, c := range g.conns {
		c.ready = false
		c.fail(newProtocolError(kindRehome, "Reconnect required"))
	}
}

func (s *Server) dropGroup(g *group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groups[g.id] == g {
		delete(s.groups, g.id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.store.drop(ctx, g.cvr)
}

// evict removes the queries whose TTL ran out.
func (g *group) evict(ctx context.Context, now time.Time) error {
	unlock := g.lock()
	defer unlock()
	if !g.hasReady() || g.unloaded {
		return nil
	}
	clock := g.ttlClock(now)
	next, ok := g.nextEviction(clock)
	if !ok || next > clock {
		return nil
	}
	snap, err := g.s.openSnapshot(ctx)
	if err != nil || snap == nil {
		return err
	}
	defer snap.close()
	err = g.syncAt(ctx, snap)
	g.dropIfBroken()
	return err
}

// syncAt syncs the group at a fresh snapshot: only query-set changes,
// unless the snapshot is newer than the group's rows.
func (g *group) syncAt(ctx context.Context, snap *snapshot) error {
	snap.from = snap.version
	return g.sync(ctx, snap, &changeSet{tables: map[string]bool{}})
}

func (g *group) hasReady() bool {
	for _, c := range g.conns {
		if c.ready {
			return true
		}
	}
	return false
}

// unloadIfIdle marks the group unloaded once it has had no connection for
// GroupIdle, persisting its stopped TTL clock; the caller then removes it
// and gives its lease up. Its pipelines go with it: a returning client
// re-hydrates them from the durable CVR.
func (g *group) unloadIfIdle(ctx context.Context, now time.Time) bool {
	unlock := g.lock()
	defer unlock()
	if g.unloaded || len(g.conns) > 0 || now.Sub(g.idleSince) < g.s.cfg.GroupIdle {
		return false
	}
	g.persistClock(ctx)
	g.unloaded = true
	g.stopLocked()
	g.pipelines = nil
	g.log.Debug("unloaded idle client group")
	return true
}

// stopLocked stops what runs for a group leaving memory: its maintenance
// timer and its pusher.
func (g *group) stopLocked() {
	g.count(true)
	g.cc.Stop()
	g.stopPusherLocked()
}

// persistClock writes the TTL clock, which only a durable store keeps, and
// only for a group that has a version.
func (g *group) persistClock(ctx context.Context) {
	if g.broken || g.cvr.dg == nil || g.cvr.version == "" {
		return
	}
	u := g.beginConfig()
	u.clock = true
	if err := g.s.store.flush(ctx, g.cvr, u); err != nil {
		g.log.Warn("persist the ttl clock", "err", err)
	}
}

// ownerOf reads who owns a group now, for the Rehome message.
func (s *Server) ownerOf(id string) streams.CVROwner {
	if s.cfg.CVR == nil {
		return streams.CVROwner{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	o, _ := s.cfg.CVR.Owner(ctx, id)
	return o
}

// ownershipError is zero-cache's OwnershipError: Rehome, reconnect at once.
func ownershipError(o streams.CVROwner, lastConnect time.Time) *protocolError {
	owner := o.ID
	if owner == "" {
		owner = "null"
	}
	perr := newProtocolError(kindRehome, "CVR ownership was transferred to %s at %s (last connect time: %s)",
		owner, isoTime(time.UnixMilli(o.GrantedMs)), isoTime(lastConnect))
	zero := 0
	perr.MaxBackoffMs = &zero
	return perr
}

// isoTime formats t as JavaScript's Date.toISOString does.
func isoTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
