package zql

import (
	"encoding/json"
	"math"
	"testing"
)

// TestRowValue_JSON checks that a RowValue encodes as encoding/json
// encodes its Row and its key map.
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
			want, err := json.Marshal(v.Row())
			if err != nil {
				t.Fatal(err)
			}
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
