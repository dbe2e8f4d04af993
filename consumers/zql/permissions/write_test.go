package permissions

import (
	"encoding/json"
	"testing"
)

func TestWritePolicies(t *testing.T) {
	owner := `{"type": "simple", "left": {"type": "column", "name": "owner"}, "op": "=", "right": {"type": "static", "anchor": "authData", "field": "sub"}}`
	raw := `{"tables": {
		"issue": {"row": {"insert": [["allow", ` + owner + `]], "update": {"preMutation": [["allow", ` + owner + `]]}},
			"cell": {"title": {"update": {"preMutation": []}}, "body": {"insert": [["allow", {"type": "and", "conditions": []}]]}}},
		"open": {"row": {"select": []}}
	}}`
	r, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	auth := map[string]any{"sub": "alice"}
	all := func(string) bool { return true }
	none := func(string) bool { return false }
	enc := func(v any) string { b, _ := json.Marshal(v); return string(b) }

	ins := r.WritePolicies("issue", "insert", PostMutation, all, auth)
	if len(ins) != 2 || len(ins[0]) != 1 || ins[0][0].Right.Type != "literal" || ins[0][0].Right.Value != "alice" {
		t.Fatalf("insert: %s", enc(ins))
	}
	// The update's title cell rule is empty (deny), but applies only when
	// the update sets title.
	if up := r.WritePolicies("issue", "update", PreMutation, none, auth); len(up) != 1 {
		t.Fatalf("update without title: %s", enc(up))
	}
	if up := r.WritePolicies("issue", "update", PreMutation, all, auth); len(up) != 2 || len(up[1]) != 0 {
		t.Fatalf("update with title: %s", enc(up))
	}
	// No postMutation rule, no delete rule, no table: each a denying
	// (empty) row policy.
	for _, c := range [][3]string{{"issue", "update", PostMutation}, {"issue", "delete", PreMutation}, {"open", "insert", PostMutation}, {"missing", "delete", PreMutation}} {
		got := r.WritePolicies(c[0], c[1], c[2], none, auth)
		if len(got) == 0 || len(got[0]) != 0 {
			t.Fatalf("%v: %s", c, enc(got))
		}
	}
	if got := None.WritePolicies("issue", "insert", PostMutation, all, auth); len(got) != 1 || len(got[0]) != 0 {
		t.Fatalf("None: %s", enc(got))
	}
}
