package zql

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Values inside the engine are client-form Go values: nil, string, float64,
// bool, or json.RawMessage for json columns.

// compareValues orders values as zero's compareValues does: null first,
// strings by bytes (code points), numbers numerically, false < true. Values
// of different types, which zero leaves to SQLite, order as SQLite's
// storage classes do: numbers (booleans are 0 and 1 there) before text.
func compareValues(a, b any) int {
	if a == nil || b == nil {
		switch {
		case a == nil && b == nil:
			return 0
		case a == nil:
			return -1
		}
		return 1
	}
	switch x := a.(type) {
	case string:
		if y, ok := b.(string); ok {
			return strings.Compare(x, y)
		}
	case float64:
		if y, ok := b.(float64); ok {
			return cmp.Compare(x, y)
		}
	case bool:
		if y, ok := b.(bool); ok {
			return cmp.Compare(b2f(x), b2f(y))
		}
	}
	ra, fa, sa := class(a)
	rb, fb, sb := class(b)
	if ra != rb {
		return cmp.Compare(ra, rb)
	}
	if ra == 1 {
		return cmp.Compare(fa, fb)
	}
	return strings.Compare(sa, sb)
}

// class gives a non-null value's SQLite storage class rank and its numeric
// or text form.
func class(v any) (rank int, f float64, s string) {
	switch x := v.(type) {
	case float64:
		return 1, x, ""
	case bool:
		return 1, b2f(x), ""
	case string:
		return 2, 0, x
	case json.RawMessage:
		return 2, 0, string(x)
	}
	return 3, 0, fmt.Sprint(v)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// valuesEqual is strict equality without coercion; null equals nothing.
func valuesEqual(a, b any) bool {
	switch x := a.(type) {
	case string:
		y, ok := b.(string)
		return ok && x == y
	case float64:
		y, ok := b.(float64)
		return ok && x == y
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case json.RawMessage:
		y, ok := b.(json.RawMessage)
		return ok && string(x) == string(y)
	}
	return false
}

// likeText is the text a LIKE sees: strings as they are, numbers and
// booleans as SQLite renders them (zero leaves such mismatches to SQLite).
func likeText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.RawMessage:
		return string(x)
	case bool:
		if x {
			return "1"
		}
		return "0"
	case float64:
		if x == float64(int64(x)) {
			return strconv.FormatInt(int64(x), 10)
		}
		return strconv.FormatFloat(x, 'g', 15, 64)
	}
	return fmt.Sprint(v)
}

// likePattern is a compiled LIKE pattern: literal runes, '_' (one code
// point) and '%' (any run), anchored at both ends. '\' escapes the next
// character.
type likePattern struct {
	toks []likeTok
	// plain holds the pattern when it has no wildcard: an equality test.
	plain    string
	isPlain  bool
	caseFold bool
}

type likeTok struct {
	kind byte // 'c' literal, '_' one, '%' any
	r    rune
}

func compileLike(p string, fold bool) (*likePattern, error) {
	if fold {
		p = asciiLower(p)
	}
	lp := &likePattern{caseFold: fold}
	if !strings.ContainsAny(p, `%_\`) {
		lp.plain, lp.isPlain = p, true
		return lp, nil
	}
	rs := []rune(p)
	for i := 0; i < len(rs); i++ {
		switch r := rs[i]; r {
		case '\\':
			if i+1 == len(rs) {
				return nil, fmt.Errorf("LIKE pattern %q ends in a lone backslash", p)
			}
			i++
			lp.toks = append(lp.toks, likeTok{kind: 'c', r: rs[i]})
		case '%':
			if n := len(lp.toks); n > 0 && lp.toks[n-1].kind == '%' {
				continue
			}
			lp.toks = append(lp.toks, likeTok{kind: '%'})
		case '_':
			lp.toks = append(lp.toks, likeTok{kind: '_'})
		default:
			lp.toks = append(lp.toks, likeTok{kind: 'c', r: r})
		}
	}
	return lp, nil
}

// asciiLower lower-cases like SQLite's lower() without ICU: ASCII only.
// zero-cache filters ILIKE in SQLite first, so a row it drops there never
// reaches the JS matcher's Unicode folding.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

func (lp *likePattern) match(s string) bool {
	if lp.caseFold {
		s = asciiLower(s)
	}
	if lp.isPlain {
		return s == lp.plain
	}
	// Greedy matching with backtracking to the last '%': linear for one
	// '%', O(n·m) at worst.
	toks := lp.toks
	ti, si := 0, 0
	starTi, starSi := -1, 0
	for si < len(s) || ti < len(toks) {
		if ti < len(toks) {
			t := toks[ti]
			switch t.kind {
			case '%':
				starTi, starSi = ti, si
				ti++
				continue
			case '_':
				if si < len(s) {
					_, n := utf8.DecodeRuneInString(s[si:])
					si += n
					ti++
					continue
				}
			case 'c':
				if si < len(s) {
					r, n := utf8.DecodeRuneInString(s[si:])
					if r == t.r {
						si += n
						ti++
						continue
					}
				}
			}
		}
		if starTi < 0 || starSi >= len(s) {
			return false
		}
		_, n := utf8.DecodeRuneInString(s[starSi:])
		starSi += n
		ti, si = starTi+1, starSi
	}
	return true
}
