package permissions

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jetsync/jetsync/consumers/zql"
)

const (
	anyoneCan   = `[["allow",{"type":"and","conditions":[]}]]`
	ownerIsSub  = `[["allow",{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"static","anchor":"authData","field":"sub"},"op":"="}]]`
	onOwnIssues = `[["allow",{"type":"correlatedSubquery","related":{"system":"permissions","correlation":{"parentField":["issue_id"],"childField":["id"]},"subquery":{"table":"issue","alias":"zsubq_issue","where":{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"static","anchor":"authData","field":"sub"},"op":"="}}},"op":"EXISTS"}]]`
)

// rules compiles table → select policy into the deployed JSON form.
func rules(selects map[string]string) string {
	var parts []string
	for t, p := range selects {
		parts = append(parts, fmt.Sprintf(`%q:{"row":{"select":%s,"update":{}}}`, t, p))
	}
	return `{"tables":{` + strings.Join(parts, ",") + `}}`
}

// sameAST compares ASTs by meaning of their JSON, so that an empty and
// written as {"type":"and","conditions":[]} equals {"type":"and"}.
func sameAST(t *testing.T, got *zql.AST, want string) bool {
	t.Helper()
	w, err := zql.ParseAST([]byte(want))
	if err != nil {
		t.Fatalf("want: %v", err)
	}
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(w)
	return string(a) == string(b)
}

// TestRules_Transform checks worked examples of zero-cache's rule
// injection.
func TestRules_Transform(t *testing.T) {
	u1 := map[string]any{"sub": "u1", "role": "user"}
	tests := []struct {
		name     string
		selects  map[string]string
		authData map[string]any
		query    string
		want     string
	}{
		{"AnyoneCanWithRelated", map[string]string{"user": anyoneCan, "issue": anyoneCan}, u1,
			`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},"related":[{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"},"system":"client"}],"limit":3,"orderBy":[["modified","desc"]]}`,
			`{"table":"issue","where":{"type":"and","conditions":[{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="}]},"related":[{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner","where":{"type":"and","conditions":[]}},"system":"client"}],"limit":3,"orderBy":[["modified","desc"]]}`},
		{"RuleInExists", map[string]string{"user": anyoneCan, "issue": ownerIsSub}, u1,
			`{"table":"user","where":{"type":"correlatedSubquery","related":{"system":"client","correlation":{"parentField":["id"],"childField":["owner_id"]},"subquery":{"table":"issue","alias":"zsubq_issues","where":{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="}}},"op":"EXISTS"}}`,
			`{"table":"user","where":{"type":"and","conditions":[{"type":"correlatedSubquery","related":{"system":"client","correlation":{"parentField":["id"],"childField":["owner_id"]},"subquery":{"table":"issue","alias":"zsubq_issues","where":{"type":"and","conditions":[{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"literal","value":"u1"},"op":"="}]}}},"op":"EXISTS"}]}}`},
		{"LoggedOutBindsNull", map[string]string{"issue": ownerIsSub}, map[string]any{},
			`{"table":"issue"}`,
			`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"literal","value":null},"op":"="}}`},
		{"ExistsRule", map[string]string{"comment": onOwnIssues}, u1,
			`{"table":"comment","where":{"type":"simple","left":{"type":"column","name":"body"},"right":{"type":"literal","value":"%x%"},"op":"LIKE"},"limit":10}`,
			`{"table":"comment","where":{"type":"and","conditions":[{"type":"simple","left":{"type":"column","name":"body"},"right":{"type":"literal","value":"%x%"},"op":"LIKE"},{"type":"correlatedSubquery","related":{"system":"permissions","correlation":{"parentField":["issue_id"],"childField":["id"]},"subquery":{"table":"issue","alias":"zsubq_issue","where":{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"literal","value":"u1"},"op":"="}}},"op":"EXISTS"}]},"limit":10}`},
		{"DenyByDefault", map[string]string{"issue": anyoneCan}, u1,
			`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"i1"},"op":"="},"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"hidden":true,"subquery":{"table":"issue_label","alias":"labels","related":[{"correlation":{"parentField":["label_id"],"childField":["id"]},"subquery":{"table":"label","alias":"labels"},"system":"client"}]},"system":"client"}]}`,
			`{"table":"issue","where":{"type":"and","conditions":[{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"i1"},"op":"="}]},"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"hidden":true,"subquery":{"table":"issue_label","alias":"labels","where":{"type":"or","conditions":[]},"related":[{"correlation":{"parentField":["label_id"],"childField":["id"]},"subquery":{"table":"label","alias":"labels","where":{"type":"or","conditions":[]}},"system":"client"}]},"system":"client"}]}`},
		{"DeniedRootDropsFilter", map[string]string{}, u1,
			`{"table":"label","where":{"type":"simple","left":{"type":"column","name":"name"},"right":{"type":"literal","value":"bug"},"op":"="}}`,
			`{"table":"label","where":{"type":"or","conditions":[]}}`},
		{"ListClaimForEqualsIsFalse", map[string]string{"issue": ownerIsSub}, map[string]any{"sub": []any{"a"}},
			`{"table":"issue"}`,
			`{"table":"issue","where":{"type":"or","conditions":[]}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(rules(tt.selects))
			if err != nil {
				t.Fatal(err)
			}
			q, err := zql.ParseAST([]byte(tt.query))
			if err != nil {
				t.Fatal(err)
			}
			before, _ := json.Marshal(q)
			got := p.Transform(q, tt.authData)
			if !sameAST(t, got, tt.want) {
				b, _ := json.Marshal(got)
				t.Errorf("transform =\n%s\nwant\n%s", b, tt.want)
			}
			if after, _ := json.Marshal(q); string(after) != string(before) {
				t.Errorf("transform modified its input: %s", after)
			}
		})
	}
}

func TestParse(t *testing.T) {
	for _, raw := range []string{
		`{"tables":{"issue":{"row":{"select":[["deny",{"type":"and","conditions":[]}]]}}}}`,
		`{"tables":{"issue":{"row":{"selects":[]}}}}`,
		`{"tables":{"issue":{"row":{"select":[["allow",{"type":"and","conditions":[],"extra":1}]]}}}}`,
		`{"tables":{},"version":2}`,
		`not json`,
	} {
		if _, err := Parse(raw); err == nil || !strings.HasPrefix(err.Error(), "Could not parse upstream permissions") {
			t.Errorf("parse %s: err = %v; want a parse error", raw, err)
		}
	}
	p, err := Parse(`{"tables":{"issue":{"row":{"select":[],"insert":[],"update":{"preMutation":[]},"delete":[]},"cell":{"title":{"select":[]}}}}}`)
	if err != nil || len(p.selects["issue"]) != 0 {
		t.Errorf("parse full document = %v, %v", p, err)
	}
}
