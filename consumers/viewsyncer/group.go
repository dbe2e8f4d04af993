package viewsyncer

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/consumers/zql/permissions"
	"github.com/jetsync/jetsync/internal/logkey"
)

// partSize is how many patches go in one pokePart, as zero-cache flushes.
const partSize = 100

// lmidsQuery is the hash of the internal query for the group's rows of
// <app>_<shard>.clients, which become lastMutationIDChanges.
const lmidsQuery = "lmids"

// mutationsQuery is the hash of the internal query for the group's rows of
// <app>_<shard>.mutations, which become mutationsPatch.
const mutationsQuery = "mutationResults"

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
	// pusher forwards custom mutations, one request at a time; nil until
	// the first push. stopPush ends it.
	pusher   *appapi.Pusher
	stopPush context.CancelFunc
	// counted is what the group adds to the queries and rows gauges.
	countedQueries, countedRows int
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
// (zero.sync.lock-wait-time), and returns its unlock.
func (g *group) lock() func() {
	start := time.Now()
	g.mu.Lock()
	g.s.metrics.lockWait.Observe(time.Since(start).Seconds())
	return g.mu.Unlock
}

// pipeline is a got query's evaluation state: its view follows the
// replica's changed rows, and re-hydrates only after a Reset, a schema or
// rules change, or a gap in the changes it saw.
type pipeline struct {
	hash     string
	internal bool
	// custom pipelines run a synced query's AST as transformed.
	custom bool
	query  *zql.Query
	view   *zql.View
	schema *schema
	// perms and authGen are what a legacy query was transformed with, and
	// transformed the hash of the result: the AST actually run.
	perms       *permissions.Rules
	authGen     int
	transformed string
	tables      map[string]bool
	// rows holds the IDs of the rows the query syncs.
	rows map[string]struct{}
}

// update is a CVR update (cvrstore.Update) as the group builds it, with
// the poke it streams meanwhile.
type update struct {
	*cvrstore.Update
	// stream, when not nil, sends row puts to the connections at From
	// while the update is built (pokeStream).
	stream *pokeStream
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

// changeSet is what the replica changed between two snapshots.
type changeSet struct {
	tables map[string]bool
	rows   []zql.Change
}

func (cs *changeSet) add(rcs []replicator.RowChange) {
	for _, rc := range rcs {
		cs.tables[rc.Table] = true
		cs.rows = append(cs.rows, zql.Change{Table: rc.Table, Old: rc.Old, New: rc.New})
	}
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

func (g *group) syncLocked(ctx context.Context, snap *snapshot, changed *changeSet) (err error) {
	if changed != nil && cvrstore.StateOf(g.cvr.Version) < snap.from {
		// The pipelines missed changes before snap.from.
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
	u := &update{Update: g.cvr.BeginQuery(snap.version)}
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
		if !rebuilt && changed != nil && !intersects(p.tables, changed.tables) {
			continue
		}
		if rebuilt || changed == nil {
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
	if err := u.Finish(u.stream.sentRows()); err != nil {
		return err
	}
	g.cvr.ReplicaVersion = snap.replicaVersion
	return g.flush(ctx, u)
}

// countReset counts a sync that re-hydrates the group's pipelines
// (zero.sync.pipeline-resets): for a schema change, a rules change, or
// changes it cannot follow (a truncation, a reset of the replica).
func (g *group) countReset(snap *snapshot, all bool) {
	reason := ""
	for _, p := range g.pipelines {
		switch {
		case p.query != nil && p.schema != snap.schema:
			reason = "schema-change"
		case reason == "" && !p.internal && !p.custom && p.perms != snap.perms:
			reason = "permissions-change"
		}
	}
	if reason == "" && all && len(g.pipelines) > 0 {
		reason = "truncation"
	}
	if reason != "" {
		g.s.metrics.pipelineResets.WithLabelValues(reason).Inc()
	}
}

// heldRows indexes, by query, the rows that got queries without a pipeline
// hold in the CVR; nil when every got query has one.
func (g *group) heldRows() map[string]map[string]struct{} {
	need := false
	for h, q := range g.cvr.Queries {
		if _, ok := g.pipelines[h]; !ok && (q.Got || q.Internal) {
			need = true
			break
		}
	}
	if !need {
		return nil
	}
	held := map[string]map[string]struct{}{}
	for id, rec := range g.cvr.Rows {
		for h := range rec.Refs {
			if _, ok := g.pipelines[h]; ok {
				continue
			}
			if held[h] == nil {
				held[h] = map[string]struct{}{}
			}
			held[h][id] = struct{}{}
		}
	}
	return held
}

// replicaChanged is the error for a CVR built from a newer replica than
// this one (docs/protocol.md §6.4): its rows cannot be caught up from it.
func replicaChanged(cvrVersion, dbVersion string) *protocolError {
	return newProtocolError(kindClientNotFound, "Cannot sync from older replica: CVR=%s, DB=%s", cvrVersion, dbVersion)
}

func (g *group) astOf(hash string) *zql.AST {
	if q := g.cvr.Queries[hash]; q != nil {
		return q.AST
	}
	return nil
}

// prepare (re)compiles p for snap when the schema, the read rules or the
// group's claims changed since it last ran. A legacy query runs with the
// rules injected and bound (docs/query-ast.md §1); internal queries run as
// they are. rebuilt reports that p now runs a different AST, so its rows
// must be re-hydrated.
func (g *group) prepare(p *pipeline, snap *snapshot) (rebuilt bool, err error) {
	fresh := p.query == nil || p.schema != snap.schema
	if !fresh && !p.custom && (p.internal || p.perms == snap.perms && p.authGen == g.authGen) {
		return false, nil
	}
	ast := g.astOf(p.hash)
	if ast == nil {
		return false, fmt.Errorf("query %s has no AST", p.hash)
	}
	if p.custom {
		// Synced queries run as the API server transformed them, without
		// the legacy read rules.
		th := g.cvr.Queries[p.hash].TransformationHash
		if !fresh && th == p.transformed {
			return false, nil
		}
		p.transformed = th
	} else if !p.internal {
		perms := snap.perms
		if perms == nil {
			perms = permissions.None
		}
		ast = perms.Transform(ast, g.authData)
		p.perms, p.authGen = snap.perms, g.authGen
		th := permissions.TransformationHash(ast)
		if !fresh && th == p.transformed {
			return false, nil
		}
		p.transformed = th
	}
	q, err := zql.Compile(snap.schema.zql, ast)
	if err != nil {
		return false, err
	}
	p.query, p.view, p.schema, p.tables = q, q.NewView(), snap.schema, astTables(ast, nil)
	return true, nil
}

func (g *group) removePipeline(u *update, p *pipeline) {
	for id := range p.rows {
		u.Release(id, p.hash)
	}
	delete(g.pipelines, p.hash)
	u.Unget(p.hash)
}

// hydrate evaluates p on snap and moves the CVR's references to its new
// result.
// Rows are taken, and streamed, as the evaluation brings them.
func (g *group) hydrate(ctx context.Context, u *update, snap *snapshot, p *pipeline) error {
	now := make(map[string]struct{}, len(p.rows))
	rowsRead, err := p.view.HydrateEach(ctx, snap.tx, func(r zql.RowValue) error {
		id, key, err := rowID(r)
		if err != nil {
			return err
		}
		if _, dup := now[id]; dup {
			return nil
		}
		now[id] = struct{}{}
		return g.streamRow(u, id, u.Hold(id, key, p.hash, r))
	})
	if err != nil {
		return fmt.Errorf("hydrate %s: %w", p.hash, err)
	}
	g.s.metrics.hydrations.Inc()
	g.s.metrics.rowsRead.Add(float64(rowsRead))
	for id := range p.rows {
		if _, ok := now[id]; !ok {
			u.Release(id, p.hash)
		}
	}
	p.rows = now
	return nil
}

// update moves p's view to snap, given the rows changed since its last
// snapshot, and the CVR's references with it.
func (g *group) update(ctx context.Context, u *update, snap *snapshot, p *pipeline, changes []zql.Change) error {
	d, err := p.view.Update(ctx, snap.tx, changes)
	if err != nil {
		return fmt.Errorf("update %s: %w", p.hash, err)
	}
	g.s.metrics.rowsRead.Add(float64(d.RowsRead))
	if d.Rehydrated {
		g.s.metrics.fallbacks.Inc()
	}
	for _, table := range sortedKeys(d.Del) {
		for _, r := range d.Del[table] {
			id, _, err := rowID(r)
			if err != nil {
				return err
			}
			if _, ok := p.rows[id]; !ok {
				continue
			}
			u.Release(id, p.hash)
			delete(p.rows, id)
		}
	}
	for _, table := range sortedKeys(d.Put.Values) {
		for _, r := range d.Put.Values[table] {
			id, key, err := rowID(r)
			if err != nil {
				return err
			}
			rec := u.Hold(id, key, p.hash, r)
			p.rows[id] = struct{}{}
			if err := g.streamRow(u, id, rec); err != nil {
				return err
			}
		}
	}
	return nil
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
	g.poke(u)
	return nil
}

// reset replaces the group's CVR by an empty one, durably.
func (g *group) reset(ctx context.Context) error {
	g.cvr.Reset()
	g.pipelines = map[string]*pipeline{}
	g.cold = false
	return g.flush(ctx, &update{Update: g.cvr.ResetUpdate()})
}

// rowID is a row's identity in the CVR, its table and primary key, and
// its key as canonical JSON, which the ID ends with.
func rowID(r zql.RowValue) (id, key string, err error) {
	var buf [64]byte
	b := append(buf[:0], r.Table()...)
	b = append(b, 0)
	b, err = r.AppendKeyJSON(b)
	if err != nil {
		return "", "", fmt.Errorf("row key of %s: %w", r.Table(), err)
	}
	id = string(b)
	return id, id[len(r.Table())+1:], nil
}

func intersects(a, b map[string]bool) bool {
	for t := range b {
		if a[t] {
			return true
		}
	}
	return false
}

// astTables adds the tables an AST reads to into.
func astTables(a *zql.AST, into map[string]bool) map[string]bool {
	if into == nil {
		into = map[string]bool{}
	}
	if a == nil {
		return into
	}
	into[a.Table] = true
	for i := range a.Related {
		astTables(a.Related[i].Subquery, into)
	}
	condTables(a.Where, into)
	return into
}

func condTables(c *zql.Condition, into map[string]bool) {
	if c == nil {
		return
	}
	for i := range c.Conditions {
		condTables(&c.Conditions[i], into)
	}
	if c.Related != nil {
		astTables(c.Related.Subquery, into)
	}
}
