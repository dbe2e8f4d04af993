package zql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Querier reads the replica. It must allow a query while the rows of
// another are still open, as a *sql.Tx or *sql.Conn does (a *sql.DB only
// with more than one connection). Use a read transaction, so that every
// lookup of one hydration sees the same snapshot.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Row is a row in client form: strings, float64 numbers, bools, nil, and
// json.RawMessage for json columns. It has every column of its table's
// schema and no _0_version.
type Row map[string]any

// Result is the set of rows a query syncs: in Rows and Versions from
// Query.Hydrate, in Values from a View.
type Result struct {
	// Rows holds them per table, each primary key once.
	Rows map[string][]Row
	// Versions holds each row's _0_version, parallel to Rows.
	Versions map[string][]string
	// Values holds a View's rows per table, each primary key once.
	Values map[string][]RowValue
	// RowsRead counts the rows read from the replica to compute it.
	RowsRead int
}

// Len is the number of rows over all tables.
func (r *Result) Len() int {
	n := 0
	for _, rows := range r.Rows {
		n += len(rows)
	}
	for _, rows := range r.Values {
		n += len(rows)
	}
	return n
}

// Hydrate compiles ast against s and evaluates it on q.
func Hydrate(ctx context.Context, q Querier, s Schema, ast *AST) (*Result, error) {
	query, err := Compile(s, ast)
	if err != nil {
		return nil, err
	}
	return query.Hydrate(ctx, q)
}

// Hydrate evaluates the query on q and returns every row to sync.
func (qu *Query) Hydrate(ctx context.Context, q Querier) (*Result, error) {
	h := newHydration(ctx, q)
	for _, e := range qu.scalars {
		if err := h.resolve(e); err != nil {
			return nil, err
		}
	}
	if err := h.root(qu.root); err != nil {
		return nil, err
	}
	h.res.RowsRead = h.rowsRead
	return h.res, nil
}

func newHydration(ctx context.Context, q Querier) *hydration {
	return &hydration{
		ctx:     ctx,
		q:       q,
		lookups: map[*node]*lookup{},
		scalar:  map[*existsCond]*resolved{},
		emitted: map[*node]map[string]bool{},
		at:      map[string]map[string]int{},
		indexed: map[string]map[string]bool{},
		res:     &Result{Rows: map[string][]Row{}, Versions: map[string][]string{}},
	}
}

// bulkAfter is how many keys a hop looks up one by one, on a column no
// index leads with, before it loads the whole (pre-filtered) table once.
const bulkAfter = 8

// hydration is the state of one evaluation. Nothing of it outlives it.
type hydration struct {
	ctx     context.Context
	q       Querier
	lookups map[*node]*lookup
	scalar  map[*existsCond]*resolved
	// emitted records which rows each node has synced, with their hops.
	emitted map[*node]map[string]bool
	// at maps table and primary key to the row's position in res.
	at      map[string]map[string]int
	indexed map[string]map[string]bool
	res     *Result
	// cur, when set, collects what is emitted and looked up instead of res:
	// a View keeps each root row's share of the result apart.
	cur      *collector
	rowsRead int
}

type row struct {
	vals    []any
	version string
}

// lookup memoizes a hop's children per correlation key.
type lookup struct {
	byKey map[string][]*row
	// bulk is set once every key is loaded.
	bulk    bool
	fetches int
}

// resolved is a scalar subquery evaluated before execution.
type resolved struct {
	found bool
	vals  []any // the companion row's correlated columns
}

func (h *hydration) root(n *node) error {
	if n.limit == 0 || n.none {
		return nil
	}
	query := n.t.selectSQL
	if n.push != "" {
		query += " WHERE " + n.push
	}
	query += n.orderSQL
	taken := 0
	return h.scan(n.t, query, n.pushArgs, func(r *row) (bool, error) {
		if n.start != nil && !n.after(r) {
			return true, nil
		}
		if n.where != nil {
			ok, err := n.where.eval(h, r)
			if err != nil || !ok {
				return err == nil, err
			}
		}
		if err := h.emit(n, r); err != nil {
			return false, err
		}
		taken++
		return n.limit < 0 || taken < n.limit, nil
	})
}

// after reports whether r is past n's start cursor.
func (n *node) after(r *row) bool {
	for i, o := range n.order {
		c := compareValues(r.vals[o.col], n.start.vals[i])
		if o.desc {
			c = -c
		}
		if c != 0 {
			return c > 0
		}
	}
	return !n.start.exclusive
}

// emit syncs r as a row of n, then its witnesses and related rows.
func (h *hydration) emit(n *node, r *row) error {
	if n.private {
		return nil
	}
	key := rowKey(n.t.pk, r.vals)
	if len(n.exists) == 0 && len(n.related) == 0 {
		h.add(n.t, key, r) // a leaf: add deduplicates on its own
		return nil
	}
	seen := h.emitted[n]
	if seen == nil {
		seen = map[string]bool{}
		if h.emitted == nil {
			h.emitted = map[*node]map[string]bool{}
		}
		h.emitted[n] = seen
	}
	if seen[key] {
		return nil
	}
	seen[key] = true
	h.add(n.t, key, r)
	var via []*existsCond
	if n.flips {
		var err error
		if via, _, err = h.viaFlips(n.where, r, nil); err != nil {
			return err
		}
	}
	for _, e := range n.exists {
		if e.flipped() && !slices.Contains(via, e) {
			continue
		}
		if err := h.witness(e, r); err != nil {
			return err
		}
	}
	for _, rel := range n.related {
		kids, err := h.children(rel.node, rel.child, pick(r.vals, rel.parent))
		if err != nil {
			return err
		}
		taken := 0
		for _, k := range kids {
			if rel.node.limit >= 0 && taken >= rel.node.limit {
				break
			}
			if rel.node.start != nil && !rel.node.after(k) {
				continue
			}
			taken++
			if err := h.emit(rel.node, k); err != nil {
				return err
			}
		}
	}
	return nil
}

// witness syncs the children of r that witness e. For an EXISTS not
// flipped, that is whatever e evaluated to: zero's join fetches them for
// every row it outputs, even one that passed through another branch of an
// or, or a NOT EXISTS with limit 0. A flipped one brings every matching
// child, but only for rows that pass by it (see viaFlips).
func (h *hydration) witness(e *existsCond, r *row) error {
	if e.never || e.node.private {
		return nil
	}
	if _, ok := h.scalar[e]; ok {
		return nil // the companion row is synced already
	}
	kids, err := h.children(e.node, e.child, pick(r.vals, e.parent))
	if err != nil {
		return err
	}
	if !e.flip && len(kids) > existsLimit {
		kids = kids[:existsLimit]
	}
	for _, k := range kids {
		if err := h.emit(e.node, k); err != nil {
			return err
		}
	}
	return nil
}

func (e *existsCond) eval(h *hydration, r *row) (bool, error) {
	// A resolved scalar subquery is a comparison with its row's values:
	// parentField = value, or IS NOT value for NOT EXISTS.
	if res, ok := h.scalar[e]; ok {
		match := res.found
		for i, p := range e.parent {
			match = match && valuesEqual(r.vals[p], res.vals[i])
		}
		return match != e.not, nil
	}
	if e.never {
		return false, nil
	}
	if e.node.limit == 0 {
		return e.not, nil
	}
	kids, err := h.children(e.node, e.child, pick(r.vals, e.parent))
	if err != nil {
		return false, err
	}
	return (len(kids) > 0) != e.not, nil
}

// resolve evaluates a scalar subquery once, by its pinned primary key, and
// syncs its row as a companion.
func (h *hydration) resolve(e *existsCond) error {
	n := e.node
	var parts []string
	var args []any
	res := &resolved{}
	h.scalar[e] = res
	if n.none {
		return nil
	}
	for i, c := range n.t.pk {
		a := sqlArg(n.t.cols[c].Kind, e.pin[i])
		if a == nil {
			return nil // a key of the wrong type matches nothing
		}
		parts, args = append(parts, quoteIdent(n.t.cols[c].Name)+" = ?"), append(args, a)
	}
	query := n.t.selectSQL + " WHERE " + strings.Join(parts, " AND ")
	var found *row
	err := h.scan(n.t, query, args, func(r *row) (bool, error) {
		for i, c := range n.t.pk {
			if !valuesEqual(r.vals[c], e.pin[i]) {
				return true, nil
			}
		}
		if n.where != nil {
			ok, err := n.where.eval(h, r)
			if err != nil || !ok {
				return err == nil, err
			}
		}
		found = r
		return false, nil
	})
	if err != nil || found == nil {
		return err
	}
	res.found, res.vals = true, pick(found.vals, e.child)
	return h.emit(n, found)
}

// children returns n's rows whose child columns equal key and that pass
// n's where, in n's order. A null in key joins nothing.
func (h *hydration) children(n *node, child []int, key []any) ([]*row, error) {
	for _, v := range key {
		if v == nil {
			return nil, nil
		}
	}
	if h.cur != nil {
		h.cur.dep(n, key)
	}
	lk := h.lookups[n]
	if lk == nil {
		lk = &lookup{byKey: map[string][]*row{}}
		h.lookups[n] = lk
	}
	k := valuesKey(key)
	if rows, ok := lk.byKey[k]; ok || lk.bulk || n.none {
		return rows, nil
	}
	indexed, err := h.isIndexed(n.t, child)
	if err != nil {
		return nil, err
	}
	if !indexed && lk.fetches >= bulkAfter {
		if err := h.loadAll(n, child, lk); err != nil {
			return nil, err
		}
		return lk.byKey[k], nil
	}
	lk.fetches++
	var b strings.Builder
	b.WriteString(n.t.selectSQL + " WHERE ")
	args := make([]any, 0, len(key)+len(n.pushArgs))
	for i, c := range child {
		if i > 0 {
			b.WriteString(" AND ")
		}
		b.WriteString(quoteIdent(n.t.cols[c].Name) + " = ?")
		args = append(args, sqlKey(key[i]))
	}
	if n.push != "" {
		b.WriteString(" AND " + n.push)
		args = append(args, n.pushArgs...)
	}
	b.WriteString(n.orderSQL)
	var rows []*row
	if n.full(rows) {
		lk.byKey[k] = rows
		return rows, nil
	}
	err = h.scan(n.t, b.String(), args, func(r *row) (bool, error) {
		// SQLite's affinities may coerce the key: keep strict matches.
		for i, c := range child {
			if !valuesEqual(r.vals[c], key[i]) {
				return true, nil
			}
		}
		if !n.keeps(r) {
			return true, nil
		}
		if n.where != nil {
			ok, err := n.where.eval(h, r)
			if err != nil || !ok {
				return err == nil, err
			}
		}
		rows = append(rows, r)
		return !n.full(rows), nil
	})
	if err != nil {
		return nil, err
	}
	lk.byKey[k] = rows
	return rows, nil
}

// keeps reports whether a lookup of n keeps r as far as n's start goes.
func (n *node) keeps(r *row) bool {
	return !n.relation || n.start == nil || n.after(r)
}

// full reports whether a lookup of n holding rows needs no more.
func (n *node) full(rows []*row) bool {
	return n.relation && n.limit >= 0 && len(rows) >= n.limit
}

// loadAll reads every row of n's table that passes n's where, grouped by
// the child columns.
func (h *hydration) loadAll(n *node, child []int, lk *lookup) error {
	query := n.t.selectSQL
	if n.push != "" {
		query += " WHERE " + n.push
	}
	query += n.orderSQL
	byKey := map[string][]*row{}
	key := make([]any, len(child))
	err := h.scan(n.t, query, n.pushArgs, func(r *row) (bool, error) {
		for i, c := range child {
			if key[i] = r.vals[c]; key[i] == nil {
				return true, nil
			}
		}
		if !n.keeps(r) {
			return true, nil
		}
		k := valuesKey(key)
		if n.full(byKey[k]) {
			return true, nil
		}
		if n.where != nil {
			ok, err := n.where.eval(h, r)
			if err != nil || !ok {
				return err == nil, err
			}
		}
		byKey[k] = append(byKey[k], r)
		return true, nil
	})
	if err != nil {
		return err
	}
	lk.byKey, lk.bulk = byKey, true
	return nil
}

// isIndexed reports whether an index of t leads with one of cols.
func (h *hydration) isIndexed(t *table, cols []int) (bool, error) {
	lead, ok := h.indexed[t.name]
	if !ok {
		lead = map[string]bool{}
		rows, err := h.q.QueryContext(h.ctx,
			`SELECT ii.name FROM pragma_index_list(?) AS il, pragma_index_info(il.name) AS ii WHERE ii.seqno = 0`, t.name)
		if err != nil {
			return false, fmt.Errorf("list indexes of %s: %w", t.name, err)
		}
		defer rows.Close()
		for rows.Next() {
			var name sql.NullString
			if err := rows.Scan(&name); err != nil {
				return false, fmt.Errorf("list indexes of %s: %w", t.name, err)
			}
			lead[name.String] = true
		}
		if err := rows.Err(); err != nil {
			return false, fmt.Errorf("list indexes of %s: %w", t.name, err)
		}
		h.indexed[t.name] = lead
	}
	for _, c := range cols {
		if lead[t.cols[c].Name] {
			return true, nil
		}
	}
	return false, nil
}

// scan runs query and calls fn for each row until fn returns false.
func (h *hydration) scan(t *table, query string, args []any, fn func(*row) (bool, error)) error {
	rows, err := h.q.QueryContext(h.ctx, query, args...)
	if err != nil {
		return fmt.Errorf("query %s: %w", t.name, err)
	}
	defer rows.Close()
	n := len(t.cols)
	raw := make([]any, n+1)
	ptrs := make([]any, n+1)
	for i := range raw {
		ptrs[i] = &raw[i]
	}
	for rows.Next() {
		h.rowsRead++
		if err := rows.Scan(ptrs...); err != nil {
			return fmt.Errorf("scan %s: %w", t.name, err)
		}
		r := &row{vals: make([]any, n)}
		for i, c := range t.cols {
			v, err := clientValue(c.Kind, raw[i])
			if err != nil {
				return fmt.Errorf("scan %s.%s: %w", t.name, c.Name, err)
			}
			r.vals[i] = v
		}
		switch v := raw[n].(type) {
		case string:
			r.version = v
		case []byte:
			r.version = string(v)
		}
		more, err := fn(r)
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("query %s: %w", t.name, err)
	}
	return nil
}

// clientValue turns what the driver returns for a replica value into the
// client form for a column of kind k.
func clientValue(k Kind, v any) (any, error) {
	if b, ok := v.([]byte); ok {
		v = string(b)
	}
	switch x := v.(type) {
	case nil:
		return nil, nil
	case int64:
		switch k {
		case KindNumber:
			return float64(x), nil
		case KindBoolean:
			return x != 0, nil
		case KindJSON:
			return json.RawMessage(strconv.FormatInt(x, 10)), nil
		}
	case float64:
		switch k {
		case KindNumber:
			return v, nil // as boxed already: re-boxing allocates
		case KindBoolean:
			return x != 0, nil
		}
	case bool:
		switch k {
		case KindBoolean:
			return x, nil
		case KindNumber:
			return b2f(x), nil
		}
	case string:
		switch k {
		case KindString:
			return v, nil
		case KindJSON:
			return json.RawMessage(x), nil
		}
	}
	return nil, fmt.Errorf("%T value %v in a %s column", v, v, k)
}

// sqlKey converts a join value to what SQLite stores.
func sqlKey(v any) any {
	switch x := v.(type) {
	case bool:
		if x {
			return int64(1)
		}
		return int64(0)
	case json.RawMessage:
		return string(x)
	}
	return v
}

func (h *hydration) add(t *table, key string, r *row) {
	if h.cur != nil {
		h.cur.add(t, key, r)
		return
	}
	at := h.at[t.name]
	if at == nil {
		at = map[string]int{}
		h.at[t.name] = at
	}
	if _, ok := at[key]; ok {
		return
	}
	at[key] = len(h.res.Rows[t.name])
	out := make(Row, len(t.cols))
	for i, c := range t.cols {
		out[c.Name] = r.vals[i]
	}
	h.res.Rows[t.name] = append(h.res.Rows[t.name], out)
	h.res.Versions[t.name] = append(h.res.Versions[t.name], r.version)
}

func pick(vals []any, cols []int) []any {
	out := make([]any, len(cols))
	for i, c := range cols {
		out[i] = vals[c]
	}
	return out
}

func rowKey(cols []int, vals []any) string {
	if len(cols) == 1 {
		if s, ok := vals[cols[0]].(string); ok && (s == "" || s[0] != 0) {
			return s
		}
	}
	return valuesKey(pick(vals, cols))
}

// valuesKey encodes values, type included, as a map key.
func valuesKey(vals []any) string {
	// A lone string is the common key: it stands for itself unless it could
	// be mistaken for an encoding below.
	if len(vals) == 1 {
		if s, ok := vals[0].(string); ok && (s == "" || s[0] != 0) {
			return s
		}
	}
	var b strings.Builder
	for _, v := range vals {
		switch x := v.(type) {
		case string:
			b.WriteString("\x00s" + strconv.Itoa(len(x)) + ":" + x)
		case float64:
			b.WriteString("\x00n" + strconv.FormatFloat(x, 'g', -1, 64))
		case bool:
			b.WriteString("\x00b" + strconv.FormatBool(x))
		case json.RawMessage:
			b.WriteString("\x00j" + strconv.Itoa(len(x)) + ":" + string(x))
		default:
			b.WriteString("\x00z")
		}
	}
	return b.String()
}
