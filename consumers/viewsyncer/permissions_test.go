package viewsyncer

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/streams"
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

// TestPermissions_Transform checks worked examples of zero-cache's rule
// injection.
func TestPermissions_Transform(t *testing.T) {
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
			p, err := parsePermissions(rules(tt.selects))
			if err != nil {
				t.Fatal(err)
			}
			q, err := zql.ParseAST([]byte(tt.query))
			if err != nil {
				t.Fatal(err)
			}
			before, _ := json.Marshal(q)
			got := p.transform(q, tt.authData)
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

func TestPermissions_Parse(t *testing.T) {
	for _, raw := range []string{
		`{"tables":{"issue":{"row":{"select":[["deny",{"type":"and","conditions":[]}]]}}}}`,
		`{"tables":{"issue":{"row":{"selects":[]}}}}`,
		`{"tables":{"issue":{"row":{"select":[["allow",{"type":"and","conditions":[],"extra":1}]]}}}}`,
		`{"tables":{},"version":2}`,
		`not json`,
	} {
		if _, err := parsePermissions(raw); err == nil || !strings.HasPrefix(err.Error(), "Could not parse upstream permissions") {
			t.Errorf("parse %s: err = %v; want a parse error", raw, err)
		}
	}
	p, err := parsePermissions(`{"tables":{"issue":{"row":{"select":[],"insert":[],"update":{"preMutation":[]},"delete":[]},"cell":{"title":{"select":[]}}}}}`)
	if err != nil || len(p.selects["issue"]) != 0 {
		t.Errorf("parse full document = %v, %v", p, err)
	}
}

// TestServer_Permissions runs legacy queries through deployed rules.
func TestServer_Permissions(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30, secret: captureSecret})
	deploy := func(doc string) {
		t.Helper()
		e.tx("zpeer", "permissions", streams.Change{Op: streams.OpUpdate, New: streams.Row{
			"lock": raw(true), "permissions": json.RawMessage(doc), "hash": raw("h")}})
	}
	token := func(sub string) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "exp": time.Now().Unix() + 3600}).SignedString([]byte(captureSecret))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	rows := func(p pokeSummary, op, table string) int {
		n := 0
		for _, s := range p.patches {
			if strings.HasPrefix(s, "row ") && strings.Contains(s, `"op":"`+op+`"`) && strings.Contains(s, `"tableName":"`+table+`"`) {
				n++
			}
		}
		return n
	}
	restricted := rules(map[string]string{"user": anyoneCan, "issue": ownerIsSub, "comment": onOwnIssues})
	deploy(restricted)
	queries := []string{
		put("issues", `{"table":"issue","orderBy":[["id","asc"]]}`, 0),
		put("labels", `{"table":"label","orderBy":[["id","asc"]]}`, 0),
		put("comments", `{"table":"comment","orderBy":[["id","asc"]]}`, 0),
	}
	// u000003 owns issues 2, 12 and 22 (seedRows), with 2 comments each.
	c := connect(t, e, dialOpts{group: "perm", client: "c1", user: "u000003", token: token("u000003"), init: initFrame(testSchema, queries...)})
	t.Run("RuleBoundToSub", func(t *testing.T) {
		p := c.hydrated()
		if got := rows(p, "put", "issue"); got != 3 {
			t.Errorf("issue rows = %d; want u000003's 3", got)
		}
		for _, s := range p.patches {
			if strings.Contains(s, `"tableName":"issue"`) && !strings.Contains(s, `"owner_id":"u000003"`) {
				t.Errorf("synced %s; want only u000003's issues", s)
			}
		}
		// The comment rule's EXISTS reads issues but never syncs them.
		if got := rows(p, "put", "comment"); got != 6 {
			t.Errorf("comment rows = %d; want the 6 on u000003's issues", got)
		}
		// label has no rule: the query is got, with no rows.
		if !has(p, `got {"hash":"labels","op":"put"}`) || rows(p, "put", "label") != 0 {
			t.Errorf("hydration = %v; want labels got with no rows", p.patches)
		}
	})
	t.Run("RulesChangeRehydrates", func(t *testing.T) {
		deploy(rules(map[string]string{"user": anyoneCan, "issue": anyoneCan, "label": anyoneCan, "comment": anyoneCan}))
		p := c.poke()
		if rows(p, "put", "issue") != 27 || rows(p, "put", "label") != 20 || rows(p, "put", "comment") != 54 {
			t.Errorf("after widening: %d issue, %d label, %d comment puts; want 27, 20, 54",
				rows(p, "put", "issue"), rows(p, "put", "label"), rows(p, "put", "comment"))
		}
		deploy(restricted)
		p = c.poke()
		if rows(p, "del", "issue") != 27 || rows(p, "del", "label") != 20 || rows(p, "del", "comment") != 54 || rows(p, "put", "") != 0 {
			t.Errorf("after narrowing: %d issue, %d label, %d comment dels; want 27, 20, 54 and no puts",
				rows(p, "del", "issue"), rows(p, "del", "label"), rows(p, "del", "comment"))
		}
	})
	t.Run("UpdateAuthRebinds", func(t *testing.T) {
		byClaim := rules(map[string]string{"issue": strings.ReplaceAll(ownerIsSub, `"field":"sub"`, `"field":"owner"`)})
		deploy(byClaim)
		sign := func(owner string) string {
			s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "u000005", "owner": owner}).SignedString([]byte(captureSecret))
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		d := connect(t, e, dialOpts{group: "perm-auth", client: "c1", user: "u000005", token: sign("u000003"), init: initFrame(testSchema, queries[0])})
		if p := d.hydrated(); rows(p, "put", "issue") != 3 {
			t.Fatalf("hydration = %v; want u000003's 3 issues", p.patches)
		}
		d.send(`["updateAuth",{"auth":"` + sign("u000004") + `"}]`)
		p := d.poke()
		if rows(p, "del", "issue") != 3 || rows(p, "put", "issue") != 3 || !has(p, `row {"id":{"id":"i0000002"},"op":"del","tableName":"issue"}`) {
			t.Errorf("after updateAuth = %v; want u000003's issues replaced by u000004's", p.patches)
		}
		// c saw both rule changes: its issues went and came back.
		deploy(restricted)
		if p := c.poke(); rows(p, "del", "issue") != 3 {
			t.Errorf("c after the owner-claim rule = %v; want its 3 issues deleted", p.patches)
		}
		if p := c.poke(); rows(p, "put", "issue") != 3 {
			t.Errorf("c after the restore = %v; want its 3 issues back", p.patches)
		}
	})
	t.Run("LoggedOut", func(t *testing.T) {
		d := connect(t, e, dialOpts{group: "perm-anon", client: "c1", init: initFrame(testSchema, queries...)})
		p := d.hydrated()
		if n := countPrefix(p, "row "); n != 0 {
			t.Errorf("logged-out hydration has %d rows; want none", n)
		}
	})
	t.Run("NoneDeployed", func(t *testing.T) {
		e.tx("zpeer", "permissions", streams.Change{Op: streams.OpUpdate, New: streams.Row{
			"lock": raw(true), "permissions": raw(nil), "hash": raw(nil)}})
		p := c.poke()
		if rows(p, "del", "issue") != 3 || rows(p, "del", "comment") != 6 || rows(p, "put", "") != 0 {
			t.Errorf("with no rules = %v; want every row deleted", p.patches)
		}
	})
}
