package zql

import (
	"slices"
	"sync/atomic"
)

// Changes is a set of changed rows prepared for the Affects checks of
// many queries: a table's images are converted to its columns once, for
// the first query that reads them, not once per query (issue 15: every
// commit is checked against each quiet group's queries, 2,000 of them in
// a reconnect storm). It is safe for concurrent use.
type Changes struct {
	tables []*tableChanges
}

// tableChanges is the images of one table's changed rows.
type tableChanges struct {
	name string
	rows []Change
	conv atomic.Pointer[converted]
}

// converted is a table's images in client form for cols. unsure is set
// when an image lacks a column or holds a value that does not convert:
// it says nothing sure about the row.
type converted struct {
	cols   []Column
	images [][]any
	unsure bool
}

// NewChanges prepares rows for Affects.
func NewChanges(rows []Change) *Changes {
	cs := &Changes{}
	for _, c := range rows {
		i := slices.IndexFunc(cs.tables, func(t *tableChanges) bool { return t.name == c.Table })
		if i < 0 {
			i = len(cs.tables)
			cs.tables = append(cs.tables, &tableChanges{name: c.Table})
		}
		cs.tables[i].rows = append(cs.tables[i].rows, c)
	}
	return cs
}

// images returns tc's images converted for t. Those of the first schema
// asked for are kept; another's (a query compiled before a schema change)
// are converted afresh.
func (tc *tableChanges) images(t *table) *converted {
	if c := tc.conv.Load(); c != nil && sameColumns(c.cols, t.cols) {
		return c
	}
	c := &converted{cols: t.cols}
	for _, r := range tc.rows {
		for _, m := range [2]map[string]any{r.Old, r.New} {
			if m == nil {
				continue
			}
			vals, ok := t.fullImage(m)
			if !ok {
				c.unsure, c.images = true, nil
				break
			}
			c.images = append(c.images, vals)
		}
		if c.unsure {
			break
		}
	}
	tc.conv.CompareAndSwap(nil, c)
	return c
}

func sameColumns(a, b []Column) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0] || slices.Equal(a, b))
}

// Affects reports whether changes may change q's result, so that an
// advance can leave the views of other queries as they are, without a
// read (issue 15: a reconnect storm's groups each hold queries on the
// table a hot query's writes change). It answers false only when it is
// sure: every changed row q reads is a row of its root table, which q
// reads nowhere else, and neither the row's old nor its new image passes
// the root's conditions on the row's own columns. Such a row is in the
// result neither before nor after, and no other row's place depends on
// it. A View that Affects clears for some changes would diff nothing from
// them.
func (q *Query) Affects(changes *Changes) bool {
	n := q.root
	for _, tc := range changes.tables {
		t := q.tables[tc.name]
		if t == nil {
			continue
		}
		if t != n.t || !q.rootAlone {
			return true
		}
		c := tc.images(t)
		if c.unsure {
			return true
		}
		for _, vals := range c.images {
			if !excludes(n.where, vals) {
				return true
			}
		}
	}
	return false
}

// fullImage is fromReplica for an image that holds every column of t:
// one that lacks a column (an image the change did not carry whole) says
// nothing sure about it.
func (t *table) fullImage(m map[string]any) ([]any, bool) {
	for _, c := range t.cols {
		if _, ok := m[c.Name]; !ok {
			return nil, false
		}
	}
	return t.fromReplica(m)
}

// excludes reports whether where is FALSE for a row with values vals,
// judged from the row alone: a condition that needs other rows (EXISTS)
// counts as passing, unless it can never hold.
func excludes(where cond, vals []any) bool {
	switch c := where.(type) {
	case nil:
		return false
	case *simpleCond:
		return !c.test(vals[c.col])
	case constCond:
		return !bool(c)
	case andCond:
		for _, s := range c {
			if excludes(s, vals) {
				return true
			}
		}
		return false
	case orCond:
		for _, s := range c {
			if !excludes(s, vals) {
				return false
			}
		}
		return true
	}
	return alwaysFalse(where)
}
