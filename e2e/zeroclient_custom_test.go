package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jetsync/jetsync/internal/polltest"
)

// apiServer is client/api-server.mjs: the app's query and mutate endpoints,
// built on the package's handleQueryRequest and handleMutateRequest.
type apiServer struct {
	url   string
	stdin io.WriteCloser // closing it stops the server
}

func startAPIServer(t *testing.T, node, upstream string) *apiServer {
	t.Helper()
	cmd := exec.Command(node, "api-server.mjs", "--upstream", upstream, "--auth-secret", zeroSecret)
	cmd.Dir = "client"
	cmd.Env = baseEnv()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := startProc(t, "api-server", cmd)
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case l := <-lines:
		var ev struct{ URL string }
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.URL == "" {
			t.Fatalf("api-server said %q", l)
		}
		a := &apiServer{url: ev.URL, stdin: stdin}
		t.Cleanup(func() { a.stdin.Close() })
		return a
	case <-time.After(30 * time.Second):
		t.Fatalf("api-server did not listen:\n%s", p.stderr.String())
	}
	return nil
}

// control posts a test-control command (api-server.mjs's /control/*).
func (a *apiServer) control(t *testing.T, what string, body any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(a.url+"/control/"+what, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

type apiRequest struct {
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
}

func (a *apiServer) requests(t *testing.T) []apiRequest {
	t.Helper()
	resp, err := http.Get(a.url + "/control/requests")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []apiRequest
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestZeroClient_Custom runs the real client's synced queries and custom
// mutators against jetsync with JWT auth on and api-server.mjs behind
// ZERO_QUERY_URL and ZERO_MUTATE_URL.
func TestZeroClient_Custom(t *testing.T) {
	app := newCVRApp(t, 1000)
	node, upstream, pg := app.node, app.upstream, app.pg
	api := startAPIServer(t, node, upstream)
	p := start(t, runEnv(t, upstream, 0,
		"ZERO_QUERY_URL="+api.url+"/query",
		"ZERO_MUTATE_URL="+api.url+"/mutate",
		"ZERO_AUTH_REVALIDATE_INTERVAL_SECONDS=1",
		"ZERO_AUTH_RETRANSFORM_INTERVAL_SECONDS=2",
	), "run")
	port := int(p.logRecord(t, "http listening", 60*time.Second)["port"].(float64))
	srv := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, p, srv, 90*time.Second)

	ctx := context.Background()

	d := startDriver(t, node)
	d.open(t, "a", srv, "u000001", signToken(t, zeroSecret, "u000001", time.Hour), "a")
	d.waitState(t, "a", "connected", 30*time.Second)

	t.Run("Shapes", func(t *testing.T) {
		// The nested shapes' related rows as the client's views hold them:
		// a one-to-many in the subquery's order, the many-to-many through
		// the hidden junction in its primary-key order.
		const comments = `(SELECT coalesce(jsonb_agg(jsonb_build_object('id', c.id, 'issue_id', c.issue_id, 'body', c.body, 'created', extract(epoch from c.created) * 1000) ORDER BY c.created, c.id), '[]') FROM comment c WHERE c.issue_id = i.id)`
		const labels = `(SELECT coalesce(jsonb_agg(jsonb_build_object('id', l.id, 'name', l.name) ORDER BY il.label_id), '[]') FROM issue_label il JOIN label l ON l.id = il.label_id WHERE il.issue_id = i.id)`
		shapes := []struct {
			shape string
			args  map[string]any
			sql   string // the view as Postgres has it
			one   bool   // the view is the one row (or null), not a list
		}{
			{"openByModified", map[string]any{"limit": 3}, `SELECT jsonb_build_object('owner', (SELECT json_build_object('id', u.id, 'name', u.name) FROM "user" u WHERE u.id = i.owner_id)) || ` + issueJSON + `::jsonb FROM issue i WHERE i.open ORDER BY i.modified DESC, i.id LIMIT 3`, false},
			{"labelsAll", nil, `SELECT json_build_object('id', l.id, 'name', l.name) FROM label l ORDER BY l.id`, false},
			{"issuesOfOwner", map[string]any{"ownerID": "u000003", "limit": 5}, `SELECT ` + issueJSON + ` FROM issue i WHERE i.owner_id = 'u000003' ORDER BY i.modified DESC, i.id LIMIT 5`, false},
			{"issuesByIDs", map[string]any{"ids": []string{"i0000001", "i0000002"}}, `SELECT ` + issueJSON + ` FROM issue i WHERE i.id IN ('i0000001', 'i0000002') ORDER BY i.id`, false},
			{"closedOrOwnedBy", map[string]any{"ownerID": "u000002", "limit": 5}, `SELECT ` + issueJSON + ` FROM issue i WHERE NOT i.open OR i.owner_id = 'u000002' ORDER BY i.id LIMIT 5`, false},
			{"issueWithComments", map[string]any{"id": "i0000007"}, `SELECT ` + issueJSON + `::jsonb || jsonb_build_object('comments', ` + comments + `) FROM issue i WHERE i.id = 'i0000007'`, true},
			{"issuesWithLabels", map[string]any{"limit": 3}, `SELECT ` + issueJSON + `::jsonb || jsonb_build_object('labels', ` + labels + `) FROM issue i ORDER BY i.id LIMIT 3`, false},
			{"issuesWithLabel", map[string]any{"labelID": "l03", "limit": 3}, `SELECT ` + issueJSON + ` FROM issue i WHERE EXISTS (SELECT FROM issue_label il JOIN label l ON l.id = il.label_id WHERE il.issue_id = i.id AND l.id = 'l03') ORDER BY i.modified DESC, i.id LIMIT 3`, false},
			// Exclusive start: the rows after i0000505 in (modified DESC, id) order.
			{"pageAfter", map[string]any{"after": map[string]any{"id": "i0000505", "modified": 999086505}, "limit": 3}, `SELECT ` + issueJSON + ` FROM issue i WHERE i.modified < 999086505 OR (i.modified = 999086505 AND i.id > 'i0000505') ORDER BY i.modified DESC, i.id LIMIT 3`, false},
		}
		for _, s := range shapes {
			t.Run(s.shape, func(t *testing.T) {
				d.do(t, map[string]any{"cmd": "query", "client": "a", "id": "synced-" + s.shape, "shape": s.shape, "args": s.args, "synced": true})
				d.waitRowsEqual(t, "a", "synced-"+s.shape, func() json.RawMessage {
					rows := sqlRows(t, pg, s.sql)
					if !s.one {
						return rows
					}
					var one []json.RawMessage
					if err := json.Unmarshal(rows, &one); err != nil || len(one) > 1 {
						t.Fatalf("%s: %d rows, %v; want at most one", s.sql, len(one), err)
					}
					if len(one) == 0 {
						return json.RawMessage(`null`)
					}
					return one[0]
				})
			})
		}
	})

	issue := `SELECT ` + issueJSON + ` FROM issue i WHERE i.id = 'i0000004'`
	t.Run("Mutator", func(t *testing.T) {
		d.do(t, map[string]any{"cmd": "query", "client": "a", "id": "issue4", "shape": "issuesByIDs", "args": map[string]any{"ids": []string{"i0000004"}}, "synced": true})
		d.waitRowsEqual(t, "a", "issue4", func() json.RawMessage { return sqlRows(t, pg, issue) })
		ack := d.do(t, map[string]any{"cmd": "mutate", "client": "a", "id": "m1", "name": "issue.setTitle",
			"args": map[string]any{"id": "i0000004", "title": "set by a mutator ✓", "modified": 4.5}})
		if !strings.Contains(string(ack.Rows), `"success"`) {
			t.Errorf("optimistic result %s; want success", ack.Rows)
		}
		res := waitMutation(t, d, "a", "m1")
		if !strings.Contains(string(res.Rows), `"success"`) {
			t.Errorf("server result %s; want success", res.Rows)
		}
		var title string
		if err := pg.QueryRow(ctx, `SELECT title FROM issue WHERE id = 'i0000004'`).Scan(&title); err != nil || title != "set by a mutator ✓" {
			t.Errorf("Postgres title %q, %v; want the mutator's", title, err)
		}
		d.waitRowsEqual(t, "a", "issue4", func() json.RawMessage { return sqlRows(t, pg, issue) })
	})

	t.Run("MutatorThrows", func(t *testing.T) {
		d.do(t, map[string]any{"cmd": "mutate", "client": "a", "id": "m2", "name": "failing", "args": map[string]any{"why": "e2e"}})
		res := waitMutation(t, d, "a", "m2")
		var details struct {
			Type  string
			Error struct{ Type, Message string }
		}
		_ = json.Unmarshal(res.Rows, &details)
		if details.Type != "error" || details.Error.Type != "app" || details.Error.Message != "server rejected: e2e" {
			t.Errorf("server result %s; want the app error", res.Rows)
		}
		// Acknowledged, then cleaned up upstream.
		polltest.Until(t, 30*time.Second, "the mutation result to be deleted upstream", func() bool {
			var n int
			_ = pg.QueryRow(ctx, `SELECT count(*) FROM `+zeroAppID+`_0.mutations`).Scan(&n)
			return n == 0
		})
	})

	t.Run("UpdateAuth", func(t *testing.T) {
		fresh := signToken(t, zeroSecret, "u000001", 2*time.Hour)
		d.do(t, map[string]any{"cmd": "connect", "client": "a", "auth": fresh})
		polltest.Until(t, 30*time.Second, "a transform with the refreshed token", func() bool {
			for _, r := range api.requests(t) {
				if r.Path == "/query" && r.Headers["authorization"] == "Bearer "+fresh && strings.Contains(string(r.Body), "issuesByIDs") {
					return true
				}
			}
			return false
		})
	})

	t.Run("TransientDefers", func(t *testing.T) {
		api.control(t, "reset", map[string]any{})
		mark := d.mark()
		api.control(t, "fail", map[string]any{"path": "/query", "status": 500, "count": 8})
		// Two maintenance rounds' worth of attempts.
		polltest.Until(t, 60*time.Second, "the 500s to be served", func() bool {
			n := 0
			for _, r := range api.requests(t) {
				if r.Path == "/query" {
					n++
				}
			}
			return n > 8
		})
		for _, ev := range d.since(mark) {
			if ev.Event == "connection" && ev.Client == "a" && ev.State != "connected" {
				t.Errorf("client a went %s (%s) on a transient failure", ev.State, ev.Reason)
			}
		}
		api.control(t, "reset", map[string]any{})
	})

	t.Run("RevalidationUnauthorized", func(t *testing.T) {
		d.open(t, "b", srv, "u000001", signToken(t, zeroSecret, "u000001", time.Hour), "a")
		d.waitState(t, "b", "connected", 30*time.Second)
		d.do(t, map[string]any{"cmd": "query", "client": "b", "id": "issue4", "shape": "issuesByIDs", "args": map[string]any{"ids": []string{"i0000004"}}, "synced": true})
		d.waitRowsEqual(t, "b", "issue4", func() json.RawMessage { return sqlRows(t, pg, issue) })
		mark := d.mark()
		api.control(t, "fail", map[string]any{"path": "/query", "status": 401, "count": 1})
		var failed driverEvent
		polltest.Until(t, 30*time.Second, "a client to need auth", func() bool {
			for _, ev := range d.since(mark) {
				if ev.Event == "connection" && ev.State == "needs-auth" {
					failed = ev
					return true
				}
			}
			return false
		})
		other := "a"
		if failed.Client == "a" {
			other = "b"
		}
		t.Logf("client %s needs auth (%s); %s keeps syncing", failed.Client, failed.Reason, other)
		if _, err := pg.Exec(ctx, `UPDATE issue SET title = 'after a 401' WHERE id = 'i0000004'`); err != nil {
			t.Fatal(err)
		}
		d.waitRowsEqual(t, other, "issue4", func() json.RawMessage { return sqlRows(t, pg, issue) })
	})
}

// waitMutation waits for the server result of a "mutate" command.
func waitMutation(t *testing.T, d *zeroDriver, client, id string) driverEvent {
	t.Helper()
	var ev driverEvent
	polltest.Until(t, 30*time.Second, "mutation "+id+"'s server result", func() bool {
		var ok bool
		ev, ok = d.find(func(ev driverEvent) bool { return ev.Event == "mutation" && ev.Client == client && ev.ID == id })
		return ok
	})
	if ev.Error != "" {
		t.Fatalf("mutation %s: %s", id, ev.Error)
	}
	return ev
}
