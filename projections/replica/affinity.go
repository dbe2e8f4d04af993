package replica

import (
	"math"
	"regexp"
	"strings"
)

// affinity is a SQLite column affinity (https://sqlite.org/datatype3.html
// §3.1), which decides how a value bound for the column is stored.
type affinity uint8

const (
	affNumeric affinity = iota
	affInteger
	affText
	affBlob
	affReal
)

// affinityOf applies SQLite's rules, in their order, to a declared type.
func affinityOf(decl string) affinity {
	d := strings.ToUpper(decl)
	switch {
	case strings.Contains(d, "INT"):
		return affInteger
	case strings.Contains(d, "CHAR"), strings.Contains(d, "CLOB"), strings.Contains(d, "TEXT"):
		return affText
	case strings.Contains(d, "BLOB"), strings.TrimSpace(d) == "":
		return affBlob
	case strings.Contains(d, "REAL"), strings.Contains(d, "FLOA"), strings.Contains(d, "DOUB"):
		return affReal
	}
	return affNumeric
}

// maxExactInt bounds the floats that SQLite is known to store as integers
// under INTEGER or NUMERIC affinity; past it, versions differ.
const maxExactInt = 1 << 51

// numericText matches text that SQLite may turn into a number under
// NUMERIC, INTEGER or REAL affinity (leading and trailing spaces allowed).
var numericText = regexp.MustCompile(`^[ \t\n\v\f\r]*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[ \t\n\v\f\r]*$`)

// stored returns the value the replica holds after v, as column.value
// converts it, is written to a column of affinity aff, and reads it back.
// It answers false where it is not sure, and the caller reads the row.
func (aff affinity) stored(v any) (any, bool) {
	switch x := v.(type) {
	case nil:
		return nil, true
	case int64:
		switch aff {
		case affReal:
			return float64(x), true
		case affText:
			return nil, false
		}
		return x, true
	case float64:
		switch aff {
		case affText:
			return nil, false
		case affInteger, affNumeric:
			if math.IsInf(x, 0) || x != math.Trunc(x) {
				return x, true
			}
			if x != 0 && math.Abs(x) < maxExactInt {
				return int64(x), true
			}
			return nil, false
		}
		return x, true
	case string:
		if aff != affText && aff != affBlob && numericText.MatchString(x) {
			return nil, false
		}
		return x, true
	}
	return nil, false
}

// storedImage returns the whole old row of an update as the replica holds
// it, from the values the change carries, or nil if the change does not
// carry every column (REPLICA IDENTITY DEFAULT or USING INDEX, or an old
// TOASTed value left out) or a value's stored form is uncertain.
func (t *table) storedImage(vals []any, present []bool) map[string]any {
	for _, p := range present {
		if !p {
			return nil // before allocating: the common case of a key-only image
		}
	}
	m := make(map[string]any, len(t.cols)+1) // room for an insert's version
	for i := range t.cols {
		v, ok := t.cols[i].aff.stored(vals[i])
		if !ok {
			return nil
		}
		m[t.cols[i].name] = v
	}
	return m
}
