package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
)

// demoMutatePath is the demo's push endpoint, in `jetsync run` and
// `jetsync demo-api`.
const demoMutatePath = "/demo/api/mutate"

// TestDemo_PushEndpoint sends pushes, as the view-syncer forwards them, to
// the push endpoint that `jetsync run` builds in for the demo page, and
// checks it keeps zero's rules: one transaction per mutation with the
// lastMutationID bump, a mutation pushed again answered alreadyProcessed, a
// gap failing the push as oooMutation, a failing mutator's error recorded
// in <shard>.mutations (its data rolled back), cleanup deleting results, and
// a bad push answered PushFailed.
func TestDemo_PushEndpoint(t *testing.T) {
	dataDir := filepath.Join(dataRoot(t), "data")
	srv := startDemoRun(t, dataDir)
	pgURL := str(t, srv.logRecord(t, "demo upstream ready: connect with psql", 90*time.Second), "url")
	mutateURL := str(t, srv.logRecord(t, "demo page: open it in a browser", 30*time.Second), "mutate_url")
	httpPort := int(srv.logRecord(t, "http listening", 30*time.Second)["port"].(float64))
	// The shard's tables exist once the change-streamer set the upstream up.
	polltest.Until(t, 90*time.Second, "GET / to answer 200", func() bool {
		_, code := get(t, fmt.Sprintf("http://127.0.0.1:%d/", httpPort))
		return code == http.StatusOK
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.WithoutCancel(ctx))

	push := func(query string, body any) map[string]any {
		t.Helper()
		b, _ := json.Marshal(body)
		resp, err := http.Post(mutateURL+query, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		var v map[string]any
		if err := json.Unmarshal(out, &v); err != nil || resp.StatusCode != 200 {
			t.Fatalf("push answered %d %q", resp.StatusCode, out)
		}
		return v
	}
	mutation := func(id int, name string, args any) map[string]any {
		return map[string]any{"type": "custom", "id": id, "clientID": "c1", "name": name, "args": []any{args}, "timestamp": 1}
	}
	body := func(ms ...map[string]any) map[string]any {
		return map[string]any{"clientGroupID": "cg1", "pushVersion": 1, "timestamp": 1, "requestID": "r1", "mutations": ms}
	}
	const q = "?schema=zero_0&appID=zero"
	now := float64(time.Now().UnixMilli())
	lmid := func() int64 {
		var n int64
		if err := pg.QueryRow(ctx, `SELECT "lastMutationID" FROM zero_0.clients WHERE "clientGroupID" = 'cg1' AND "clientID" = 'c1'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ok := func(id int) map[string]any {
		return map[string]any{"id": map[string]any{"clientID": "c1", "id": float64(id)}, "result": map[string]any{}}
	}
	check := func(what string, got, want any) {
		t.Helper()
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", what, d)
		}
	}

	create := mutation(1, "issue.create", map[string]any{"id": "p1", "title": "Pushed", "created": now, "modified": now})
	check("create", push(q, body(create)), map[string]any{"kind": "MutateResponse", "mutations": []any{ok(1)}})
	var title string
	if err := pg.QueryRow(ctx, `SELECT title FROM issue WHERE id = 'p1'`).Scan(&title); err != nil || title != "Pushed" {
		t.Errorf("issue p1 = %q, %v; want the created row", title, err)
	}
	check("lastMutationID after the create", lmid(), int64(1))

	again := push(q, body(create))["mutations"].([]any)[0].(map[string]any)["result"].(map[string]any)
	check("the create pushed again", again["error"], "alreadyProcessed")
	check("lastMutationID after the repeat", lmid(), int64(1))

	gap := push(q, body(mutation(3, "issue.update", map[string]any{"id": "p1", "title": "x", "modified": now})))
	check("a gap", []any{gap["kind"], gap["reason"], gap["mutationIDs"]},
		[]any{"PushFailed", "oooMutation", []any{map[string]any{"clientID": "c1", "id": float64(3)}}})
	check("lastMutationID after the gap", lmid(), int64(1))

	// Two in one push: a failing mutator, then one that works.
	res := push(q, body(
		mutation(2, "issue.update", map[string]any{"id": "p1", "title": "  ", "modified": now}),
		mutation(3, "issue.setOpen", map[string]any{"id": "p1", "open": false, "modified": now})))
	failed := map[string]any{"id": map[string]any{"clientID": "c1", "id": float64(2)},
		"result": map[string]any{"error": "app", "message": "an issue needs a title"}}
	check("a failing mutator then a good one", res, map[string]any{"kind": "MutateResponse", "mutations": []any{failed, ok(3)}})
	var open bool
	if err := pg.QueryRow(ctx, `SELECT title, open FROM issue WHERE id = 'p1'`).Scan(&title, &open); err != nil || title != "Pushed" || open {
		t.Errorf("issue p1 = %q open=%v, %v; want the title kept and the issue closed", title, open, err)
	}
	var result string
	if err := pg.QueryRow(ctx, `SELECT result::text FROM zero_0.mutations WHERE "clientGroupID" = 'cg1' AND "clientID" = 'c1' AND "mutationID" = 2`).Scan(&result); err != nil {
		t.Errorf("no mutations row for the failed mutator: %v", err)
	} else {
		var got map[string]any
		_ = json.Unmarshal([]byte(result), &got)
		check("the recorded result", got, failed["result"])
	}
	check("lastMutationID after both", lmid(), int64(3))

	unknown := push(q, body(mutation(4, "issue.nope", map[string]any{})))["mutations"].([]any)[0].(map[string]any)["result"].(map[string]any)
	check("an unknown mutator", unknown["error"], "app")

	cleanup := map[string]any{"type": "custom", "id": 0, "clientID": "c1", "name": "_zero_cleanupResults",
		"args": []any{map[string]any{"clientGroupID": "cg1", "clientID": "c1", "upToMutationID": 4}}, "timestamp": 1}
	check("cleanup", push(q, body(cleanup)), map[string]any{"kind": "MutateResponse", "mutations": []any{}})
	var left int
	if err := pg.QueryRow(ctx, `SELECT count(*) FROM zero_0.mutations WHERE "clientGroupID" = 'cg1'`).Scan(&left); err != nil || left != 0 {
		t.Errorf("mutation results after cleanup = %d, %v; want none", left, err)
	}

	for name, tc := range map[string]struct {
		query  string
		body   any
		reason string
	}{
		"not JSON":        {q, "not a push", "parse"},
		"another schema":  {"?schema=other_0&appID=other", body(mutation(5, "issue.create", map[string]any{})), "parse"},
		"push version 2":  {q, map[string]any{"clientGroupID": "cg1", "pushVersion": 2, "mutations": []any{}}, "unsupportedPushVersion"},
		"a CRUD mutation": {q, body(map[string]any{"type": "crud", "id": 5, "clientID": "c1", "name": "_zero_crud", "args": []any{}}), "internal"},
	} {
		got := push(tc.query, tc.body)
		if got["kind"] != "PushFailed" || got["reason"] != tc.reason || got["origin"] != "server" {
			t.Errorf("%s: answered %v; want PushFailed %s from the server", name, got, tc.reason)
		}
	}
	check("lastMutationID after the bad pushes", lmid(), int64(4))
}

// TestDemo_RealUpstream runs `jetsync run` against a Postgres of its own
// holding the demo schema, with JETSYNC_DEMO_PAGE: / stays the readiness
// check even for a browser, as in zero-cache, the page answers at /demo,
// and its built-in push endpoint writes to that upstream.
func TestDemo_RealUpstream(t *testing.T) {
	pgBin(t)
	demoSQL, err := os.ReadFile(filepath.Join("..", "cmd", "jetsync", "demo.sql"))
	if err != nil {
		t.Fatal(err)
	}
	upstream := pgtest.NewDB(t, pgtest.Start(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := pgx.Connect(ctx, upstream)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(context.WithoutCancel(ctx))
	if _, err := pg.Exec(ctx, string(demoSQL)+readCompose(t).Configs["demo-permissions"].Content); err != nil {
		t.Fatalf("load the demo: %v", err)
	}
	port := freePort(t)
	srv := start(t, []string{
		"JETSYNC_DATA_DIR=" + filepath.Join(t.TempDir(), "data"),
		"ZERO_UPSTREAM_DB=" + upstream,
		"ZERO_PORT=" + strconv.Itoa(port),
		"JETSYNC_NATS_LISTEN=",
		"JETSYNC_DEMO_PAGE=true",
		"ZERO_LOG_FORMAT=json",
	}, "run")
	rec := srv.logRecord(t, "demo page: open it in a browser", 60*time.Second)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if got := str(t, rec, "url"); got != base+"/demo" {
		t.Errorf("demo page logged at %q; want %q", got, base+"/demo")
	}
	waitHealthy(t, srv, base, 90*time.Second)

	get := func(path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Accept", "text/html,*/*;q=0.8")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/"); code != 200 || body != "OK" {
		t.Errorf("GET / from a browser with a real upstream = %d %.60q; want the readiness answer 200 OK", code, body)
	}
	if code, body := get("/demo"); code != 200 || !strings.Contains(body, "/demo/demo.js") {
		t.Errorf("GET /demo = %d %.60q; want the page", code, body)
	}

	now := float64(time.Now().UnixMilli())
	b, _ := json.Marshal(map[string]any{"clientGroupID": "cg1", "pushVersion": 1, "timestamp": 1, "requestID": "r1",
		"mutations": []any{map[string]any{"type": "custom", "id": 1, "clientID": "c1", "name": "comment.add",
			"args": []any{map[string]any{"id": "cx", "issue_id": "i3", "body": "pushed", "created": now}}, "timestamp": 1}}})
	resp, err := http.Post(str(t, rec, "mutate_url")+"?schema=zero_0&appID=zero", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(out), `"kind":"MutateResponse"`) || strings.Contains(string(out), `"error"`) {
		t.Errorf("push answered %s; want the mutation applied", out)
	}
	var body string
	if err := pg.QueryRow(ctx, `SELECT body FROM comment WHERE id = 'cx'`).Scan(&body); err != nil || body != "pushed" {
		t.Errorf("comment cx = %q, %v; want the pushed row upstream", body, err)
	}
}
