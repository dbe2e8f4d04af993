package zql

import "slices"

// cond is a compiled condition, evaluated on one row within a hydration
// (EXISTS looks up children through it).
type cond interface {
	eval(h *hydration, r *row) (bool, error)
}

type andCond []cond

func (c andCond) eval(h *hydration, r *row) (bool, error) {
	for _, s := range c {
		ok, err := s.eval(h, r)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// orCond with no members is FALSE (docs/query-ast.md §3.1).
type orCond []cond

func (c orCond) eval(h *hydration, r *row) (bool, error) {
	for _, s := range c {
		ok, err := s.eval(h, r)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// alwaysFalse reports whether c is FALSE whatever the row, as the empty
// or the read rules put on a denied table.
func alwaysFalse(c cond) bool {
	switch x := c.(type) {
	case constCond:
		return !bool(x)
	case orCond:
		for _, s := range x {
			if !alwaysFalse(s) {
				return false
			}
		}
		return true
	case andCond:
		return slices.ContainsFunc(x, alwaysFalse)
	case *existsCond:
		return x.never || !x.not && (x.node.none || x.node.limit == 0)
	}
	return false
}

type constCond bool

func (c constCond) eval(*hydration, *row) (bool, error) { return bool(c), nil }

// simpleCond compares a column (col >= 0) or a literal left with a literal.
type simpleCond struct {
	col  int
	left any
	op   string
	lit  any
	set  []any
	like *likePattern
}

// simple compiles a simple condition. A literal on the left makes it a
// constant.
func simple(t *table, w *Condition) (cond, error) {
	s := &simpleCond{col: -1, op: w.Op, lit: w.Right.Value}
	if w.Left.Type == "column" {
		i, err := t.col(w.Left.Name)
		if err != nil {
			return nil, err
		}
		s.col = i
	} else {
		s.left = w.Left.Value
	}
	switch w.Op {
	case "IN", "NOT IN":
		s.set, _ = w.Right.Value.([]any)
	case "LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE":
		if p, ok := w.Right.Value.(string); ok {
			if len(p) > maxLikePattern {
				// SQLite would fail it at every hydration; refused up front,
				// it also bounds the matcher's O(len·pattern) per row.
				return nil, refuse("LIKE or GLOB pattern too complex: %d bytes, at most %d", len(p), maxLikePattern)
			}
			lp, err := compileLike(p, w.Op == "ILIKE" || w.Op == "NOT ILIKE")
			if err != nil {
				return nil, invalid("%s: %v", t.name, err)
			}
			s.like = lp
		}
	}
	if s.col < 0 {
		return constCond(s.test(s.left)), nil
	}
	return s, nil
}

func (s *simpleCond) eval(_ *hydration, r *row) (bool, error) {
	return s.test(r.vals[s.col]), nil
}

// test applies the operator to v. Except for IS and IS NOT, a null on
// either side makes the condition false.
func (s *simpleCond) test(v any) bool {
	switch s.op {
	case "IS":
		if v == nil || s.lit == nil {
			return v == nil && s.lit == nil
		}
		return valuesEqual(v, s.lit)
	case "IS NOT":
		if v == nil || s.lit == nil {
			return (v == nil) != (s.lit == nil)
		}
		return !valuesEqual(v, s.lit)
	}
	if v == nil {
		return false
	}
	switch s.op {
	case "IN", "NOT IN":
		in := false
		for _, e := range s.set {
			if valuesEqual(v, e) {
				in = true
				break
			}
		}
		return in == (s.op == "IN")
	}
	if s.lit == nil {
		return false
	}
	switch s.op {
	case "=":
		return valuesEqual(v, s.lit)
	case "!=":
		return !valuesEqual(v, s.lit)
	case "<":
		return compareValues(v, s.lit) < 0
	case "<=":
		return compareValues(v, s.lit) <= 0
	case ">":
		return compareValues(v, s.lit) > 0
	case ">=":
		return compareValues(v, s.lit) >= 0
	case "LIKE", "ILIKE":
		return s.like != nil && s.like.match(likeText(v))
	case "NOT LIKE", "NOT ILIKE":
		return s.like != nil && !s.like.match(likeText(v))
	}
	return false
}

// flipped reports whether e runs as zero's flipped join: a flipped EXISTS
// not resolved beforehand as a scalar.
func (e *existsCond) flipped() bool { return e.flip && e.pin == nil }

// hasFlip reports whether c holds a flipped EXISTS at any level.
func hasFlip(c cond) bool {
	switch x := c.(type) {
	case *existsCond:
		return x.flipped()
	case andCond:
		return slices.ContainsFunc(x, hasFlip)
	case orCond:
		return slices.ContainsFunc(x, hasFlip)
	}
	return false
}

// viaFlips appends to out the flipped EXISTS conditions of c whose
// witnesses zero syncs for r, and reports whether r passes c. Zero runs a
// flipped EXISTS as a join from the child rows, whose output carries every
// matching child; an or holding one becomes a union of its branches, the
// members without flips together first, then each member with flips in
// order, and a row passing several branches comes from the first. So a
// row that passes by another branch brings no witnesses of the flipped
// EXISTS, and an and brings those of each of its members.
func (h *hydration) viaFlips(c cond, r *row, out []*existsCond) ([]*existsCond, bool, error) {
	if !hasFlip(c) {
		ok, err := c.eval(h, r)
		return out, ok, err
	}
	switch x := c.(type) {
	case *existsCond:
		ok, err := x.eval(h, r)
		if ok && !x.never {
			out = append(out, x)
		}
		return out, ok, err
	case andCond:
		n := len(out)
		for _, s := range x {
			var ok bool
			var err error
			if out, ok, err = h.viaFlips(s, r, out); err != nil || !ok {
				return out[:n], false, err
			}
		}
		return out, true, nil
	case orCond:
		for _, s := range x {
			if hasFlip(s) {
				continue
			}
			if ok, err := s.eval(h, r); err != nil || ok {
				return out, ok, err
			}
		}
		n := len(out)
		for _, s := range x {
			if !hasFlip(s) {
				continue
			}
			more, ok, err := h.viaFlips(s, r, out)
			if err != nil || ok {
				return more, ok, err
			}
			out = more[:n]
		}
		return out, false, nil
	}
	ok, err := c.eval(h, r)
	return out, ok, err
}
