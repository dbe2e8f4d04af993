package zql

import (
	"encoding/json"
	"math"
	"testing"
)

// TestRowValue_JSON checks that a RowValue encodes its values as
// encoding/json encodes its Row, in table order, and its key map as
// encoding/json does.
func TestRowValue_JSON(t *testing.T) {
	s := Schema{Tables: map[string]TableSchema{"t": {
		Columns:    []Column{{"z", KindString}, {"b", KindNumber}, {"a<", KindBoolean}, {"j", KindJSON}, {"k", KindNumber}},
		PrimaryKey: []string{"z", "k"},
	}}}
	tbl, err := s.table("t")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		vals []any
	}{
		{"Plain", []any{"i0000001", 12.0, true, json.RawMessage(`{"x":1}`), 3.0}},
		{"Nulls", []any{"", nil, nil, nil, -7.0}},
		{"Escapes", []any{"a\"b\\c<d>&é\u2028\x01", 0.5, false, json.RawMessage(` [1, "<"] `), 1e21}},
		{"Numbers", []any{"n", math.Copysign(0, -1), false, json.RawMessage(`null`), 1e-7}},
		{"Big", []any{"n", float64(1 << 53), false, json.RawMessage(`2`), -123456789.125}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := RowValue{tbl, &row{vals: tt.vals}}
			want := []byte("{")
			for i, c := range tbl.cols {
				if i > 0 {
					want = append(want, ',')
				}
				k, _ := json.Marshal(c.Name)
				x, err := json.Marshal(tt.vals[i])
				if err != nil {
					t.Fatal(err)
				}
				want = append(append(append(want, k...), ':'), x...)
			}
			want = append(want, '}')
			got, err := v.AppendJSON(nil)
			if err != nil || string(got) != string(want) {
				t.Errorf("AppendJSON = %s, %v; want %s", got, err, want)
			}
			want, _ = json.Marshal(map[string]any{"z": tt.vals[0], "k": tt.vals[4]})
			got, err = v.AppendKeyJSON(nil)
			if err != nil || string(got) != string(want) {
				t.Errorf("AppendKeyJSON = %s, %v; want %s", got, err, want)
			}
			if !v.Equal(RowValue{tbl, &row{vals: append([]any(nil), tt.vals...)}}) {
				t.Error("not Equal to a copy")
			}
		})
	}
	if _, err := (RowValue{tbl, &row{vals: []any{"x", math.NaN(), nil, nil, 1.0}}}).AppendJSON(nil); err == nil {
		t.Error("AppendJSON encoded NaN")
	}
}

// TestRowValue_ColumnOrder checks that rows go out with their columns in
// zero-cache's order: the table's, with the names a JavaScript object
// treats as array indexes first, in numeric order.
func TestRowValue_ColumnOrder(t *testing.T) {
	cols := []Column{{"z", KindString}, {"b", KindNumber}, {"10", KindNumber}, {"a", KindBoolean},
		{"2", KindNumber}, {"01", KindNumber}, {"4294967295", KindNumber}, {"4294967294", KindNumber}, {"-1", KindNumber}}
	s := Schema{Tables: map[string]TableSchema{"t": {Columns: cols, PrimaryKey: []string{"z", "b"}}}}
	tbl, err := s.table("t")
	if err != nil {
		t.Fatal(err)
	}
	v := RowValue{tbl, &row{vals: []any{"k", 1.0, 2.0, true, 3.0, 4.0, 5.0, 6.0, 7.0}}}
	got, err := v.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"2":3,"10":2,"4294967294":6,"z":"k","b":1,"a":true,"01":4,"4294967295":5,"-1":7}`
	if string(got) != want {
		t.Errorf("AppendJSON = %s\nwant          %s", got, want)
	}
	// A row key stays in name order: it is the row's identity in the CVR.
	if got, _ := v.AppendKeyJSON(nil); string(got) != `{"b":1,"z":"k"}` {
		t.Errorf("AppendKeyJSON = %s", got)
	}
}

// BenchmarkRowValue_AppendJSON measures a row's encoding, which every put
// of every poke goes through.
func BenchmarkRowValue_AppendJSON(b *testing.B) {
	tbl, err := benchSchema.table("issue")
	if err != nil {
		b.Fatal(err)
	}
	v := RowValue{tbl, &row{vals: []any{"i0000001", "Issue 1 c4ca4238a0b923820dcc509a6f75849b", true, 999086505.0, "u000001", 1704067260000.0}}}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		if buf, err = v.AppendJSON(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}
