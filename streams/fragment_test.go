package streams

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func bigChange(n int) *Change {
	// Quotes, backslashes, controls and multi-byte runes all escape to more
	// than they take, and a budget that ignored them would overflow.
	var b strings.Builder
	for b.Len() < n {
		b.WriteString("plain text \" \\ \x01 é € 😀 \u2028 <&> ")
	}
	v, _ := json.Marshal(b.String())
	return &Change{Op: OpUpdate, New: Row{"id": json.RawMessage(`"r1"`), "body": v, "n": json.RawMessage(`7`)}, Old: Row{"id": json.RawMessage(`"r0"`)}}
}

// join runs fragments through the codec, one message each, and the
// Assembler.
func join(t *testing.T, frags []Change) []Change {
	t.Helper()
	var a Assembler
	var out []Change
	for i, f := range frags {
		b, err := Encode(&Message{Schema: "public", Table: "t", Parts: []Part{{Watermark: "0a", Num: i, Last: i == len(frags)-1, Changes: []Change{f}}}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.Part(m.Schema, m.Table, &m.Parts[0])
		if err != nil {
			t.Fatalf("Part %d: %v", i, err)
		}
		out = append(out, got...)
	}
	if a.Pending() {
		t.Error("Assembler pending after the last fragment")
	}
	return out
}

func TestFragment(t *testing.T) {
	for _, tc := range []struct {
		name     string
		size     int
		max      int
		wantMany bool
	}{
		{"Small", 100, 1 << 10, false},
		{"Big", 3 << 20, 500 << 10, true},
		{"TinyBudget", 2000, minFragmentBytes, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := bigChange(tc.size)
			frags, err := Fragment(c, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			if many := len(frags) > 1; many != tc.wantMany {
				t.Fatalf("Fragment gave %d fragments", len(frags))
			}
			for i, f := range frags {
				if n := len(appendString(nil, f.Fragment)) - 2; n > tc.max {
					t.Fatalf("fragment %d encodes to %d bytes; max %d", i, n, tc.max)
				}
				if f.FragNum != i || f.FragCount != len(frags) {
					t.Fatalf("fragment %d is %d of %d", i, f.FragNum, f.FragCount)
				}
			}
			again, _ := Fragment(c, tc.max)
			if !cmp.Equal(again, frags) {
				t.Error("Fragment is not deterministic")
			}
			got := join(t, frags)
			if len(got) != 1 || !cmp.Equal(got[0], *c) {
				t.Errorf("joined = %.200v; want %.200v", got, *c)
			}
		})
	}
}

func TestAssemblerRejects(t *testing.T) {
	frags, err := Fragment(bigChange(3000), 1000)
	if err != nil || len(frags) < 3 {
		t.Fatalf("Fragment = %d, %v", len(frags), err)
	}
	ins := Change{Op: OpInsert, New: Row{"id": json.RawMessage(`1`)}}
	type step struct {
		table   string
		wm      string
		last    bool
		changes []Change
	}
	part := func(c ...Change) step { return step{table: "t", wm: "0a", changes: c} }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"MissingStart", []step{part(frags[1])}},
		{"Skipped", []step{part(frags[0]), part(frags[2])}},
		{"Repeated", []step{part(frags[0]), part(frags[0])}},
		{"ChangeBetween", []step{part(frags[0]), part(ins)}},
		{"ChangeBetweenInPart", []step{part(frags[0], ins, frags[1])}},
		{"OtherTable", []step{part(frags[0]), {table: "u", wm: "0a", changes: []Change{frags[1]}}}},
		{"OtherTx", []step{part(frags[0]), {table: "t", wm: "0b", changes: []Change{frags[1]}}}},
		{"TxEnds", []step{part(frags[0]), {table: "t", wm: "0a", last: true, changes: []Change{frags[1]}}}},
		{"TxEndsOnTxSubject", []step{part(frags[0]), {wm: "0a", last: true, changes: []Change{}}}},
		{"CountChanges", []step{part(frags[0]), part(Change{Op: OpFragment, Fragment: frags[1].Fragment, FragNum: 1, FragCount: 9})}},
		{"NotAChange", []step{part(Change{Op: OpFragment, Fragment: `{"op":"insert"`, FragCount: 2}, Change{Op: OpFragment, Fragment: `,"new":{}} x`, FragNum: 1, FragCount: 2})}},
		{"Invalid", []step{part(Change{Op: OpFragment, Fragment: `{"op":"insert"}`, FragCount: 1})}},
		{"Nested", []step{part(Change{Op: OpFragment, Fragment: `{"op":"fragment","fragment":"x","fragCount":1}`, FragCount: 1})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a Assembler
			var err error
			for i, s := range tc.steps {
				schema := ""
				if s.table != "" {
					schema = "public"
				}
				if _, err = a.Part(schema, s.table, &Part{Watermark: s.wm, Num: i, Last: s.last, Changes: s.changes}); err != nil {
					break
				}
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Part = %v; want ErrMalformed", err)
			}
			if a.Pending() {
				t.Error("Assembler still pending after an error")
			}
		})
	}
}

func TestFragmentValidate(t *testing.T) {
	for _, c := range []Change{
		{Op: OpFragment, FragCount: 1},
		{Op: OpFragment, Fragment: "x", FragNum: 1, FragCount: 1},
		{Op: OpFragment, Fragment: "x", FragNum: -1, FragCount: 1},
		{Op: OpInsert, New: Row{}, FragCount: 1},
	} {
		m := &Message{Table: "t", Parts: []Part{{Watermark: "0a", Changes: []Change{c}}}}
		if err := m.Validate(); !errors.Is(err, ErrMalformed) {
			t.Errorf("Validate(%+v) = %v; want ErrMalformed", c, err)
		}
	}
	m := &Message{Parts: []Part{{Watermark: "0a", Changes: []Change{{Op: OpFragment, Fragment: "x", FragCount: 1}}}}}
	if err := m.Validate(); err == nil {
		t.Error("Validate accepted a fragment on the tx subject")
	}
}
