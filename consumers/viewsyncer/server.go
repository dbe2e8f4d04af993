// Package viewsyncer is jetsync's view-syncer: it speaks the Zero sync
// protocol, version 51 (docs/protocol.md), to
// @rocicorp/zero clients over websockets, answering their AST queries from
// the SQLite replica that a replicator.Consumer keeps, and poking them as the
// replica advances.
//
// Each client group (group.go) has a CVR (consumers/cvrstore) and a set of
// pipelines (pipeline.go); all of a group's work is serialised by its lock,
// and locksordering.txt says how its lock nests with the others. Run
// follows the replica's subscription and advances every group; the group's
// life, from load to drop, is in lifecycle.go. Connections (conn.go) drive
// the groups' config changes (handlers.go), and every poke is put together
// in poke.go.
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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	_ "modernc.org/sqlite" // the replica's driver

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/auth"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/mutagen"
	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/consumers/zql/permissions"
	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/internal/telemetry"
	"github.com/jetsync/jetsync/projections/replica"
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
	// DefaultReadConns is the number of replica read connections the
	// advance has; the groups' own reads have a pool of their own
	// (fair.go).
	DefaultReadConns = 8
	// DefaultGroupIdle is how long a client group without connections
	// stays in memory: zero-cache's idle view-syncer keepalive. A group
	// that comes back later loads its CVR from the local projection.
	DefaultGroupIdle = 5 * time.Second
)

// evictInterval is how often Run looks for groups whose maintenance is
// due; maintenanceEvery is the longest a group goes without a round.
const (
	evictInterval    = 50 * time.Millisecond
	maintenanceEvery = time.Second
)

// ReplicaFeed is what the server needs of the consumer that keeps
// ReplicaFile (a *replicator.Consumer): where the replica stands, and a
// subscription to its changed rows.
type ReplicaFeed interface {
	State() replica.State
	Subscribe() *replicator.Subscription
}

// Config configures a Server.
type Config struct {
	// ReplicaFile is the SQLite replica Replica keeps.
	ReplicaFile string
	// Replica tells the server when the replica advances.
	Replica ReplicaFeed
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
	// AuthJWKSStale and AuthJWKSAllowHTTP are auth.Keys' JWKSStale and
	// JWKSAllowHTTP.
	AuthJWKSStale     time.Duration
	AuthJWKSAllowHTTP bool
	// AuthIssuer and AuthAudience are ZERO_AUTH_ISSUER and
	// ZERO_AUTH_AUDIENCE, checked when set.
	AuthIssuer, AuthAudience string
	// MaxPayloadBytes defaults to DefaultMaxPayloadBytes.
	MaxPayloadBytes int64
	// MaxQueueBytes defaults to DefaultMaxQueueBytes.
	MaxQueueBytes int
	// MaxConnections, SendBudgetBytes and MaxQueriesPerClient bound
	// what clients make the server hold (admission.go); each defaults to
	// its Default*, and a negative value means no bound.
	MaxConnections      int
	SendBudgetBytes     int64
	MaxQueriesPerClient int
	// CVRPruneAge is how long a loaded group keeps the records only an
	// old cookie's catch-up needs; DefaultCVRPruneAge when 0, never
	// pruned when negative.
	CVRPruneAge time.Duration
	// MemoryLimit, when positive, is the process's memory ceiling
	// (JETSYNC_MEMORY_LIMIT): as its resident size nears it, the server
	// sheds load.
	MemoryLimit int64
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
	// Mutagen, if set, applies legacy CRUD mutations upstream
	// (ZERO_ENABLE_CRUD_MUTATIONS); nil answers them InvalidPush.
	Mutagen *mutagen.Mutagen
	// RevalidateInterval and RetransformInterval are
	// ZERO_AUTH_REVALIDATE_INTERVAL_SECONDS and
	// ZERO_AUTH_RETRANSFORM_INTERVAL_SECONDS: how often a validated
	// connection's credentials are checked again, and how often a group's
	// synced queries are transformed again with its background
	// connection's. 0 disables either.
	RevalidateInterval, RetransformInterval time.Duration
	// Clock drives auth maintenance; nil means the system clock.
	Clock auth.Clock
	// AdminPassword is ZERO_ADMIN_PASSWORD, which opens the inspector;
	// DevelopmentMode (NODE_ENV=development) opens it without one when
	// none is set, as zero-cache does.
	AdminPassword   string
	DevelopmentMode bool
	// ServerVersion is what the inspector's version op answers.
	ServerVersion string
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
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.SendBudgetBytes == 0 {
		c.SendBudgetBytes = DefaultSendBudgetBytes
	}
	if c.SendBudgetBytes < 0 {
		c.SendBudgetBytes = 1<<63 - 1
	}
	if c.CVRPruneAge == 0 {
		c.CVRPruneAge = DefaultCVRPruneAge
	}
	if c.MaxQueriesPerClient == 0 {
		c.MaxQueriesPerClient = DefaultMaxQueriesPerClient
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
	if err := (auth.ManagerConfig{RevalidateInterval: c.RevalidateInterval, RetransformInterval: c.RetransformInterval}).Validate(); err != nil {
		return err
	}
	if err := c.apiConfig().Validate(); err != nil {
		return err
	}
	return c.authKeys().Validate()
}

// cvrStore keeps CVRs beyond a group's life in memory: cvrstore.Mem in the
// process, cvrstore.Durable on JetStream. Flush gets the update, so that a
// durable store writes only what it changed.
type cvrStore interface {
	// Load returns the group's CVR, nil for a group never written. It
	// takes the group's ownership; *cvrstore.OwnedError reports a live
	// peer that holds it.
	Load(ctx context.Context, groupID string) (*cvrstore.CVR, error)
	// Flush makes the update durable; it returns before the pokeEnd that
	// carries its cookie goes out.
	Flush(ctx context.Context, c *cvrstore.CVR, u *cvrstore.Update) error
	// Quiet reports whether a Flush of an update that changed nothing
	// would write nothing.
	Quiet(c *cvrstore.CVR) bool
	// Unload gives up a group no longer in memory: its ownership goes
	// back, so that a peer may serve it.
	Unload(ctx context.Context, c *cvrstore.CVR)
	// Drop forgets a group whose in-memory CVR can no longer be trusted;
	// the next Load starts from what was durably written.
	Drop(ctx context.Context, c *cvrstore.CVR)
}

// cvrOwners is what the view-syncer uses of a durable store besides its
// CVRs (*cvrstore.Store): the leases' renewal, their owners, and garbage
// collection.
type cvrOwners interface {
	Run(ctx context.Context) error
	Owner(ctx context.Context, groupID string) (streams.CVROwner, error)
	NewPurger(cfg cvrstore.GCConfig) (*cvrstore.Purger, error)
}

// Server is the view-syncer.
type Server struct {
	cfg Config
	log *slog.Logger
	// db serves the groups' own reads, advDB the advance's (fair.go);
	// slowReads holds a token for each connection of db a slow group
	// holds.
	db, advDB *sql.DB
	slowReads chan struct{}
	// heavyTurns holds a token for each query of a long sync hydrating.
	heavyTurns chan struct{}
	store      cvrStore
	owners     cvrOwners        // nil: CVRs in memory
	purger     *cvrstore.Purger // nil: no garbage collection
	auth       *auth.Verifier   // nil: no key configured
	api        *appapi.Client   // nil: no query or mutate URL configured
	metrics    *metrics
	inspect    inspectStats
	// stmts and advStmts keep db's and advDB's prepared statements for
	// the views' reads.
	stmts, advStmts *zql.StmtCache
	// views are the views that groups running the same query share.
	views sharedViews
	// rel returns memory to the OS after big queries go (release.go).
	rel release
	// bg tracks the groups' pushers, which closeAll waits for.
	bg             sync.WaitGroup
	clientsTable   string
	mutationsTable string
	permsTable     string

	// draining is set once Run ends: new connections are sent away.
	draining atomic.Bool
	// adm accounts for the sockets and their send queues.
	adm admission

	// loadMu serializes the schema and permissions loads of openSnapshot:
	// two racing ones would each build their own copy of an unchanged
	// schema, and pipelines prepared with the copy that was not kept would
	// take the next snapshot for a schema change and re-hydrate.
	loadMu sync.Mutex

	mu     sync.Mutex
	groups map[string]*group
	// dropping holds the groups whose store copy is being dropped
	// (dropGroup); closed when done.
	dropping map[string]chan struct{}
	schema   *schema            // last loaded
	perms    *permissions.Rules // last loaded
}

// New returns a Server; Run follows the replica, Handler serves clients.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	verifier, err := auth.NewVerifier(cfg.authKeys())
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
	db, err := openReplicaReader(cfg.ReplicaFile)
	if err != nil {
		return nil, fmt.Errorf("open replica: %w", err)
	}
	db.SetMaxOpenConns(groupReadConns)
	advDB, err := openReplicaReader(cfg.ReplicaFile)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open replica: %w", err)
	}
	advDB.SetMaxOpenConns(DefaultReadConns)
	log := cfg.Logger.With(logkey.Component, "view-syncer")
	var store cvrStore = cvrstore.NewMem()
	var owners cvrOwners
	var purger *cvrstore.Purger
	if cfg.CVR != nil {
		store, owners = &cvrstore.Durable{Store: cfg.CVR, Log: log}, cfg.CVR
		if cfg.GC.BatchSize != 0 {
			if purger, err = owners.NewPurger(cfg.GC); err != nil {
				return nil, err
			}
		}
	}
	return &Server{
		cfg:            cfg,
		log:            log,
		db:             db,
		stmts:          zql.NewStmtCache(db, 0),
		advStmts:       zql.NewStmtCache(advDB, 0),
		advDB:          advDB,
		slowReads:      make(chan struct{}, slowReadConns),
		heavyTurns:     make(chan struct{}, heavyHydrations()),
		store:          store,
		owners:         owners,
		purger:         purger,
		auth:           verifier,
		api:            api,
		metrics:        m,
		clientsTable:   replica.TableName(cfg.Shard.ID(), "clients"),
		mutationsTable: replica.TableName(cfg.Shard.ID(), "mutations"),
		permsTable:     replica.TableName(cfg.Shard.App, "permissions"),
		groups:         map[string]*group{},
		dropping:       map[string]chan struct{}{},
		adm:            admission{inflight: make(chan struct{}, runtime.GOMAXPROCS(0))},
		rel:            newRelease(),
	}, nil
}

// readCacheKiB is the page cache of each replica read connection, in KiB.
// With SQLite's default (2,000 KiB), the caches of the two pools reached
// 64-69 MiB while bench/viewsyncer's 50 groups hydrated at once: memory
// outside the Go heap, on top of it at the process's peak (~25 MiB at
// 512 KiB). The reads are scans and index lookups of a file the OS keeps
// cached, and 512 KiB still holds the indexes' upper levels.
const readCacheKiB = 512

// openReplicaReader opens a pool of read-only connections to the replica.
func openReplicaReader(file string) (*sql.DB, error) {
	return sql.Open("sqlite", "file:"+file+"?mode=ro&_pragma=busy_timeout(5000)"+
		"&_pragma=cache_size(-"+strconv.Itoa(readCacheKiB)+")")
}

// Close releases the replica connections.
func (s *Server) Close() error {
	return errors.Join(s.stmts.Close(), s.advStmts.Close(), s.db.Close(), s.advDB.Close())
}

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
	wg.Go(func() { s.monitorMemory(ctx) })
	wg.Go(func() { s.releaseLoop(ctx) })
	if s.owners != nil {
		wg.Go(func() {
			if err := s.owners.Run(ctx); err != nil {
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
		// The snapshot's connection is taken before the wait: commits wait
		// while the snapshot begins, and must not wait for the pool too.
		var conn *sql.Conn
		if s.cfg.Replica.State().Watermark != "" {
			c, err := s.advDB.Conn(ctx)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("take a replica connection", "err", err)
			}
			conn = c
		}
		var snap *snapshot
		u, err := sub.NextRead(ctx, func() (err error) {
			snap, err = s.beginSnapshot(ctx, conn)
			return err
		})
		if snap == nil && conn != nil {
			_ = conn.Close()
		}
		if err == nil && snap != nil {
			snap, err = s.finishSnapshot(ctx, snap)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, replicator.ErrClosed) {
				return fmt.Errorf("replica subscription: %w", err)
			}
			s.log.Error("advance", "err", err)
			continue
		}
		if snap != nil {
			s.advance(ctx, snap, u)
		}
	}
}

// advance advances each group to snap, which reads the replica at exactly
// u.To (Subscription.NextRead): the subscription says what changed, and
// the snapshot is the one watermark the groups move to.
func (s *Server) advance(ctx context.Context, snap *snapshot, u replicator.Update) {
	var changed *changeSet
	if !u.Reset {
		changed = &changeSet{}
		changed.add(u.Changes)
	}
	snap.from = u.From
	s.metrics.advances.Inc()
	if len(u.Traces) > 0 {
		var span trace.Span
		ctx, span = traceAdvance(ctx, u)
		defer span.End()
	}
	s.advanceGroups(ctx, snap, changed)
}

// traceAdvance starts the span of an advance that carries traced
// transactions: the child of the first one's replica apply, linked to the
// others'.
func traceAdvance(ctx context.Context, u replicator.Update) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(u.Traces)-1)
	for _, sc := range u.Traces[1:] {
		links = append(links, trace.Link{SpanContext: sc})
	}
	return telemetry.Tracer().Start(trace.ContextWithRemoteSpanContext(ctx, u.Traces[0]), "view-syncer advance",
		trace.WithLinks(links...), trace.WithAttributes(attribute.String("jetsync.watermark", u.To), attribute.Bool("jetsync.reset", u.Reset)))
}

// advanceGroups advances every group to snap, in parallel. The groups'
// reads share a few snapshots at snap's watermark, one group at a time
// each; a group lends its snapshot on (snapshot.yield) once its update is
// built, and waits for its CVR flush without one, so that the flushes of
// many groups wait together and share one publish (cvrstore's committer)
// rather than taking turns. A group none of whose rows the changes can
// touch is moved on first, in place, without a snapshot (passQuiet). It
// closes snap.
func (s *Server) advanceGroups(ctx context.Context, snap *snapshot, changed *changeSet) {
	groups := s.groupList()
	// Slow groups last: the others are not left waiting for a worker.
	sort.SliceStable(groups, func(i, j int) bool { return !groups[i].slow.Load() && groups[j].slow.Load() })
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
	free := make(chan *snapshot, len(snaps))
	for _, sn := range snaps {
		free <- sn
	}
	running := make(chan struct{}, maxAdvancing)
	var wg sync.WaitGroup
	for _, g := range groups {
		if g.passQuietContained(snap, changed) {
			continue
		}
		select {
		case running <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-running }()
			var sn *snapshot
			select {
			case sn = <-free:
			case <-ctx.Done():
				return
			}
			lent := *sn
			var once sync.Once
			lent.yield = func() { once.Do(func() { free <- sn }) }
			defer lent.yield()
			g.advanceContained(ctx, &lent, changed)
		})
	}
	wg.Wait()
	for range snaps {
		(<-free).close()
	}
}

// maxAdvanceWorkers bounds the groups advanced at once; with the Run
// loop's next snapshot, they stay within DefaultReadConns.
const maxAdvanceWorkers = DefaultReadConns / 2

// maxAdvancing bounds the groups whose advance is under way at once, most
// of them waiting for a snapshot or for their CVR flush.
const maxAdvancing = 512

// evictLoop evicts expired queries, stops serving groups whose lease was
// lost and unloads idle groups, until ctx ends. Each group's round runs on
// a goroutine of its own, and a group whose last round has not ended is
// skipped: a group waiting on the API server or on its lock delays no
// other group's maintenance. A group whose round is not due
// (group.maintAt) is skipped too. A lost lease is handled at once, even while
// the group's round waits on the API server.
func (s *Server) evictLoop(ctx context.Context) {
	t := time.NewTicker(evictInterval)
	defer t.Stop()
	var observed time.Time
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			groups := s.groupList()
			for _, g := range groups {
				if g.leaseGone() {
					if g.losing.CompareAndSwap(false, true) {
						wg.Go(func() {
							defer g.contain("lease loss")
							s.leaseLost(g)
						})
					}
					continue
				}
				if now.UnixNano() < g.maintAt.Load() && len(g.maint) == 0 {
					continue
				}
				if !g.maintaining.CompareAndSwap(false, true) {
					continue
				}
				wg.Go(func() {
					defer g.maintaining.Store(false)
					s.maintainGroup(ctx, g, now)
				})
			}
			if now.Sub(observed) >= time.Second {
				observed = now
				s.metrics.groups.Set(float64(len(groups)))
				if s.cfg.CVR != nil {
					s.metrics.leases.Set(float64(len(s.cfg.CVR.Leases())))
				}
			}
		}
	}
}

// advanceContained is g.advance, a panic in it failing g alone.
func (g *group) advanceContained(ctx context.Context, sn *snapshot, changed *changeSet) {
	defer g.contain("advance")
	if trace.SpanFromContext(ctx).IsRecording() {
		var span trace.Span
		ctx, span = telemetry.Tracer().Start(ctx, "group advance", trace.WithAttributes(attribute.String("jetsync.client_group", g.id)))
		defer span.End()
	}
	if err := g.advance(ctx, sn, changed); err != nil && ctx.Err() == nil {
		g.log.Error("advance group", "err", err)
	}
}

// passQuietContained is g.passQuiet, a panic in it failing g alone (and
// ending its advance).
func (g *group) passQuietContained(snap *snapshot, changed *changeSet) (passed bool) {
	defer g.contain("advance")
	passed = true
	return g.passQuiet(snap, changed)
}

// maintainGroup runs evictLoop's work for g, a panic in it failing g alone.
func (s *Server) maintainGroup(ctx context.Context, g *group, now time.Time) {
	defer g.contain("maintenance")
	// Provisional: a wake while the round runs resets it, and the
	// schedule at the end only brings it forward.
	g.maintAt.Store(now.Add(maintenanceEvery).UnixNano())
	if hook := maintenanceHook.Load(); hook != nil {
		(*hook)(g.id)
	}
	if g.maintenanceDue() {
		g.maintain(ctx)
	}
	g.transformPending(ctx)
	if g.unloadIfIdle(ctx, now) {
		s.removeGroup(g)
		s.store.Unload(ctx, g.cvr)
		return
	}
	if err := g.evict(ctx, now); err != nil && ctx.Err() == nil {
		g.log.Error("evict", "err", err)
	}
	g.prune(now)
	g.scheduleMaintenance(now)
}

// leaseGone reports whether the store lost g's ownership.
func (g *group) leaseGone() bool {
	select {
	case <-g.leaseDone:
		return true
	default:
		return false
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

// snapshot is one consistent read of the replica.
type snapshot struct {
	tx *sql.Tx
	// conn, if not nil, is the pool connection tx runs on, given back by
	// close.
	conn           *sql.Conn
	version        string
	replicaVersion string
	schema         *schema
	// perms are the read rules at this snapshot.
	perms *permissions.Rules
	// from is where the changes an advance reports start; pipelines at an
	// older version must re-hydrate fully.
	from string
	// stmts, if not nil, is the statement cache of the pool tx is from
	// (querier).
	stmts *zql.StmtCache
	// yield, if not nil, lends the snapshot to the next group's advance:
	// called once the group reads it no more (advanceGroups).
	yield func()
	// release, if not nil, gives back a slow group's read token.
	release func()
}

// querier is what the views read tx through: with the pool's cached
// statements when there are.
func (sn *snapshot) querier() zql.Querier {
	if sn.stmts != nil {
		return sn.stmts.Querier(sn.tx)
	}
	return sn.tx
}

func (sn *snapshot) close() {
	_ = sn.tx.Rollback()
	if sn.conn != nil {
		_ = sn.conn.Close()
	}
	if sn.release != nil {
		sn.release()
		sn.release = nil
	}
}

// openSnapshotLike opens another read transaction at like's watermark,
// sharing its schema and rules; nil means the replica is past it already.
func (s *Server) openSnapshotLike(ctx context.Context, like *snapshot) (*snapshot, error) {
	tx, err := s.advDB.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("begin replica read: %w", err)
	}
	st, err := replica.LoadState(ctx, tx)
	if err != nil || st.Watermark != like.version {
		_ = tx.Rollback()
		return nil, err
	}
	sn := *like
	sn.tx, sn.conn, sn.release = tx, nil, nil
	return &sn, nil
}

// openSnapshot opens a read transaction on the replica; nil means there is
// no replica yet.
func (s *Server) openSnapshot(ctx context.Context) (*snapshot, error) {
	snap, err := s.beginSnapshot(ctx, nil)
	if err != nil || snap == nil {
		return nil, err
	}
	return s.finishSnapshot(ctx, snap)
}

// beginSnapshot begins a read transaction and reads the replica's state,
// which fixes what the transaction sees; nil means there is no replica
// yet. It is quick, since the replica's commits may be waiting for it. It
// runs on conn, if not nil, which the snapshot then closes.
func (s *Server) beginSnapshot(ctx context.Context, conn *sql.Conn) (*snapshot, error) {
	if s.cfg.Replica.State().Watermark == "" {
		return nil, nil
	}
	var tx *sql.Tx
	var err error
	if conn != nil {
		tx, err = conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	} else {
		tx, err = s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	}
	if err != nil {
		return nil, fmt.Errorf("begin replica read: %w", err)
	}
	st, err := replica.LoadState(ctx, tx)
	if err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	if st.Watermark == "" {
		_ = tx.Rollback()
		return nil, nil
	}
	stmts := s.stmts
	if conn != nil {
		stmts = s.advStmts // the advance's own connection (Run)
	}
	return &snapshot{tx: tx, conn: conn, stmts: stmts, version: st.Watermark, replicaVersion: st.ReplicaVersion, from: st.Watermark}, nil
}

// finishSnapshot loads the schema and read rules at snap, or closes it.
func (s *Server) finishSnapshot(ctx context.Context, snap *snapshot) (*snapshot, error) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	s.mu.Lock()
	prev, prevPerms := s.schema, s.perms
	s.mu.Unlock()
	sch, err := loadSchema(ctx, snap.tx, prev)
	if err != nil {
		snap.close()
		return nil, err
	}
	_, replicated := sch.tables[s.permsTable]
	perms, err := permissions.Load(ctx, snap.tx, s.permsTable, replicated, prevPerms)
	if err != nil {
		snap.close()
		return nil, err
	}
	if perms == permissions.None && prevPerms != permissions.None {
		s.log.Warn("No upstream permissions deployed. Run 'npx zero-deploy-permissions --app-id=" + s.cfg.Shard.App + "' to enforce permissions.")
	}
	s.mu.Lock()
	s.schema, s.perms = sch, perms
	s.mu.Unlock()
	snap.schema, snap.perms = sch, perms
	return snap, nil
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
