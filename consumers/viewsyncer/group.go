package viewsyncer

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/internal/telemetry"
)

// group is a client group: its CVR, the pipelines that keep the CVR's got
// queries up to date, and its connections. All its work is serialised by mu;
// groups run in parallel.
type group struct {
	s   *Server
	id  string
	log *slog.Logger

	mu  sync.Mutex
	cvr *cvrstore.CVR
	// broken is set when a sync failed halfway: the CVR no longer matches
	// the pipelines, so the group is dropped and its clients start over.
	broken    bool
	pipelines map[string]*pipeline
	// at is the replica state version the pipelines were last synced at.
	// It runs ahead of the CVR's version when advances changed none of
	// the group's rows: those write nothing and poke nobody. "" once the
	// pipelines are dropped.
	at string
	// conns holds the newest connection of each client; ready ones get
	// pokes.
	conns map[string]*conn
	// authData is what the read rules' authData parameters bind to;
	// authGen counts its changes, so pipelines tell when to re-bind.
	authData map[string]any
	authGen  int
	// cold is set for a CVR loaded from the store whose queries have no
	// pipelines yet: it hydrates before anything is poked.
	cold bool
	// idleSince is when the last connection left; unloaded is set once
	// the group left memory, so that a connection holding it retries.
	idleSince time.Time
	unloaded  bool
	// droppedRows counts the rows whose values the group let go of since
	// its last unlock (release.go).
	droppedRows int
	// pruneDue is when prune runs next (unix ns); read without mu.
	pruneDue atomic.Int64
	// leaseDone, if not nil, is closed when the store lost the group's
	// ownership. Set before the group is published; read without mu.
	leaseDone <-chan struct{}
	// syncTime is the time config changes spent syncing (hydrating) the
	// group, which paces the drain.
	syncTime time.Duration
	// loaded is closed once cvr is set, or loadErr; both are set under
	// the server's mu before.
	loaded  chan struct{}
	loadErr error

	// cc keeps the connections' auth contexts and the maintenance
	// schedule; its timer signals maint.
	cc    *authManager
	maint chan struct{}
	// maintaining is set while a maintenance round runs for the group
	// (Server.evictLoop), which starts no other one meanwhile; losing once
	// the loss of its lease is being handled, which waits for no round.
	maintaining, losing atomic.Bool
	// maintAt is when the group's next maintenance round is due (Unix
	// ns; 0: at the next tick). A round sets it from what it found, and
	// anything that may bring work sooner (a message, a connection
	// leaving) resets it, so that evictLoop visits only the groups with
	// something to do rather than every group at every tick.
	maintAt atomic.Int64
	// pusher forwards custom mutations, one request at a time; nil until
	// the first push. stopPush ends it.
	pusher   *appapi.Pusher
	stopPush context.CancelFunc
	// inspectAuthed is set once a client gave the admin password;
	// timings are the queries' inspector metrics (inspect.go).
	inspectAuthed bool
	timings       map[string]*queryTiming
	// counted is what the group adds to the queries and rows gauges.
	countedQueries, countedRows int

	// pend is what the advance left with the group while it was busy
	// (fair.go), guarded by pendMu, which the advance takes without mu;
	// catchingUp is set while a catch-up runs. slow is set while the
	// group's last config sync was slow.
	pendMu     sync.Mutex
	pend       *pendingAdvance
	catchingUp atomic.Bool
	slow       atomic.Bool
	// live holds the group's sockets and their handlers' cancels
	// (inbox.go), guarded by liveMu.
	liveMu sync.Mutex
	live   map[*conn]*liveSocket
}

// count updates the group's share of the queries and rows gauges; gone
// groups count nothing.
func (g *group) count(gone bool) {
	q, r := 0, 0
	if !gone && g.cvr != nil {
		q, r = len(g.cvr.Queries), len(g.cvr.Rows)
	}
	m := g.s.metrics
	m.queries.Add(float64(q - g.countedQueries))
	m.rows.Add(float64(r - g.countedRows))
	g.countedQueries, g.countedRows = q, r
	if !gone {
		m.groupQueries.Observe(float64(q))
		m.groupRows.Observe(float64(r))
	}
}

// lock takes the group's lock, recording the wait
// (zero.sync.lock-wait-time), and returns its unlock, which has the group
// catch up with what the advance left it meanwhile.
func (g *group) lock() func() {
	start := time.Now()
	g.mu.Lock()
	g.s.metrics.lockWait.Observe(time.Since(start).Seconds())
	return g.unlockAndCatchUp
}

// update is a CVR update (cvrstore.Update) as the group builds it, with
// the poke it streams meanwhile.
type update struct {
	*cvrstore.Update
	// stream, when not nil, sends row puts to the connections at From
	// while the update is built (pokeStream).
	stream *pokeStream
	// start is when its sync began: a long one hydrates in turns
	// (Server.hydrationTurn).
	start time.Time
}

// beginConfig starts a config-driven update (cvrstore.CVR.BeginConfig).
func (g *group) beginConfig() *update { return &update{Update: g.cvr.BeginConfig()} }

// ttlClock advances the group's TTL clock to now while it runs, and reads
// it (docs/protocol.md §12).
func (g *group) ttlClock(now time.Time) float64 { return g.cvr.ClockAt(now) }

// queryExpired reports whether no client keeps the query alive any more at
// TTL clock reading clock.
func (g *group) queryExpired(hash string, clock float64) bool { return g.cvr.Expired(hash, clock) }

// nextEviction is when, on the TTL clock, the earliest inactive query with
// a pipeline expires; ok is false if none will.
func (g *group) nextEviction(clock float64) (next float64, ok bool) {
	return g.cvr.NextEviction(clock, func(yield func(string) bool) {
		for hash, p := range g.pipelines {
			if !p.internal && !yield(hash) {
				return
			}
		}
	})
}

func (g *group) sortedConns() []*conn {
	out := make([]*conn, 0, len(g.conns))
	for _, c := range g.conns {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].clientID < out[j].clientID })
	return out
}

// sync brings the pipelines in line with the CVR at snapshot snap: it
// removes expired queries, hydrates missing ones, and updates those that
// read a table in changed from its rows (re-hydrating all of them if
// changed is nil). Then it flushes and pokes, once.
func (g *group) sync(ctx context.Context, snap *snapshot, changed *changeSet) error {
	if snap == nil || snap.version == "" {
		return nil
	}
	if err := g.syncLocked(ctx, snap, changed); err != nil {
		g.broken = true
		return err
	}
	return nil
}

// pipelinesAt is the replica state version g's pipelines are at: where an
// advance's changes must start for them to follow incrementally.
func (g *group) pipelinesAt() string {
	return max(g.at, cvrstore.StateOf(g.cvr.Version))
}

func (g *group) syncLocked(ctx context.Context, snap *snapshot, changed *changeSet) (err error) {
	at := g.pipelinesAt()
	from, changed := g.takePending(snap.from, snap.version, at, changed)
	if changed != nil && at < from {
		// The pipelines missed changes before from.
		changed = nil
	}
	if rv := g.cvr.ReplicaVersion; rv != "" && snap.replicaVersion != rv {
		if snap.replicaVersion < rv {
			return replicaChanged(rv, snap.replicaVersion)
		}
		// A newer replica (a resync): as zero-cache resets its pipelines,
		// every query re-hydrates, and rows are compared by value, so the
		// clients keep their state and get what differs.
		changed = nil
	}
	g.countReset(snap, changed == nil)
	u := &update{Update: g.cvr.BeginQuery(snap.version), start: time.Now()}
	u.Compare = changed == nil
	u.stream = g.newPokeStream(u)
	defer func() {
		if err != nil {
			// A poke begun will never end: its clients reconnect.
			u.stream.abandon()
		}
	}()
	now := g.ttlClock(time.Now())

	hashes := make([]string, 0, len(g.pipelines))
	for h := range g.pipelines {
		hashes = append(hashes, h)
	}
	sort.Strings(hashes)
	for _, h := range hashes {
		if p := g.pipelines[h]; !p.internal && g.queryExpired(h, now) {
			g.removePipeline(u, p)
		}
	}
	for _, h := range hashes {
		p := g.pipelines[h]
		if p == nil {
			continue
		}
		if q := g.cvr.Queries[h]; q != nil && q.Name != "" && q.AST == nil {
			g.removePipeline(u, p) // the API server refused it
			continue
		}
		rebuilt, err := g.prepare(p, snap)
		if err != nil {
			g.log.Warn("query no longer compiles; dropping it", logkey.Query, h, "err", err)
			g.removePipeline(u, p)
			continue
		}
		if !rebuilt && changed != nil && !p.affected(changed) {
			p.pass(snap)
			if !p.rehydrate {
				continue
			}
		}
		if rebuilt || changed == nil || p.rehydrate {
			if err := g.hydrate(ctx, u, snap, p); err != nil {
				return err
			}
			continue
		}
		if err := g.update(ctx, u, snap, p, changed.rows); err != nil {
			return err
		}
	}
	var add []string
	for h, q := range g.cvr.Queries {
		if _, ok := g.pipelines[h]; !ok && q.AST != nil && !q.Internal && !g.queryExpired(h, now) {
			add = append(add, h)
		}
	}
	sort.Strings(add)
	for _, iq := range []struct {
		hash string
		ast  func(string, *schema) *zql.AST
	}{{lmidsQuery, g.s.lmidsAST}, {mutationsQuery, g.s.mutationsAST}} {
		if _, ok := g.pipelines[iq.hash]; !ok {
			if ast := iq.ast(g.id, snap.schema); ast != nil {
				u.PutInternalQuery(iq.hash, ast)
				add = append(add, iq.hash)
			}
		}
	}
	// A CVR loaded from the store holds rows of got queries that have no
	// pipeline yet: a new pipeline starts from them, so that hydrating it
	// tombstones only what left, and resends only what changed.
	held := g.heldRows()
	for _, h := range add {
		q := g.cvr.Queries[h]
		p := &pipeline{hash: h, internal: q.Internal, custom: q.Name != "", rows: held[h]}
		if p.rows == nil {
			p.rows = map[string]struct{}{}
		}
		if _, err := g.prepare(p, snap); err != nil {
			// Checked on arrival; only a schema change gets here.
			g.log.Warn("query does not compile", logkey.Query, h, "err", err)
			continue
		}
		g.pipelines[h] = p
		u.Got(h)
		if err := g.hydrate(ctx, u, snap, p); err != nil {
			return err
		}
	}
	// Got queries left without a pipeline (expired while unloaded, or no
	// longer compiling) leave the got set with their rows.
	for _, h := range sortedKeys(held) {
		if q := g.cvr.Queries[h]; q != nil && q.PendingTransform() && !g.queryExpired(h, now) {
			continue // held until its client transforms it
		}
		if _, ok := g.pipelines[h]; !ok {
			g.removePipeline(u, &pipeline{hash: h, rows: held[h]})
		}
	}
	g.cold = false
	if err := u.Finish(nil); err != nil {
		return err
	}
	if g.cvr.ReplicaVersion == snap.replicaVersion && u.Idle() {
		// Nothing the clients or the store would see changed: the CVR
		// stays at its version, so its clients, already there, get no
		// poke, and the store no write; only the pipelines move on.
		u.Settle()
		g.s.metrics.idleSyncs.Inc()
	}
	g.cvr.ReplicaVersion = snap.replicaVersion
	g.at = max(g.at, snap.version)
	if snap.yield != nil {
		// The update is built: other groups may read while this one
		// waits for its flush.
		snap.yield()
	}
	return g.flush(ctx, u)
}

// replicaChanged is the error for a CVR built from a newer replica than
// this one (docs/protocol.md §6.4): its rows cannot be caught up from it.
func replicaChanged(cvrVersion, dbVersion string) *protocolError {
	return newProtocolError(kindClientNotFound, "Cannot sync from older replica: CVR=%s, DB=%s", cvrVersion, dbVersion)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// flush commits u, then pokes the clients: a pokeEnd never carries a
// cookie the store cannot reproduce. A failed flush breaks the group; its clients
// are told to reconnect (Rehome), and find what was durably written.
func (g *group) flush(ctx context.Context, u *update) error {
	g.cvr.Version = u.Version
	g.cvr.Clock()
	if err := g.s.store.Flush(ctx, g.cvr, u.Update); err != nil {
		g.broken = true
		g.log.Warn("flush cvr", "version", u.Version, "err", err)
		return newProtocolError(kindRehome, "Reconnect required")
	}
	g.count(false)
	if trace.SpanFromContext(ctx).IsRecording() {
		_, span := telemetry.Tracer().Start(ctx, "poke", trace.WithAttributes(attribute.Int("jetsync.connections", len(g.conns))))
		defer span.End()
	}
	start := time.Now()
	g.poke(u)
	g.s.metrics.pokeTime.Observe(time.Since(start).Seconds())
	return nil
}

// reset replaces the group's CVR by an empty one, durably.
func (g *group) reset(ctx context.Context) error {
	g.cvr.Reset()
	g.pipelines = map[string]*pipeline{}
	g.cold, g.at = false, ""
	return g.flush(ctx, &update{Update: g.cvr.ResetUpdate()})
}
