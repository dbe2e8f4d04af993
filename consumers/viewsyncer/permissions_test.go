package viewsyncer

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

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
