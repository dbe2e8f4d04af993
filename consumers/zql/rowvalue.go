package zql

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// RowValue is one row of a View's result in client form. It shares the
// values the view read, so that holding it costs two pointers instead of a
// Row map per row; it must be treated as read-only. The zero RowValue is
// no row.
type RowValue struct {
	t *table
	r *row
}

// IsZero reports whether v holds no row.
func (v RowValue) IsZero() bool { return v.r == nil }

// Table is the row's table.
func (v RowValue) Table() string { return v.t.name }

// Version is the row's _0_version.
func (v RowValue) Version() string { return v.r.version }

// Get returns column col's value, nil for an unknown column.
func (v RowValue) Get(col string) any {
	i, ok := v.t.byName[col]
	if !ok {
		return nil
	}
	return v.r.vals[i]
}

// Row returns the row as a Row map.
func (v RowValue) Row() Row { return v.t.clientRow(v.r) }

// Equal reports whether v and o hold the same values (versions aside).
func (v RowValue) Equal(o RowValue) bool {
	if v.r == o.r {
		return true
	}
	if v.r == nil || o.r == nil || len(v.r.vals) != len(o.r.vals) {
		return false
	}
	for i, x := range v.r.vals {
		if !sameClientValue(x, o.r.vals[i]) {
			return false
		}
	}
	return true
}

func sameClientValue(a, b any) bool {
	switch x := a.(type) {
	case json.RawMessage:
		y, ok := b.(json.RawMessage)
		return ok && string(x) == string(y)
	default:
		return a == b
	}
}

// AppendJSON appends the row as a JSON object, its columns in the order
// zero-cache sends them (see objectOrder) and its values as encoding/json
// writes them. It fails only for a NaN or infinite number.
func (v RowValue) AppendJSON(b []byte) ([]byte, error) {
	return v.appendObject(b, v.t.objectOrder)
}

// AppendKeyJSON appends the row's primary key as a JSON object, as
// encoding/json writes a map of the key columns (keys sorted).
func (v RowValue) AppendKeyJSON(b []byte) ([]byte, error) {
	return v.appendObject(b, v.t.sortedPK())
}

func (v RowValue) appendObject(b []byte, cols []int) ([]byte, error) {
	b = append(b, '{')
	for i, c := range cols {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendJSONString(b, v.t.cols[c].Name); err != nil {
			return b, err
		}
		b = append(b, ':')
		if b, err = appendJSONValue(b, v.r.vals[c]); err != nil {
			return b, fmt.Errorf("%s.%s: %w", v.t.name, v.t.cols[c].Name, err)
		}
	}
	return append(b, '}'), nil
}

// sortedPK is the primary-key columns' indexes in name order.
func (t *table) sortedPK() []int { return t.pkNameOrder }

func sortedCols(t *table, cols []int) []int {
	out := slices.Clone(cols)
	slices.SortFunc(out, func(a, b int) int {
		switch {
		case t.cols[a].Name < t.cols[b].Name:
			return -1
		case t.cols[a].Name > t.cols[b].Name:
			return 1
		}
		return 0
	})
	return out
}

// objectOrder returns the indexes of cols in the order zero-cache sends a
// row's columns: the replica's column order, which is cols', except that a
// JavaScript object lists the keys that are array indexes first, in
// numeric order, whatever order they were added in.
func objectOrder(cols []Column) []int {
	out := make([]int, 0, len(cols))
	for i, c := range cols {
		if _, ok := arrayIndex(c.Name); ok {
			out = append(out, i)
		}
	}
	slices.SortFunc(out, func(a, b int) int {
		x, _ := arrayIndex(cols[a].Name)
		y, _ := arrayIndex(cols[b].Name)
		return cmp.Compare(x, y)
	})
	for i, c := range cols {
		if _, ok := arrayIndex(c.Name); !ok {
			out = append(out, i)
		}
	}
	return out
}

// arrayIndex reports whether s is an array index as ECMAScript defines
// it: the canonical decimal form of an integer below 2^32-1.
func arrayIndex(s string) (uint64, bool) {
	if s == "" || len(s) > 10 || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n >= 1<<32-1 {
		return 0, false
	}
	return n, true
}

// appendJSONValue appends a client-form value as encoding/json writes it.
func appendJSONValue(b []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case string:
		return appendJSONString(b, x)
	case bool:
		return strconv.AppendBool(b, x), nil
	case float64:
		// Integers below 2^53 print the same in every format.
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 && !(x == 0 && math.Signbit(x)) {
			return strconv.AppendInt(b, int64(x), 10), nil
		}
	}
	j, err := json.Marshal(v)
	if err != nil {
		return b, err
	}
	return append(b, j...), nil
}

// appendJSONString appends s quoted as encoding/json quotes it.
func appendJSONString(b []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			j, err := json.Marshal(s)
			if err != nil {
				return b, err
			}
			return append(b, j...), nil
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), nil
}
