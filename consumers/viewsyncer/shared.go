package viewsyncer

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"runtime"
	"sync"
	"weak"

	"github.com/jetsync/jetsync/consumers/zql"
)

// Client groups that run the same query see the same rows: the bench's
// 200 groups each had their own view of "open issues by modified", and an
// advance updated 200 identical views from the same changed rows, which
// was half of its CPU. Pipelines whose compiled query is the same (the
// same schema and the same AST as run, rules and claims applied) share one
// view: the first group an advance reaches updates it, and the others
// take its diff. A view's result at a replica version is the query's
// result there, so a pipeline at the version the shared view moved from
// can take the diff, whatever its own view's history.
//
// A pipeline follows the shared view only in step with it (pipeline.at);
// one left behind (its group skipped an advance, or hydrated on its own)
// goes back to a view of its own and re-hydrates. Hydration is never
// shared: it resets a view.

// viewKey identifies a compiled query: a SHA-256 of its AST, which a
// client cannot make collide with another group's, on one schema.
type viewKey struct {
	schema *schema
	ast    [sha256.Size]byte
}

func keyOf(sch *schema, ast *zql.AST) (viewKey, bool) {
	b, err := json.Marshal(ast)
	if err != nil {
		return viewKey{}, false
	}
	return viewKey{schema: sch, ast: sha256.Sum256(b)}, true
}

// sharedViews finds a query's shared view. It holds them weakly: a view
// goes once no pipeline holds it.
type sharedViews struct {
	mu sync.Mutex
	m  map[viewKey]weak.Pointer[sharedView]
}

func (sv *sharedViews) get(k viewKey) *sharedView {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if v := sv.m[k].Value(); v != nil {
		return v
	}
	if sv.m == nil {
		sv.m = map[viewKey]weak.Pointer[sharedView]{}
	}
	v := &sharedView{}
	wp := weak.Make(v)
	sv.m[k] = wp
	runtime.AddCleanup(v, func(k viewKey) {
		sv.mu.Lock()
		defer sv.mu.Unlock()
		if sv.m[k] == wp {
			delete(sv.m, k)
		}
	}, k)
	return v
}

// sharedView is one view that pipelines of several groups follow.
type sharedView struct {
	mu sync.Mutex
	// view is nil until a pipeline lends its own, and after a failed
	// update.
	view *zql.View
	// at is the replica version view reflects; diff took it there from
	// from.
	at, from string
	diff     *zql.Diff
}

// emptyDiff is the diff of a view no change touched.
func emptyDiff() *zql.Diff {
	return &zql.Diff{Put: &zql.Result{Values: map[string][]zql.RowValue{}}, Del: map[string][]zql.RowValue{}}
}

// detach gives p, out of step with its shared view, a view of its own,
// which it must hydrate.
func (p *pipeline) detach() {
	p.shared, p.view, p.at, p.rehydrate = nil, p.query.NewView(), "", true
}

// sharedUpdate moves p from snap.from to snap.version through its query's
// shared view. ok is false when p cannot follow it: p then updates its
// own view, or re-hydrates if it left the shared one (p.rehydrate).
func (g *group) sharedUpdate(ctx context.Context, snap *snapshot, p *pipeline, changes []zql.Change) (d *zql.Diff, ok bool, err error) {
	if !p.shareable {
		return nil, false, nil
	}
	if p.at != snap.from || snap.from == snap.version {
		// Never update a shared view outside an advance's step.
		if p.shared != nil {
			p.detach()
		}
		return nil, false, nil
	}
	sv := p.shared
	if sv == nil {
		sv = g.s.views.get(p.key)
	}
	sv.mu.Lock()
	defer sv.mu.Unlock()
	switch {
	case sv.view != nil && sv.at == snap.version && sv.from == snap.from && sv.diff != nil:
		// Another group got there first.
		d = sv.diff
	case sv.view != nil && sv.at == snap.from:
		if d, err = sv.view.Update(ctx, snap.querier(), changes); err != nil {
			sv.view, sv.at, sv.diff = nil, "", nil
			p.detach()
			return nil, true, err
		}
		sv.from, sv.at, sv.diff = snap.from, snap.version, d
	case sv.view == nil && p.shared == nil:
		// The first in step lends its view.
		if d, err = p.view.Update(ctx, snap.querier(), changes); err != nil {
			return nil, true, err
		}
		sv.view, sv.from, sv.at, sv.diff = p.view, snap.from, snap.version, d
	default:
		if p.shared == sv {
			p.detach()
		}
		return nil, false, nil
	}
	// A pipeline that joins drops its own view: at snap.from it held the
	// same result.
	p.shared, p.view, p.at = sv, sv.view, snap.version
	return d, true, nil
}

// pass moves p, which no change touched, from snap.from to snap.version,
// and its shared view with it; a pipeline that cannot stay in step leaves
// it, to re-hydrate at its next sync.
func (p *pipeline) pass(snap *snapshot) {
	if snap.from == snap.version || p.at == snap.version {
		return // a sync with no changes to take, or passed already (passQuiet)
	}
	sv := p.shared
	if p.at != snap.from {
		if sv != nil {
			p.detach()
		}
		return
	}
	if sv == nil {
		p.at = snap.version
		return
	}
	sv.mu.Lock()
	defer sv.mu.Unlock()
	switch {
	case sv.view != nil && sv.at == snap.version && sv.from == snap.from:
	case sv.view != nil && sv.at == snap.from:
		sv.from, sv.at, sv.diff = snap.from, snap.version, emptyDiff()
	default:
		p.detach()
		return
	}
	p.at = snap.version
}
