package zql

import (
	"context"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Change is one changed replica row, with values in the replica's storage
// form (int64, float64, string or nil) by column name. Old is nil for an
// insert and New for a delete.
type Change struct {
	Table    string
	Old, New map[string]any
}

// Diff is what an Update changed in a view's result.
type Diff struct {
	// Put holds, in Values, the rows that joined the result or changed.
	Put *Result
	// Del holds, per table, the rows that left it, as they were.
	Del map[string][]RowValue
	// Rehydrated reports that the view re-ran its whole query.
	Rehydrated bool
	// RowsRead counts the rows read from the replica.
	RowsRead int
}

// View is a query's result kept up to date across replica snapshots.
//
// It keeps the root rows that pass (the window: the first limit of them in
// order, or all), and for each the rows it brings (its related rows and
// witnesses) and the lookups that decided them. A changed row maps to the
// root rows whose lookups it matches, to its own key when it is a root row,
// and, through EXISTS hops, to the root rows whose where it may flip. Only
// those are re-evaluated; a window that loses rows refills with one read
// from its last row on. Work is thus bounded by the changed rows, their
// parents and the window, not by table size.
//
// A View is not safe for concurrent use.
type View struct {
	q *Query
	// ready is false until a Hydrate succeeds, and after a failed Update:
	// the next Update then re-hydrates.
	ready bool
	win   []*entry
	byKey map[string]*entry
	// more is set when rows past the window's last may pass too.
	more    bool
	held    map[string]*held
	deps    map[string]map[*entry]struct{}
	scalars map[*existsCond]*resolved
	// scalarRows holds the companion rows of scalar subqueries.
	scalarRows *entry
	indexed    map[string]map[string]bool
	// each, while HydrateEach runs, gets every row as the view first
	// holds it; eachErr is its first error, which stops the hydration.
	each    func(RowValue) error
	eachErr error
	// coll is the collector eval reuses for each root row: hold copies
	// what an entry keeps out of it.
	coll *collector
}

// entry is a root row in the window and what it brings.
type entry struct {
	key  string
	r    *row
	rows []string // keys of held
	deps []string
}

// held is a row of the result, with how many entries bring it.
type held struct {
	t *table
	r *row
	n int
}

// collector gathers one root row's rows and lookups.
type collector struct {
	rows    []pending
	deps    []string
	rowSeen map[string]bool
	depSeen map[string]bool
}

type pending struct {
	hk string
	t  *table
	r  *row
}

// reset empties c for another root row. The deps slice goes to the
// entry that holds them (View.hold), so it is not reused.
func (c *collector) reset() {
	clear(c.rows)
	c.rows, c.deps = c.rows[:0], nil
	clear(c.rowSeen)
	clear(c.depSeen)
}

func (c *collector) add(t *table, key string, r *row) {
	hk := t.name + "\x00" + key
	if len(c.rows) > 0 {
		if len(c.rowSeen) == 0 {
			if c.rowSeen == nil {
				c.rowSeen = map[string]bool{}
			}
			c.rowSeen[c.rows[0].hk] = true
		}
		if c.rowSeen[hk] {
			return
		}
		c.rowSeen[hk] = true
	}
	c.rows = append(c.rows, pending{hk: hk, t: t, r: r})
}

func (c *collector) dep(n *node, key []any) {
	dk := depKey(n, key)
	if c.depSeen == nil {
		c.depSeen = map[string]bool{}
	}
	if !c.depSeen[dk] {
		c.depSeen[dk] = true
		c.deps = append(c.deps, dk)
	}
}

func depKey(n *node, key []any) string {
	return strconv.Itoa(n.id) + "\x00" + valuesKey(key)
}

// NewView returns an empty view of q; Hydrate fills it.
func (qu *Query) NewView() *View {
	return &View{q: qu}
}

func (v *View) reset() {
	v.ready, v.win, v.byKey, v.more = false, nil, map[string]*entry{}, false
	v.held, v.deps, v.scalars, v.scalarRows = map[string]*held{}, map[string]map[*entry]struct{}{}, nil, nil
}

func (v *View) hydration(ctx context.Context, q Querier) *hydration {
	h := newHydration(ctx, q)
	if v.indexed == nil {
		v.indexed = map[string]map[string]bool{}
	}
	h.indexed = v.indexed
	return h
}

// Hydrate evaluates the query from scratch on q and returns every row.
func (v *View) Hydrate(ctx context.Context, q Querier) (*Result, error) {
	n, err := v.HydrateEach(ctx, q, nil)
	if err != nil {
		return nil, err
	}
	res := v.Result()
	res.RowsRead = n
	return res, nil
}

// HydrateEach is Hydrate calling each with every row of the result, in
// Result's order, as the evaluation first brings it, instead of returning
// them: a caller can send rows while the query still runs. An error from
// each stops the hydration and is returned.
func (v *View) HydrateEach(ctx context.Context, q Querier, each func(RowValue) error) (rowsRead int, err error) {
	v.reset()
	v.each, v.eachErr = each, nil
	defer func() { v.each, v.eachErr = nil, nil }()
	h := v.hydration(ctx, q)
	if err := v.build(h, nil); err != nil {
		v.ready = false
		return h.rowsRead, err
	}
	if v.eachErr != nil {
		v.ready = false
		return h.rowsRead, v.eachErr
	}
	v.ready = true
	return h.rowsRead, nil
}

// Result returns every row the view holds, in Values: scalar companions
// first, then each root row's, in window order.
func (v *View) Result() *Result {
	res := &Result{Values: map[string][]RowValue{}}
	// A view whose root rows each bring only themselves, and no scalar
	// companions, holds each row once: it needs no dedup.
	dedup := v.scalarRows != nil && len(v.scalarRows.rows) > 0 || len(v.held) != len(v.win)
	for i := 0; i < len(v.win) && !dedup; i++ {
		dedup = len(v.win[i].rows) != 1
	}
	var seen map[string]bool
	if dedup {
		seen = make(map[string]bool, len(v.held))
	}
	emit := func(e *entry) {
		if e == nil {
			return
		}
		for _, hk := range e.rows {
			if dedup {
				if seen[hk] {
					continue
				}
				seen[hk] = true
			}
			hr := v.held[hk]
			res.Values[hr.t.name] = append(res.Values[hr.t.name], RowValue{hr.t, hr.r})
		}
	}
	emit(v.scalarRows)
	for _, e := range v.win {
		emit(e)
	}
	return res
}

func (t *table) clientRow(r *row) Row {
	out := make(Row, len(t.cols))
	for i, c := range t.cols {
		out[c.Name] = r.vals[i]
	}
	return out
}

// build evaluates the scalar subqueries and the window.
func (v *View) build(h *hydration, tr *tracker) error {
	if err := v.resolveScalars(h, tr); err != nil {
		return err
	}
	if v.eachErr != nil {
		return v.eachErr
	}
	n := v.q.root
	if n.limit == 0 || n.none {
		return nil
	}
	query := n.t.selectSQL
	if n.push != "" {
		query += " WHERE " + n.push
	}
	query += n.orderSQL
	return h.scan(n.t, query, n.pushArgs, func(r *row) (bool, error) {
		e, c, err := v.eval(h, r)
		if err != nil || e == nil {
			return err == nil, err
		}
		if err := v.emit(h, e, c); err != nil {
			return false, err
		}
		v.hold(e, c, tr)
		v.win = append(v.win, e)
		v.byKey[e.key] = e
		if v.eachErr != nil {
			return false, v.eachErr
		}
		if n.limit >= 0 && len(v.win) == n.limit {
			v.more = true
			return false, nil
		}
		return true, nil
	})
}

// resolveScalars evaluates the scalar subqueries and holds their rows. It
// reports whether any resolved differently from before.
func (v *View) resolveScalars(h *hydration, tr *tracker) error {
	c := &collector{}
	h.cur, h.emitted = c, nil // made when a node needs it: most rows never do
	for _, e := range v.q.scalars {
		if err := h.resolve(e); err != nil {
			return err
		}
	}
	h.cur = nil
	e := &entry{}
	v.hold(e, c, tr)
	v.scalarRows, v.scalars = e, h.scalar
	return nil
}

// eval decides whether root row r passes, collecting the lookups that
// decided it. It returns a nil entry when r does not pass.
func (v *View) eval(h *hydration, r *row) (*entry, *collector, error) {
	n := v.q.root
	if n.start != nil && !n.after(r) {
		return nil, nil, nil
	}
	c := v.coll
	if c == nil {
		c = &collector{}
		v.coll = c
	}
	c.reset()
	h.cur = c
	defer func() { h.cur = nil }()
	if n.where != nil {
		ok, err := n.where.eval(h, r)
		if err != nil || !ok {
			return nil, nil, err
		}
	}
	return &entry{key: rowKey(n.t.pk, r.vals), r: r}, c, nil
}

// emit collects what root row e brings.
func (v *View) emit(h *hydration, e *entry, c *collector) error {
	h.cur, h.emitted = c, nil // made when a node needs it: most rows never do
	defer func() { h.cur = nil }()
	return h.emit(v.q.root, e.r)
}

// hold makes e bring what c collected.
func (v *View) hold(e *entry, c *collector, tr *tracker) {
	e.rows = make([]string, len(c.rows))
	for i, p := range c.rows {
		e.rows[i] = p.hk
		hr := v.held[p.hk]
		if hr == nil {
			tr.touch(p.hk, nil)
			v.held[p.hk] = &held{t: p.t, r: p.r, n: 1}
			if v.each != nil && v.eachErr == nil {
				v.eachErr = v.each(RowValue{p.t, p.r})
			}
			continue
		}
		if hr.r != p.r && rowChanged(hr.r, p.r) {
			tr.touch(p.hk, hr)
			hr.r = p.r
		}
		hr.n++
	}
	e.deps = c.deps
	for _, dk := range c.deps {
		s := v.deps[dk]
		if s == nil {
			s = map[*entry]struct{}{}
			v.deps[dk] = s
		}
		s[e] = struct{}{}
	}
}

// release drops what e brings.
func (v *View) release(e *entry, tr *tracker) {
	for _, hk := range e.rows {
		hr := v.held[hk]
		if hr.n--; hr.n == 0 {
			tr.touch(hk, hr)
			delete(v.held, hk)
		}
	}
	for _, dk := range e.deps {
		if s := v.deps[dk]; s != nil {
			delete(s, e)
			if len(s) == 0 {
				delete(v.deps, dk)
			}
		}
	}
	e.rows, e.deps = nil, nil
}

func rowChanged(a, b *row) bool {
	return a.version != b.version || !reflect.DeepEqual(a.vals, b.vals)
}

// tracker remembers how each row it touches was before an update.
type tracker struct {
	before map[string]*row
	tables map[string]*table
	order  []string
}

func (tr *tracker) touch(hk string, hr *held) {
	if tr == nil {
		return
	}
	if _, ok := tr.before[hk]; ok {
		return
	}
	if tr.before == nil {
		tr.before, tr.tables = map[string]*row{}, map[string]*table{}
	}
	var r *row
	if hr != nil {
		r = hr.r
		tr.tables[hk] = hr.t
	}
	tr.before[hk] = r
	tr.order = append(tr.order, hk)
}

func (v *View) diff(tr *tracker, rowsRead int) *Diff {
	d := &Diff{Put: &Result{Values: map[string][]RowValue{}}, Del: map[string][]RowValue{}, RowsRead: rowsRead}
	for _, hk := range tr.order {
		was, now := tr.before[hk], v.held[hk]
		switch {
		case now != nil && (was == nil || rowChanged(was, now.r)):
			d.Put.Values[now.t.name] = append(d.Put.Values[now.t.name], RowValue{now.t, now.r})
		case now == nil && was != nil:
			t := tr.tables[hk]
			d.Del[t.name] = append(d.Del[t.name], RowValue{t, was})
		}
	}
	return d
}

// Update brings the view from the snapshot it last saw to q's, given every
// row that changed in between (a superset does no harm), and returns how
// its result changed. A view never hydrated, or whose last Update failed,
// re-hydrates.
func (v *View) Update(ctx context.Context, q Querier, changes []Change) (*Diff, error) {
	if !v.ready {
		return v.rehydrate(ctx, q, &tracker{})
	}
	v.ready = false // until this update completes
	h := v.hydration(ctx, q)
	h.scalar = v.scalars
	tr := &tracker{}
	n := v.q.root

	// touched lists the rows whose change may matter, in client form.
	type touchedRow struct {
		t    *table
		vals []any
	}
	var touched []touchedRow
	scalarsChanged := false
	for _, c := range changes {
		t := v.q.tables[c.Table]
		if t == nil {
			continue
		}
		scalarsChanged = scalarsChanged || v.q.scalarTables[c.Table]
		for _, m := range []map[string]any{c.Old, c.New} {
			if m == nil {
				continue
			}
			vals, ok := t.fromReplica(m)
			if !ok {
				return v.rehydrate(ctx, q, tr)
			}
			touched = append(touched, touchedRow{t, vals})
		}
	}
	if scalarsChanged {
		old, oldRows := v.scalars, v.scalarRows
		h.scalar = map[*existsCond]*resolved{}
		if err := v.resolveScalars(h, tr); err != nil {
			return nil, err
		}
		v.release(oldRows, tr)
		// A scalar subquery that resolves differently flips the condition
		// for the rows whose parent fields equal its old or new value: they
		// count as changed.
		for _, e := range v.q.scalars {
			for _, res := range []*resolved{old[e], v.scalars[e]} {
				if res == nil || !res.found || sameResolved(old[e], v.scalars[e]) {
					continue
				}
				rows, err := h.lookupRows(e.from.t, e.parent, res.vals)
				if err != nil {
					return nil, err
				}
				for _, r := range rows {
					touched = append(touched, touchedRow{e.from.t, r.vals})
				}
			}
		}
	}

	if n.none {
		v.ready = true // no row can enter: nothing to look up
		return v.diff(tr, h.rowsRead), nil
	}
	cands := map[string][]any{}
	addCand := func(vals []any) {
		if vals != nil {
			cands[rowKey(n.t.pk, vals)] = vals
		}
	}
	for _, c := range touched {
		if c.t.name == n.t.name {
			addCand(c.vals)
		}
		for _, nd := range v.q.byTable[c.t.name] {
			key := pick(c.vals, nd.via)
			if slices.Contains(key, nil) {
				continue
			}
			for e := range v.deps[depKey(nd, key)] {
				addCand(e.r.vals)
			}
		}
		for _, ch := range v.q.chains[c.t.name] {
			roots, err := h.chainRoots(ch, c.vals)
			if err != nil {
				return nil, err
			}
			for _, r := range roots {
				addCand(r)
			}
		}
	}
	if n.limit == 0 || len(cands) == 0 {
		v.ready = true
		return v.diff(tr, h.rowsRead), nil
	}

	keys := make([]string, 0, len(cands))
	for k := range cands {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	hadMore := v.more
	var bound *row
	if len(v.win) > 0 {
		bound = v.win[len(v.win)-1].r
	}
	for _, k := range keys {
		if e := v.byKey[k]; e != nil {
			v.release(e, tr)
			v.remove(e)
		}
	}
	for _, k := range keys {
		r, err := h.byKey(n.t, cands[k])
		if err != nil {
			return nil, err
		}
		if r == nil || hadMore && v.compare(r, bound) > 0 {
			continue // gone, or past the window, where a refill finds it
		}
		e, c, err := v.eval(h, r)
		if err != nil {
			return nil, err
		}
		if e == nil {
			continue
		}
		if err := v.emit(h, e, c); err != nil {
			return nil, err
		}
		v.hold(e, c, tr)
		v.insert(e)
	}
	switch {
	case n.limit >= 0 && len(v.win) > n.limit:
		for _, e := range v.win[n.limit:] {
			v.release(e, tr)
			delete(v.byKey, e.key)
		}
		clear(v.win[n.limit:])
		v.win, v.more = v.win[:n.limit], true
	case n.limit >= 0 && len(v.win) < n.limit && hadMore:
		if err := v.refill(h, bound, tr); err != nil {
			return nil, err
		}
	}
	v.ready = true
	return v.diff(tr, h.rowsRead), nil
}

func sameResolved(a, b *resolved) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.found == b.found && reflect.DeepEqual(a.vals, b.vals)
}

// rehydrate re-runs the whole query, as a diff against what the view held
// before tr's first touch.
func (v *View) rehydrate(ctx context.Context, q Querier, tr *tracker) (*Diff, error) {
	for _, e := range v.win {
		v.release(e, tr)
	}
	if v.scalarRows != nil {
		v.release(v.scalarRows, tr)
	}
	held := v.held
	v.reset()
	for hk, hr := range held { // only if a failed update left some
		tr.touch(hk, hr)
	}
	h := v.hydration(ctx, q)
	if err := v.build(h, tr); err != nil {
		return nil, err
	}
	v.ready = true
	d := v.diff(tr, h.rowsRead)
	d.Rehydrated = true
	return d, nil
}

// refill reads rows past bound, the window's last row before the update,
// until the window is full again.
func (v *View) refill(h *hydration, bound *row, tr *tracker) error {
	n := v.q.root
	seek, args := n.seek(bound.vals)
	query := n.t.selectSQL + " WHERE "
	if n.push != "" {
		query += n.push + " AND "
		args = append(slices.Clone(n.pushArgs), args...)
	}
	query += seek + n.orderSQL
	v.more = false
	return h.scan(n.t, query, args, func(r *row) (bool, error) {
		if v.compare(r, bound) <= 0 {
			return true, nil
		}
		e, c, err := v.eval(h, r)
		if err != nil || e == nil {
			return err == nil, err
		}
		if v.byKey[e.key] != nil {
			return true, nil
		}
		if err := v.emit(h, e, c); err != nil {
			return false, err
		}
		v.hold(e, c, tr)
		v.win = append(v.win, e)
		v.byKey[e.key] = e
		if len(v.win) >= n.limit {
			v.more = true
			return false, nil
		}
		return true, nil
	})
}

// compare orders root rows as the query does.
func (v *View) compare(a, b *row) int {
	for _, o := range v.q.root.order {
		c := compareValues(a.vals[o.col], b.vals[o.col])
		if o.desc {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	return 0
}

func (v *View) insert(e *entry) {
	i := sort.Search(len(v.win), func(i int) bool { return v.compare(v.win[i].r, e.r) > 0 })
	v.win = slices.Insert(v.win, i, e)
	v.byKey[e.key] = e
}

func (v *View) remove(e *entry) {
	delete(v.byKey, e.key)
	i := sort.Search(len(v.win), func(i int) bool { return v.compare(v.win[i].r, e.r) >= 0 })
	for ; i < len(v.win); i++ {
		if v.win[i] == e {
			v.win = slices.Delete(v.win, i, i+1)
			return
		}
	}
	// Not where its order says: find it the slow way.
	if i := slices.Index(v.win, e); i >= 0 {
		v.win = slices.Delete(v.win, i, i+1)
	}
}

// seek returns a condition that holds for rows after b in n's order (nulls
// first ascending, last descending), led by a range on the first column
// that an index can serve.
func (n *node) seek(b []any) (string, []any) {
	var ors, eq []string
	var args, eqArgs []any
	for _, o := range n.order {
		q := quoteIdent(n.t.cols[o.col].Name)
		v := b[o.col]
		var gt string
		var gtArgs []any
		switch {
		case v == nil && !o.desc:
			gt = q + " IS NOT NULL"
		case v == nil:
			// Nothing sorts after null descending.
		case !o.desc:
			gt, gtArgs = q+" > ?", []any{sqlKey(v)}
		default:
			gt, gtArgs = "("+q+" < ? OR "+q+" IS NULL)", []any{sqlKey(v)}
		}
		if gt != "" {
			ors = append(ors, "("+strings.Join(append(slices.Clone(eq), gt), " AND ")+")")
			args = append(append(args, eqArgs...), gtArgs...)
		}
		if v == nil {
			eq = append(eq, q+" IS NULL")
		} else {
			eq, eqArgs = append(eq, q+" = ?"), append(eqArgs, sqlKey(v))
		}
	}
	if len(ors) == 0 {
		return "0", nil
	}
	s := "(" + strings.Join(ors, " OR ") + ")"
	if o := n.order[0]; b[o.col] != nil && !o.desc {
		s = quoteIdent(n.t.cols[o.col].Name) + " >= ? AND " + s
		args = append([]any{sqlKey(b[o.col])}, args...)
	}
	return s, args
}

// fromReplica converts a changed row's values to client form.
func (t *table) fromReplica(m map[string]any) ([]any, bool) {
	vals := make([]any, len(t.cols))
	for i, c := range t.cols {
		v, err := clientValue(c.Kind, m[c.Name])
		if err != nil {
			return nil, false
		}
		vals[i] = v
	}
	return vals, true
}

// byKey reads t's row whose primary key is that of vals, or nil.
func (h *hydration) byKey(t *table, vals []any) (*row, error) {
	rows, err := h.lookupRows(t, t.pk, pick(vals, t.pk))
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return rows[0], nil
}

// lookupRows reads the rows of t whose cols equal key, strictly.
func (h *hydration) lookupRows(t *table, cols []int, key []any) ([]*row, error) {
	if slices.Contains(key, nil) {
		return nil, nil
	}
	var b strings.Builder
	b.WriteString(t.selectSQL + " WHERE ")
	args := make([]any, len(cols))
	for i, c := range cols {
		if i > 0 {
			b.WriteString(" AND ")
		}
		b.WriteString(quoteIdent(t.cols[c].Name) + " = ?")
		args[i] = sqlKey(key[i])
	}
	var out []*row
	err := h.scan(t, b.String(), args, func(r *row) (bool, error) {
		for i, c := range cols {
			if !valuesEqual(r.vals[c], key[i]) {
				return true, nil
			}
		}
		out = append(out, r)
		return true, nil
	})
	return out, err
}

// chainRoots returns the root rows that reach a row with values vals
// through ch's EXISTS hops: those whose where that row may flip.
func (h *hydration) chainRoots(ch chain, vals []any) ([][]any, error) {
	level := [][]any{vals}
	for i := len(ch.path) - 1; i >= 0 && len(level) > 0; i-- {
		e, parent := ch.path[i], ch.from[i].t
		next := map[string][]any{}
		for _, cv := range level {
			rows, err := h.lookupRows(parent, e.parent, pick(cv, e.child))
			if err != nil {
				return nil, err
			}
			for _, r := range rows {
				next[rowKey(parent.pk, r.vals)] = r.vals
			}
		}
		level = level[:0]
		for _, pv := range next {
			level = append(level, pv)
		}
	}
	return level, nil
}
