package zql

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
func (q *Query) Affects(changes []Change) bool {
	n := q.root
	for _, c := range changes {
		t := q.tables[c.Table]
		if t == nil {
			continue
		}
		if t != n.t || len(q.byTable[c.Table]) > 0 || q.scalarTables[c.Table] {
			return true
		}
		for _, m := range []map[string]any{c.Old, c.New} {
			if m == nil {
				continue
			}
			vals, ok := t.fullImage(m)
			if !ok || !excludes(n.where, vals) {
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
