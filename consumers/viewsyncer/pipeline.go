package viewsyncer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/consumers/zql/permissions"
)

// A pipeline is one got query's evaluation: compiled for a snapshot's
// schema and read rules, hydrated, then kept up to date from the replica's
// changed rows, moving the CVR's row references with its result.

// lmidsQuery is the hash of the internal query for the group's rows of
// <app>_<shard>.clients, which become lastMutationIDChanges.
const lmidsQuery = "lmids"

// mutationsQuery is the hash of the internal query for the group's rows of
// <app>_<shard>.mutations, which become mutationsPatch.
const mutationsQuery = "mutationResults"

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
	// rows holds the IDs of the rows the query syncs.
	rows map[string]struct{}
	// key names the compiled query, for sharing its view with other
	// groups' pipelines (shared.go) when shareable; shared is the view
	// followed, nil while view is p's own. at is the replica version the
	// view's result is at ("" unknown); rehydrate is set once p left a
	// shared view it fell out of step with.
	key       viewKey
	shareable bool
	shared    *sharedView
	at        string
	rehydrate bool
}

// changeSet is what the replica changed between two snapshots.
type changeSet struct {
	rows []zql.Change
	// affects is rows prepared once for the many pipelines' affected.
	affectsOnce sync.Once
	affects     *zql.Changes
}

func (cs *changeSet) add(rcs []replicator.RowChange) {
	for _, rc := range rcs {
		cs.rows = append(cs.rows, zql.Change{Table: rc.Table, Old: rc.Old, New: rc.New})
	}
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
	p.query, p.view, p.schema = q, q.NewView(), snap.schema
	p.shared, p.at = nil, ""
	p.key, p.shareable = keyOf(snap.schema, ast)
	p.shareable = p.shareable && !p.internal
	return true, nil
}

func (g *group) removePipeline(u *update, p *pipeline) {
	g.dropped(len(p.rows))
	p.shared = nil
	for id := range p.rows {
		u.Release(id, p.hash)
	}
	delete(g.pipelines, p.hash)
	delete(g.timings, p.hash)
	u.Unget(p.hash)
}

// hydrate evaluates p on snap and moves the CVR's references to its new
// result.
// Rows are taken, and streamed, as the evaluation brings them.
func (g *group) hydrate(ctx context.Context, u *update, snap *snapshot, p *pipeline) error {
	done, err := g.s.hydrationTurn(ctx, u.start)
	if err != nil {
		return err
	}
	defer done()
	if p.shared != nil {
		// Hydrating resets a view: never a shared one.
		p.shared, p.view = nil, p.query.NewView()
	}
	p.at = ""
	now := make(map[string]struct{}, len(p.rows))
	start := time.Now()
	rowsRead, err := p.view.HydrateEach(ctx, snap.querier(), func(r zql.RowValue) error {
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
	if !p.internal {
		took := time.Since(start)
		g.timeHydration(p.hash, took)
		g.s.metrics.hydrationTime.Observe(took.Seconds())
	}
	g.s.metrics.hydrations.Inc()
	g.s.metrics.rowsRead.Add(float64(rowsRead))
	for id := range p.rows {
		if _, ok := now[id]; !ok {
			u.Release(id, p.hash)
		}
	}
	p.rows, p.at, p.rehydrate = now, snap.version, false
	return nil
}

// update moves p's view to snap, given the rows changed since its last
// snapshot, and the CVR's references with it.
func (g *group) update(ctx context.Context, u *update, snap *snapshot, p *pipeline, changes []zql.Change) error {
	start := time.Now()
	d, shared, err := g.sharedUpdate(ctx, snap, p, changes)
	if err == nil && !shared {
		if p.rehydrate {
			return g.hydrate(ctx, u, snap, p)
		}
		if d, err = p.view.Update(ctx, snap.querier(), changes); err == nil {
			p.at = snap.version
		}
	}
	if err != nil {
		return fmt.Errorf("update %s: %w", p.hash, err)
	}
	if !p.internal {
		g.timeUpdate(p.hash, time.Since(start))
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

// affected reports whether changed may change p's rows (zql's Affects:
// it reads a changed table, and the changed rows may matter to it).
func (p *pipeline) affected(changed *changeSet) bool {
	changed.affectsOnce.Do(func() { changed.affects = zql.NewChanges(changed.rows) })
	return p.query.Affects(changed.affects)
}
