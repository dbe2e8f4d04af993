package viewsyncer

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/replica"
	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/consumers/zql/permissions"
)

// TTLs of desired queries (docs/protocol.md §12).
const (
	DefaultTTL = 5 * time.Minute
	MaxTTL     = 10 * time.Minute
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
	cvr *cvr
	// broken is set when a sync failed halfway: the CVR no longer matches
	// the pipelines, so the group is dropped and its clients start over.
	broken    bool
	pipelines map[string]*pipeline
	// oneRef holds, per query, the refs map of the rows only it holds,
	// which they share (addRef).
	oneRef map[string]map[string]int
	// conns holds the newest connection of each client; ready ones get
	// pokes.
	conns map[string]*conn
	// authData is what the read rules' authData parameters bind to;
	// authGen counts its changes, so pipelines tell when to re-bind.
	authData map[string]any
	authGen  int
	// clockAt is when the TTL clock was last advanced; zero while it is
	// stopped (no connections).
	clockAt time.Time
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
		q, r = len(g.cvr.queries), len(g.cvr.rows)
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

// update is one change to the CVR: config-driven (clients and their desired
// queries) or query-driven (hydrations, replica advances, evictions). It
// remembers what it touched so that clients at its starting version get
// exactly those patches.
type update struct {
	from, version string
	query         bool
	// reset replaces the whole CVR (a durable store writes it all); clock
	// asks a durable store to write the TTL clock even if nothing else
	// changed.
	reset, clock bool

	rowStart map[string]rowStart
	rowOrder []string
	rows     []string // IDs of rows whose patchVersion is version
	queries  []string
	desires  [][2]string // clientID, hash
	// compare has finishRows compare row values, not only versions.
	compare bool
	// stream, when not nil, sends row puts to the connections at from
	// while the update is built (pokeStream).
	stream *pokeStream
}

type rowStart struct {
	live    bool
	version string
	value   zql.RowValue
	// existed, patchVersion and refs are the record as the update found
	// it, so that a durable store writes only the records that changed.
	existed      bool
	patchVersion string
	refs         map[string]int
}

func (g *group) beginConfig() *update {
	return &update{from: g.cvr.version, version: g.cvr.version}
}

// beginQuery starts a query-driven update at replica state version state:
// the CVR moves to it if it is newer (docs/protocol.md §6.3).
func (g *group) beginQuery(state string) *update {
	u := &update{from: g.cvr.version, version: g.cvr.version, query: true, rowStart: map[string]rowStart{}}
	if state > stateOf(g.cvr.version) {
		u.version = state
	}
	return u
}

// v is the update's new version, bumping the config version at the first
// material change that needs one.
func (u *update) v() string {
	if u.version == u.from {
		u.version = bumpConfig(u.from)
	}
	return u.version
}

// putNeeded reports whether a row live at the end of an update, which found
// it as st, is sent as a put.
func putNeeded(st rowStart, rec *rowRecord, compare bool) bool {
	return !st.live || rec.rowVersion != st.version || compare && !st.value.IsZero() && !rec.value.Equal(st.value)
}

func (u *update) touchRow(id string, rec *rowRecord) {
	if _, ok := u.rowStart[id]; ok {
		return
	}
	var st rowStart
	if rec != nil {
		st = rowStart{existed: true, version: rec.rowVersion, patchVersion: rec.patchVersion, refs: rec.refs} // never changed in place
		if rec.refs != nil {
			st.live, st.value = true, rec.value
		}
	}
	u.rowStart[id] = st
	u.rowOrder = append(u.rowOrder, id)
}

func clampTTL(ms *float64) time.Duration {
	if ms == nil {
		return DefaultTTL
	}
	if *ms < 0 || *ms > float64(MaxTTL/time.Millisecond) {
		return MaxTTL
	}
	return time.Duration(*ms) * time.Millisecond
}

// applyPatch applies one client's desiredQueriesPatch.
func (g *group) applyPatch(u *update, clientID string, ops []queryPatchOp, asts map[string]*zql.AST, clock float64) {
	cr := g.cvr.clients[clientID]
	for _, op := range ops {
		switch op.Op {
		case "put":
			q := g.cvr.queries[op.Hash]
			if q == nil {
				q = &queryRecord{hash: op.Hash, ast: asts[op.Hash]}
				if op.Name != nil && len(op.AST) == 0 {
					q.name, q.args = *op.Name, op.Args
					if len(q.args) == 0 {
						q.args = json.RawMessage("[]")
					}
				}
				g.cvr.queries[op.Hash] = q
			} else if q.ast == nil && q.name == "" {
				q.ast = asts[op.Hash]
			}
			ttl := clampTTL(op.TTL)
			d := cr.desired[op.Hash]
			switch {
			case d == nil || !d.active():
				cr.desired[op.Hash] = &desire{ttl: max(ttl, ttlOf(d)), patchVersion: u.v()}
				u.desires = append(u.desires, [2]string{clientID, op.Hash})
			case ttl > d.ttl:
				d.ttl = ttl
			}
		case "del":
			if d := cr.desired[op.Hash]; d != nil && d.active() {
				d.inactive, d.inactiveAt, d.patchVersion = true, clock, u.v()
				u.desires = append(u.desires, [2]string{clientID, op.Hash})
			}
		case "clear":
			for hash, d := range cr.desired {
				d.cleared = true
				if d.active() {
					d.inactive, d.inactiveAt, d.patchVersion = true, clock, u.v()
					u.desires = append(u.desires, [2]string{clientID, hash})
				}
			}
		}
	}
}

func ttlOf(d *desire) time.Duration {
	if d == nil {
		return 0
	}
	return d.ttl
}

// deleteClient inactivates a client's queries with their TTLs and drops it
// from the group (docs/protocol.md §4.3).
func (g *group) deleteClient(u *update, id string, clock float64) {
	cr := g.cvr.clients[id]
	if cr == nil || cr.deleted {
		return
	}
	for hash, d := range cr.desired {
		if d.active() {
			d.inactive, d.inactiveAt, d.patchVersion = true, clock, u.v()
			u.desires = append(u.desires, [2]string{id, hash})
		}
	}
	cr.deleted = true
	u.v()
}

// queryExpired reports whether no client keeps the query alive any more at
// TTL clock reading clock.
func (g *group) queryExpired(hash string, clock float64) bool {
	for _, cr := range g.cvr.clients {
		if d := cr.desired[hash]; d != nil && !d.expired(clock) {
			return false
		}
	}
	return true
}

// nextEviction is when, on the TTL clock, the earliest inactive query
// expires; ok is false if none will.
func (g *group) nextEviction(clock float64) (next float64, ok bool) {
	for hash, p := range g.pipelines {
		if p.internal {
			continue
		}
		latest, found := 0.0, false
		alive := false
		for _, cr := range g.cvr.clients {
			d := cr.desired[hash]
			if d == nil || d.expired(clock) {
				continue
			}
			if d.active() {
				alive = true
				break
			}
			if at := d.expiresAt(); !found || at > latest {
				latest, found = at, true
			}
		}
		switch {
		case alive:
		case !found:
			return clock, true // expired already
		case !ok || latest < next:
			next, ok = latest, true
		}
	}
	return next, ok
}

// ttlClock advances the group's TTL clock to now while it runs, and reads
// it (docs/protocol.md §12).
func (g *group) ttlClock(now time.Time) float64 {
	if !g.clockAt.IsZero() {
		if d := now.Sub(g.clockAt); d > 0 {
			g.cvr.ttlClockMs += float64(d) / float64(time.Millisecond)
			g.clockAt = now
		}
	}
	return g.cvr.ttlClockMs
}

// changeSet is what the replica changed between two snapshots.
type changeSet struct {
	tables map[string]bool
	rows   []zql.Change
}

func (cs *changeSet) add(rcs []replica.RowChange) {
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
	if changed != nil && stateOf(g.cvr.version) < snap.from {
		// The pipelines missed changes before snap.from.
		changed = nil
	}
	if rv := g.cvr.replicaVersion; rv != "" && snap.replicaVersion != rv {
		if snap.replicaVersion < rv {
			return replicaChanged(rv, snap.replicaVersion)
		}
		// A newer replica (a resync): as zero-cache resets its pipelines,
		// every query re-hydrates, and rows are compared by value, so the
		// clients keep their state and get what differs.
		changed = nil
	}
	g.countReset(snap, changed == nil)
	u := g.beginQuery(snap.version)
	u.compare = changed == nil
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
		if q := g.cvr.queries[h]; q != nil && q.name != "" && q.ast == nil {
			g.removePipeline(u, p) // the API server refused it
			continue
		}
		rebuilt, err := g.prepare(p, snap)
		if err != nil {
			g.log.Warn("query no longer compiles; dropping it", "query", h, "err", err)
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
	for h, q := range g.cvr.queries {
		if _, ok := g.pipelines[h]; !ok && q.ast != nil && !q.internal && !g.queryExpired(h, now) {
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
				g.cvr.queries[iq.hash] = &queryRecord{hash: iq.hash, ast: ast, internal: true}
				add = append(add, iq.hash)
			}
		}
	}
	// A CVR loaded from the store holds rows of got queries that have no
	// pipeline yet: a new pipeline starts from them, so that hydrating it
	// tombstones only what left, and resends only what changed.
	held := g.heldRows()
	for _, h := range add {
		q := g.cvr.queries[h]
		p := &pipeline{hash: h, internal: q.internal, custom: q.name != "", rows: held[h]}
		if p.rows == nil {
			p.rows = map[string]struct{}{}
		}
		if _, err := g.prepare(p, snap); err != nil {
			// Checked on arrival; only a schema change gets here.
			g.log.Warn("query does not compile", "query", h, "err", err)
			continue
		}
		g.pipelines[h] = p
		if !q.internal && !q.got {
			q.got, q.everGot, q.patchVersion = true, true, u.v()
			u.queries = append(u.queries, h)
		}
		if err := g.hydrate(ctx, u, snap, p); err != nil {
			return err
		}
	}
	// Got queries left without a pipeline (expired while unloaded, or no
	// longer compiling) leave the got set with their rows.
	for _, h := range sortedKeys(held) {
		if q := g.cvr.queries[h]; q != nil && q.pendingTransform() && !g.queryExpired(h, now) {
			continue // held until its client transforms it
		}
		if _, ok := g.pipelines[h]; !ok {
			g.removePipeline(u, &pipeline{hash: h, rows: held[h]})
		}
	}
	g.cold = false
	if err := g.finishRows(u); err != nil {
		return err
	}
	g.cvr.replicaVersion = snap.replicaVersion
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
	for h, q := range g.cvr.queries {
		if _, ok := g.pipelines[h]; !ok && (q.got || q.internal) {
			need = true
			break
		}
	}
	if !need {
		return nil
	}
	held := map[string]map[string]struct{}{}
	for id, rec := range g.cvr.rows {
		for h := range rec.refs {
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
	if q := g.cvr.queries[hash]; q != nil {
		return q.ast
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
		th := g.cvr.queries[p.hash].transformationHash
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
		rec := g.cvr.rows[id]
		u.touchRow(id, rec)
		delRef(rec, p.hash)
	}
	delete(g.pipelines, p.hash)
	if q := g.cvr.queries[p.hash]; q != nil && q.got {
		q.got, q.patchVersion = false, u.v()
		u.queries = append(u.queries, p.hash)
	}
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
		rec := g.cvr.rows[id]
		u.touchRow(id, rec)
		if rec == nil {
			rec = &rowRecord{table: r.Table(), key: key}
			g.cvr.rows[id] = rec
		}
		g.addRef(rec, p.hash)
		rec.value, rec.rowVersion = r, r.Version()
		return g.streamRow(u, id, rec)
	})
	if err != nil {
		return fmt.Errorf("hydrate %s: %w", p.hash, err)
	}
	g.s.metrics.hydrations.Inc()
	g.s.metrics.rowsRead.Add(float64(rowsRead))
	for id := range p.rows {
		if _, ok := now[id]; !ok {
			rec := g.cvr.rows[id]
			u.touchRow(id, rec)
			delRef(rec, p.hash)
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
			rec := g.cvr.rows[id]
			u.touchRow(id, rec)
			delRef(rec, p.hash)
			delete(p.rows, id)
		}
	}
	for _, table := range sortedKeys(d.Put.Values) {
		for _, r := range d.Put.Values[table] {
			id, key, err := rowID(r)
			if err != nil {
				return err
			}
			rec := g.cvr.rows[id]
			u.touchRow(id, rec)
			if rec == nil {
				rec = &rowRecord{table: table, key: key}
				g.cvr.rows[id] = rec
			}
			g.addRef(rec, p.hash)
			rec.value, rec.rowVersion = r, r.Version()
			p.rows[id] = struct{}{}
			if err := g.streamRow(u, id, rec); err != nil {
				return err
			}
		}
	}
	return nil
}

// A row's refs map is never changed in place, only replaced (addRef,
// delRef), so that the rows one query holds share one map: a whole-table
// query's 100k rows hold one instead of 100k. Updates and store events
// may then keep a record's refs without copying them.

// addRef makes the query hash hold rec.
func (g *group) addRef(rec *rowRecord, hash string) {
	if rec.refs[hash] == 1 {
		return
	}
	if len(rec.refs) == 0 {
		one := g.oneRef[hash]
		if one == nil {
			one = map[string]int{hash: 1}
			if g.oneRef == nil {
				g.oneRef = map[string]map[string]int{}
			}
			g.oneRef[hash] = one
		}
		rec.refs = one
		return
	}
	m := maps.Clone(rec.refs)
	m[hash] = 1
	rec.refs = m
}

// delRef makes the query hash no longer hold rec; the refs of a row no
// query holds any more are empty, not nil, until finishRows.
func delRef(rec *rowRecord, hash string) {
	if _, ok := rec.refs[hash]; !ok {
		return
	}
	m := make(map[string]int, len(rec.refs)-1)
	for h, n := range rec.refs {
		if h != hash {
			m[h] = n
		}
	}
	rec.refs = m
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// finishRows turns the update's reference changes into row patches: a put
// for a row that appeared or changed, a del (and a tombstone) for one no got
// query holds any more (docs/protocol.md §7.1).
//
// A row already streamed as a put must end as one: a client would
// otherwise hold a row the CVR does not record.
func (g *group) finishRows(u *update) error {
	for _, id := range u.rowOrder {
		st, rec := u.rowStart[id], g.cvr.rows[id]
		live := len(rec.refs) > 0
		put := live && putNeeded(st, rec, u.compare)
		if !put {
			if _, ok := u.stream.sentRows()[id]; ok {
				return fmt.Errorf("row %q was streamed as a put but is not one", id)
			}
		}
		switch {
		case put:
			rec.patchVersion = u.v()
			u.rows = append(u.rows, id)
		case !live && st.live:
			// A tombstone needs only its key: a del carries that, and a
			// row that comes back is read again. Keeping the value would
			// hold a whole table's rows after its query goes.
			rec.refs, rec.value, rec.patchVersion = nil, zql.RowValue{}, u.v()
			u.rows = append(u.rows, id)
		case !live && rec.patchVersion == "":
			delete(g.cvr.rows, id) // never sent
		case !live:
			rec.refs = nil
		}
	}
	return nil
}

// flush commits u, then pokes the clients: a pokeEnd never carries a
// cookie the store cannot reproduce. A failed flush breaks the group; its clients
// are told to reconnect (Rehome), and find what was durably written.
func (g *group) flush(ctx context.Context, u *update) error {
	g.cvr.version = u.version
	g.ttlClock(time.Now())
	if err := g.s.store.flush(ctx, g.cvr, u); err != nil {
		g.broken = true
		g.log.Warn("flush cvr", "version", u.version, "err", err)
		return newProtocolError(kindRehome, "Reconnect required")
	}
	g.count(false)
	g.poke(u)
	return nil
}

// reset replaces the group's CVR by an empty one, durably.
func (g *group) reset(ctx context.Context) error {
	dg := g.cvr.dg
	*g.cvr = *newCVR(g.id)
	g.cvr.dg = dg
	g.pipelines = map[string]*pipeline{}
	g.cold = false
	return g.flush(ctx, &update{reset: true})
}

// poke sends each ready connection one poke to the CVR's version: the
// update's patches to those at its starting version, a catch-up from their
// cookie to the others, and an empty poke to a connection not yet poked
// (docs/protocol.md §7.2).
//
// Connections that were streamed the update's first parts get the rest:
// its other patches, then the pokeEnd.
func (g *group) poke(u *update) {
	v := g.cvr.version
	ps := u.stream
	var rest error
	if ps.begun() {
		rest = g.sendPart(u)
	}
	var delta, remainder *pokeContent
	for _, c := range g.sortedConns() {
		if !c.ready || c.hasBase && c.base > v || c.hasBase && c.base == v && c.everPoked {
			continue
		}
		var pc *pokeContent
		begun := ps.begun() && ps.has(c)
		switch {
		case begun && rest != nil:
			continue // abandoned below
		case begun:
			if remainder == nil {
				remainder = g.delta(u, ps.sent)
			}
			pc = remainder
		case c.hasBase == (u.from != "") && c.base == u.from:
			if delta == nil {
				delta = g.delta(u, nil)
			}
			pc = delta
		default:
			pc = g.catchup(c.base, c.hasBase)
		}
		g.s.metrics.pokes.Inc()
		if err := c.sendPoke(c.base, c.hasBase, v, pc, begun); err != nil {
			c.fail(newProtocolError(kindInternal, "%v", err))
			continue
		}
		if begun {
			ps.ended[c] = true
		}
		c.base, c.hasBase, c.everPoked = v, true, true
	}
	ps.abandon()
}

func (g *group) sortedConns() []*conn {
	out := make([]*conn, 0, len(g.conns))
	for _, c := range g.conns {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].clientID < out[j].clientID })
	return out
}

// pokeContent is what one poke carries.
type pokeContent struct {
	desired map[string][]queryPatch
	got     []queryPatch
	rows    []rowPatch
	lmids   map[string]float64
	// mutations are mutationsPatch entries, encoded.
	mutations []json.RawMessage
}

func (pc *pokeContent) empty() bool {
	return len(pc.desired) == 0 && len(pc.got) == 0 && len(pc.rows) == 0 && len(pc.lmids) == 0 && len(pc.mutations) == 0
}

// delta is the update's patches, but for the rows in skip (streamed).
func (g *group) delta(u *update, skip map[string]struct{}) *pokeContent {
	pc := &pokeContent{}
	for _, k := range u.desires {
		if d := g.cvr.clients[k[0]].desired[k[1]]; d != nil && d.patchVersion == u.version {
			pc.addDesire(k[0], k[1], d)
		}
	}
	for _, h := range u.queries {
		if q := g.cvr.queries[h]; q != nil && q.patchVersion == u.version {
			pc.addQuery(q)
		}
	}
	for _, id := range u.rows {
		if _, ok := skip[id]; ok {
			continue
		}
		if rec := g.cvr.rows[id]; rec != nil && rec.patchVersion == u.version {
			g.addRow(pc, rec)
		}
	}
	return pc
}

// catchup is everything that changed after base (docs/protocol.md §6.4);
// with no base, everything there is.
func (g *group) catchup(base string, hasBase bool) *pokeContent {
	pc := &pokeContent{}
	newer := func(pv string) bool { return pv != "" && (!hasBase || pv > base) }
	for _, cr := range g.cvr.clients {
		if cr.deleted && !hasBase {
			continue
		}
		for h, d := range cr.desired {
			if newer(d.patchVersion) && (hasBase || d.active()) {
				pc.addDesire(cr.id, h, d)
			}
		}
	}
	for _, q := range g.cvr.queries {
		if !q.internal && q.everGot && newer(q.patchVersion) && (hasBase || q.got) {
			pc.addQuery(q)
		}
	}
	for _, rec := range g.cvr.rows {
		if newer(rec.patchVersion) && (hasBase || rec.refs != nil) {
			g.addRow(pc, rec)
		}
	}
	return pc
}

func (pc *pokeContent) addDesire(clientID, hash string, d *desire) {
	if pc.desired == nil {
		pc.desired = map[string][]queryPatch{}
	}
	op := "put"
	if !d.active() {
		op = "del"
	}
	pc.desired[clientID] = append(pc.desired[clientID], queryPatch{Op: op, Hash: hash})
}

func (pc *pokeContent) addQuery(q *queryRecord) {
	op := "put"
	if !q.got {
		op = "del"
	}
	pc.got = append(pc.got, queryPatch{Op: op, Hash: q.hash})
}

// addRow adds a row's patch; rows of the internal clients table become
// lastMutationIDChanges (docs/protocol.md §8).
func (g *group) addRow(pc *pokeContent, rec *rowRecord) {
	if rec.table == g.s.clientsTable {
		if rec.refs == nil {
			return
		}
		if rec.value.IsZero() {
			return
		}
		cid, _ := rec.value.Get("clientID").(string)
		lmid, ok := rec.value.Get("lastMutationID").(float64)
		if cgid, _ := rec.value.Get("clientGroupID").(string); cid == "" || !ok || cgid != g.id {
			return
		}
		if pc.lmids == nil {
			pc.lmids = map[string]float64{}
		}
		pc.lmids[cid] = lmid
		return
	}
	if rec.table == g.s.mutationsTable {
		if p := g.mutationPatch(rec); p != nil {
			pc.mutations = append(pc.mutations, p)
		}
		return
	}
	if rec.refs == nil {
		pc.rows = append(pc.rows, rowPatch{Op: "del", TableName: rec.table, ID: json.RawMessage(rec.key)})
		return
	}
	pc.rows = append(pc.rows, rowPatch{Op: "put", TableName: rec.table, Value: rec.value})
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

// keyID is the identity of the row of table whose canonical key JSON is
// key, as rowID makes it.
func keyID(table string, key []byte) string {
	return table + "\x00" + string(key)
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
