package zql

import (
	"encoding/json"
	"fmt"
	"strings"
)

// existsLimit caps the witnesses per parent row of a join the planner has
// not flipped (docs/query-ast.md §4.3). zero caps permissions subqueries at 1,
// but their rows are never synced, so that cap changes nothing here.
const existsLimit = 3

// Query is a compiled AST, bound to a schema. It is immutable, so one Query
// can hydrate any number of times, concurrently.
type Query struct {
	root *node
	// scalars lists the scalar subqueries to resolve before execution, inner
	// ones first.
	scalars []*existsCond

	// What a View needs to map a changed row to the root rows it affects.
	// byTable lists the non-root nodes of each table; chains the nodes
	// reached from the root through EXISTS hops only, whose rows decide
	// which root rows pass; scalarTables the tables scalar subqueries read.
	tables       map[string]*table
	byTable      map[string][]*node
	chains       map[string][]chain
	scalarTables map[string]bool
	nodes        int
	// rootAlone is set when no node but the root, and no scalar subquery,
	// reads the root's table (Affects).
	rootAlone bool
}

// chain is a path of EXISTS hops from the root to a node.
type chain struct {
	path []*existsCond
	// from holds the node each hop of path leaves from.
	from []*node
}

// node is one (sub)query: a table with its filter, ordering and hops.
type node struct {
	t *table
	// id numbers the nodes of a query; via is the child columns of the hop
	// that reaches the node (nil for the root).
	id  int
	via []int
	// where is nil when every row passes.
	where cond
	// order is the completed ordering; orderSQL its ORDER BY clause.
	order    []orderCol
	orderSQL string
	start    *cursor
	limit    int // -1: none
	related  []*relation
	// exists lists every correlated condition of where, wherever it sits:
	// each brings its witness rows.
	exists []*existsCond
	// flips is set when where holds a flipped EXISTS: whether its
	// witnesses are synced then depends on the branch a row passes by
	// (see viaFlips).
	flips bool
	// private nodes are reached through a permissions subquery: their rows
	// are used but never synced.
	private bool
	// push is a pre-filter SQLite can apply (with an index, if any): a
	// superset of where, ANDed after "WHERE".
	push     string
	pushArgs []any
	// none is set when where is FALSE for every row (a table the read
	// rules deny): the node reads nothing.
	none bool
	// relation is set on a relation's node. Its lookups keep only the rows
	// the relation syncs, past start and up to limit, so a parent with a
	// million children reads limit of them. An EXISTS node keeps all: a
	// flipped one syncs every match.
	relation bool
}

type orderCol struct {
	col  int
	desc bool
}

type cursor struct {
	vals      []any // one per order column, nil where the row lacks it
	exclusive bool
}

// relation is a related hop.
type relation struct {
	parent, child []int
	hidden        bool
	node          *node
}

// existsCond is an EXISTS or NOT EXISTS condition.
type existsCond struct {
	// from is the node whose where holds the condition.
	from          *node
	not           bool
	flip          bool
	parent, child []int
	node          *node
	// pin holds, for a scalar subquery whose where pins the child's primary
	// key with = literals, those literals in key order.
	pin []any
	// never is set for the flipped-join-with-limit quirk (corpus item 9):
	// such an EXISTS matches nothing.
	never bool
}

// Compile checks ast against s and prepares it for evaluation.
func Compile(s Schema, ast *AST) (*Query, error) {
	if ast == nil {
		return nil, invalid("nil AST")
	}
	if err := ast.validate(true); err != nil {
		return nil, err
	}
	c := compiler{s: s}
	root, err := c.node(ast, false, false)
	if err != nil {
		return nil, err
	}
	q := &Query{root: root, scalars: c.scalars, tables: map[string]*table{}, byTable: map[string][]*node{},
		chains: map[string][]chain{}, scalarTables: map[string]bool{}}
	q.index(root, nil, true)
	scalar := map[*existsCond]bool{}
	for _, e := range c.scalars {
		scalar[e] = true
		e.node.tables(q.scalarTables)
	}
	q.indexChains(root, chain{}, scalar)
	q.rootAlone = len(q.byTable[root.t.name]) == 0 && !q.scalarTables[root.t.name]
	return q, nil
}

// index numbers the nodes under n and files them by table.
func (q *Query) index(n *node, via []int, root bool) {
	n.id, n.via = q.nodes, via
	q.nodes++
	q.tables[n.t.name] = n.t
	if !root {
		q.byTable[n.t.name] = append(q.byTable[n.t.name], n)
	}
	for _, e := range n.exists {
		q.index(e.node, e.child, false)
	}
	for _, r := range n.related {
		q.index(r.node, r.child, false)
	}
}

// indexChains records the nodes reached from n through EXISTS hops that
// are evaluated per row (not resolved once as scalars, not never-matching).
func (q *Query) indexChains(n *node, c chain, scalar map[*existsCond]bool) {
	for _, e := range n.exists {
		if e.never || scalar[e] {
			continue
		}
		next := chain{
			path: append(append([]*existsCond(nil), c.path...), e),
			from: append(append([]*node(nil), c.from...), n),
		}
		q.chains[e.node.t.name] = append(q.chains[e.node.t.name], next)
		q.indexChains(e.node, next, scalar)
	}
}

func (n *node) tables(into map[string]bool) {
	into[n.t.name] = true
	for _, e := range n.exists {
		e.node.tables(into)
	}
	for _, r := range n.related {
		r.node.tables(into)
	}
}

type compiler struct {
	s       Schema
	scalars []*existsCond
}

// node compiles a (sub)query. inExists marks a subquery of a condition,
// whose ordering is irrelevant (zero drops it: only existence and a few
// witnesses count) and which is evaluated in primary-key order.
func (c *compiler) node(a *AST, inExists, private bool) (*node, error) {
	t, err := c.s.table(a.Table)
	if err != nil {
		return nil, err
	}
	n := &node{t: t, limit: -1, private: private}
	if a.Limit != nil {
		n.limit = *a.Limit
	}
	var orderBy []Ordering
	if !inExists {
		orderBy = a.OrderBy
	}
	seen := map[int]bool{}
	for _, o := range orderBy {
		i, err := t.col(o.Column)
		if err != nil {
			return nil, err
		}
		if seen[i] {
			continue
		}
		seen[i] = true
		n.order = append(n.order, orderCol{col: i, desc: o.Desc})
	}
	for _, i := range t.pk {
		if !seen[i] {
			seen[i] = true
			n.order = append(n.order, orderCol{col: i})
		}
	}
	parts := make([]string, len(n.order))
	for i, o := range n.order {
		dir := " ASC"
		if o.desc {
			dir = " DESC"
		}
		parts[i] = quoteIdent(t.cols[o.col].Name) + dir
	}
	n.orderSQL = " ORDER BY " + strings.Join(parts, ", ")
	if a.Start != nil {
		// Only the ordering's columns count: zero ignores the others, which
		// a row the client took from a view may hold (its relationships).
		cur := &cursor{exclusive: a.Start.Exclusive, vals: make([]any, len(n.order))}
		for i, o := range n.order {
			name := t.cols[o.col].Name
			if v := a.Start.Row[name]; !scalarLiteral(v) {
				return nil, invalid("%s: start value of %s is not a string, number, boolean or null", t.name, name)
			}
			cur.vals[i] = a.Start.Row[name]
		}
		n.start = cur
	}
	if a.Where != nil {
		if n.where, err = c.cond(n, a.Where, private); err != nil {
			return nil, err
		}
		n.flips = hasFlip(n.where)
		n.none = alwaysFalse(n.where)
		n.push, n.pushArgs = pushdown(n.t, a.Where)
	}
	// Two related entries with one alias: the last wins.
	last := map[string]int{}
	for i, r := range a.Related {
		last[r.Subquery.Alias] = i
	}
	for i, r := range a.Related {
		if last[r.Subquery.Alias] != i {
			continue
		}
		parent, child, err := c.correlation(t, r)
		if err != nil {
			return nil, err
		}
		cn, err := c.node(r.Subquery, false, private || r.System == SystemPermissions)
		if err != nil {
			return nil, err
		}
		cn.relation = true
		n.related = append(n.related, &relation{parent: parent, child: child, hidden: r.Hidden, node: cn})
	}
	return n, nil
}

func (c *compiler) correlation(parent *table, r CorrelatedSubquery) ([]int, []int, error) {
	child, err := c.s.table(r.Subquery.Table)
	if err != nil {
		return nil, nil, err
	}
	var pi, ci []int
	for k := range r.Correlation.ParentField {
		p, err := parent.col(r.Correlation.ParentField[k])
		if err != nil {
			return nil, nil, err
		}
		ch, err := child.col(r.Correlation.ChildField[k])
		if err != nil {
			return nil, nil, err
		}
		pi, ci = append(pi, p), append(ci, ch)
	}
	return pi, ci, nil
}

func (c *compiler) cond(n *node, w *Condition, private bool) (cond, error) {
	switch w.Type {
	case CondAnd, CondOr:
		subs := make([]cond, 0, len(w.Conditions))
		for i := range w.Conditions {
			s, err := c.cond(n, &w.Conditions[i], private)
			if err != nil {
				return nil, err
			}
			subs = append(subs, s)
		}
		if w.Type == CondAnd {
			return andCond(subs), nil
		}
		return orCond(subs), nil
	case CondCorrelated:
		return c.exists(n, w, private)
	}
	return simple(n.t, w)
}

func (c *compiler) exists(n *node, w *Condition, private bool) (cond, error) {
	r := w.Related
	parent, child, err := c.correlation(n.t, *r)
	if err != nil {
		return nil, err
	}
	cn, err := c.node(r.Subquery, true, private || r.System == SystemPermissions)
	if err != nil {
		return nil, err
	}
	// zero builds a join not flipped only for a subquery whose limit is not
	// 0, and refuses one with a cursor or related subqueries.
	if (w.Flip == nil || !*w.Flip || w.Op == "NOT EXISTS") && (r.Subquery.Limit == nil || *r.Subquery.Limit != 0) {
		switch {
		case r.Subquery.Start != nil:
			return nil, refuse("EXISTS subqueries must not have start")
		case len(r.Subquery.Related) > 0:
			return nil, refuse("EXISTS subqueries must not have related")
		}
	}
	e := &existsCond{from: n, not: w.Op == "NOT EXISTS", parent: parent, child: child, node: cn}
	// The planner never flips a NOT EXISTS (corpus item 10).
	e.flip = w.Flip != nil && *w.Flip && !e.not
	e.never = e.flip && r.Subquery.Limit != nil
	n.exists = append(n.exists, e)
	if w.Scalar != nil && *w.Scalar && cn.limit != 0 {
		e.pin = pinnedKey(cn.t, r.Subquery.Where)
		if e.pin != nil {
			// Appended after the conditions nested in the subquery, which
			// c.node compiled above: inner subqueries resolve first.
			c.scalars = append(c.scalars, e)
		}
	}
	return e, nil
}

// pinnedKey returns the literals that w's top-level = conditions give every
// primary-key column of t, or nil when they do not pin the key.
func pinnedKey(t *table, w *Condition) []any {
	if w == nil {
		return nil
	}
	conj := []Condition{*w}
	if w.Type == CondAnd {
		conj = w.Conditions
	}
	vals := make([]any, len(t.pk))
	got := 0
	for _, k := range conj {
		if k.Type != CondSimple || k.Op != "=" || k.Left.Type != "column" || k.Right.Type != "literal" || k.Right.Value == nil {
			continue
		}
		i, ok := t.byName[k.Left.Name]
		if !ok {
			continue
		}
		for j, p := range t.pk {
			if p == i && vals[j] == nil {
				vals[j] = k.Right.Value
				got++
			}
		}
	}
	if got != len(t.pk) {
		return nil
	}
	return vals
}

// Bounds on what pushdown hands SQLite, whose own limits (the depth of an
// expression, the number of parameters) would fail the query: conditions
// past them are left to the evaluation in Go.
const (
	maxPushed      = 64
	maxInlineList  = 100
	maxLikePattern = 50000 // SQLite's SQLITE_MAX_LIKE_PATTERN_LENGTH
)

// pushdown picks the top-level conjuncts of w that SQLite can evaluate
// exactly or as a superset, for literals of the column's own kind. Go still
// evaluates all of w on what comes back.
func pushdown(t *table, w *Condition) (string, []any) {
	conj := []Condition{*w}
	if w.Type == CondAnd {
		conj = w.Conditions
	}
	var parts []string
	var args []any
	for _, k := range conj {
		if len(parts) == maxPushed {
			break // SQLite's parser nests each AND: a superset is enough
		}
		if k.Type != CondSimple || k.Left.Type != "column" || k.Right.Type != "literal" {
			continue
		}
		i, ok := t.byName[k.Left.Name]
		if !ok {
			continue
		}
		col := t.cols[i]
		if col.Kind == KindJSON {
			continue
		}
		q := quoteIdent(col.Name)
		v := k.Right.Value
		switch k.Op {
		case "IS", "IS NOT":
			if v == nil {
				parts = append(parts, q+" "+k.Op+" NULL")
			} else if sqlArg(col.Kind, v) != nil && k.Op == "IS" {
				parts, args = append(parts, q+" = ?"), append(args, sqlArg(col.Kind, v))
			}
		case "=", "!=", "<", "<=", ">", ">=":
			if a := sqlArg(col.Kind, v); a != nil {
				parts, args = append(parts, q+" "+k.Op+" ?"), append(args, a)
			} else if v == nil {
				parts = append(parts, "0")
			}
		case "IN", "NOT IN":
			list, _ := v.([]any)
			if len(list) == 0 {
				if k.Op == "IN" {
					parts = append(parts, "0")
				} else {
					parts = append(parts, q+" IS NOT NULL")
				}
				continue
			}
			ph := make([]string, 0, len(list))
			var la []any
			for _, e := range list {
				if a := sqlArg(col.Kind, e); a != nil {
					ph, la = append(ph, "?"), append(la, a)
				}
			}
			if len(ph) != len(list) {
				continue
			}
			if len(la) > maxInlineList {
				// One parameter, whatever the length: SQLite takes at most
				// 32,766.
				b, err := json.Marshal(la)
				if err != nil {
					continue
				}
				parts = append(parts, q+" "+k.Op+" (SELECT value FROM json_each(?))")
				args = append(args, string(b))
				continue
			}
			parts = append(parts, q+" "+k.Op+" ("+strings.Join(ph, ", ")+")")
			args = append(args, la...)
		case "LIKE", "ILIKE":
			// SQLite's default LIKE folds ASCII case: a superset of both.
			if p, ok := v.(string); ok && col.Kind == KindString && len(p) <= maxLikePattern {
				parts, args = append(parts, q+` LIKE ? ESCAPE '\'`), append(args, p)
			}
		}
	}
	return strings.Join(parts, " AND "), args
}

// sqlArg converts a literal to what SQLite stores for a column of kind k,
// or nil when the literal is not of that kind.
func sqlArg(k Kind, v any) any {
	switch x := v.(type) {
	case string:
		if k == KindString {
			return x
		}
	case float64:
		if k == KindNumber {
			return x
		}
	case bool:
		if k == KindBoolean {
			if x {
				return int64(1)
			}
			return int64(0)
		}
	}
	return nil
}

// String renders the compiled plan, for debugging.
func (q *Query) String() string {
	var b strings.Builder
	q.root.describe(&b, 0)
	return b.String()
}

func (n *node) describe(b *strings.Builder, depth int) {
	ind := strings.Repeat("  ", depth)
	fmt.Fprintf(b, "%s%s%s limit=%d push=%q\n", ind, n.t.name, n.orderSQL, n.limit, n.push)
	for _, e := range n.exists {
		fmt.Fprintf(b, "%s exists not=%v flip=%v pin=%v never=%v:\n", ind, e.not, e.flip, e.pin, e.never)
		e.node.describe(b, depth+1)
	}
	for _, r := range n.related {
		fmt.Fprintf(b, "%s related hidden=%v:\n", ind, r.hidden)
		r.node.describe(b, depth+1)
	}
}
