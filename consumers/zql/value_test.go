package zql

import (
	"encoding/json"
	"testing"
)

func TestCompareValues(t *testing.T) {
	for _, tc := range []struct {
		a, b any
		want int
	}{
		{nil, nil, 0},
		{nil, "a", -1},
		{"a", nil, 1},
		{nil, false, -1},
		{"a", "b", -1},
		{"b", "a", 1},
		{"Z", "a", -1},
		{"a", "ab", -1},
		// Code-point order, not UTF-16: U+FF5E sorts before U+1F600 here
		// but after it in UTF-16 code units.
		{"\uff5e", "\U0001f600", -1},
		{1.0, 2.0, -1},
		{2.5, 2.5, 0},
		{-1.0, 0.0, -1},
		{false, true, -1},
		{true, true, 0},
		// Mixed types order as SQLite's storage classes.
		{1.0, "1", -1},
		{"abc", 1e300, 1},
		{true, 0.5, 1},
		{json.RawMessage(`{"a":1}`), json.RawMessage(`{"b":1}`), -1},
	} {
		if got := compareValues(tc.a, tc.b); got != tc.want {
			t.Errorf("compareValues(%#v, %#v) = %d; want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestLike(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		fold    bool
		s       string
		want    bool
	}{
		{"abc", false, "abc", true},
		{"abc", false, "ABC", false},
		{"abc", true, "ABC", true},
		{"a%", false, "a", true},
		{"a%", false, "abc", true},
		{"a%", false, "ba", false},
		{"%a", false, "ba", true},
		{"%a%", false, "xxaxx", true},
		{"%", false, "", true},
		{"_", false, "", false},
		{"_", false, "é", true},
		{"_", false, "😀", true}, // one code point, as SQLite
		{"__", false, "😀", false},
		{"a_c", false, "abc", true},
		{"a_c", false, "abbc", false},
		{"a%b%c", false, "a123b456c", true},
		{"a%b%c", false, "a123c456b", false},
		{"%%a", false, "a", true},
		{"a%", false, "a\nb", true},
		{`Issue 1\%`, false, "Issue 1%", true},
		{`Issue 1\%`, false, "Issue 10", false},
		{`label\-1%`, false, "label-10", true},
		{`a\_`, false, "ab", false},
		{`a\_`, false, "a_", true},
		{`a\\`, false, `a\`, true},
		{"User _", false, "User 1", true},
		{"User _", false, "User 10", false},
		{"comment 2%", false, "Comment 2 on issue 1", false},
		{"comment 2%", true, "Comment 2 on issue 1", true},
		// ILIKE folds ASCII only, as SQLite's lower() does.
		{"é%", true, "É", false},
		{"%B", true, "ab", true},
	} {
		lp, err := compileLike(tc.pattern, tc.fold)
		if err != nil {
			t.Fatalf("compileLike(%q) = %v", tc.pattern, err)
		}
		if got := lp.match(tc.s); got != tc.want {
			t.Errorf("%q LIKE(fold=%v) %q = %v; want %v", tc.s, tc.fold, tc.pattern, got, tc.want)
		}
	}
	if _, err := compileLike(`abc\`, false); err == nil {
		t.Error(`compileLike("abc\\") succeeded; want an error for the lone backslash`)
	}
}

func TestSimpleCond(t *testing.T) {
	for _, tc := range []struct {
		op   string
		v    any
		lit  any
		want bool
	}{
		{"=", "a", "a", true},
		{"=", 1.0, "1", false},
		{"=", true, 1.0, false},
		{"=", nil, nil, false},
		{"!=", nil, "a", false},
		{"!=", "a", nil, false},
		{"!=", "a", "b", true},
		{"!=", 1.0, "1", true},
		{"IS", nil, nil, true},
		{"IS", "a", nil, false},
		{"IS", nil, "a", false},
		{"IS", "a", "a", true},
		{"IS NOT", nil, nil, false},
		{"IS NOT", "a", nil, true},
		{"IS NOT", nil, "a", true},
		{"IS NOT", "a", "a", false},
		{"<", 1.0, 2.0, true},
		{"<", nil, 2.0, false},
		{">=", "b", "b", true},
		{">", true, false, true},
		{">", 5.0, "abc", false},
		{"IN", "a", []any{"b", "a"}, true},
		{"IN", "a", []any{}, false},
		{"IN", nil, []any{"a"}, false},
		{"NOT IN", "a", []any{}, true},
		{"NOT IN", "a", []any{"a"}, false},
		{"NOT IN", nil, []any{"a"}, false},
		{"LIKE", "abc", "a%", true},
		{"NOT LIKE", "abc", "a%", false},
		{"NOT LIKE", nil, "a%", false},
		{"NOT ILIKE", "ABC", "a%", false},
		{"NOT ILIKE", "xbc", "a%", true},
		{"LIKE", 15.0, "1%", true},
		{"LIKE", "a", nil, false},
	} {
		w := &Condition{Type: CondSimple, Op: tc.op,
			Left:  &ValuePosition{Type: "column", Name: "c"},
			Right: &ValuePosition{Type: "literal", Value: tc.lit}}
		c, err := simple(&table{name: "t", byName: map[string]int{"c": 0}}, w)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := c.eval(nil, &row{vals: []any{tc.v}})
		if got != tc.want {
			t.Errorf("%#v %s %#v = %v; want %v", tc.v, tc.op, tc.lit, got, tc.want)
		}
	}
}
