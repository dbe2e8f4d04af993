// Package e2e drives the jetsync binary as a user would: built once without
// -race, started as child processes, checked from outside through psql, NATS,
// HTTP and the replica file.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// jetsyncBin is the binary under test: $JETSYNC_BIN, else ../bin/jetsync
// built by TestMain.
var jetsyncBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	jetsyncBin = os.Getenv("JETSYNC_BIN")
	if jetsyncBin == "" {
		root, err := filepath.Abs("..")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		jetsyncBin = filepath.Join(root, "bin", "jetsync")
		// Without -race: modernc SQLite is 18-23x slower under it.
		cmd := exec.Command("go", "build", "-o", jetsyncBin, "./cmd/jetsync")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build jetsync:", err)
			return 1
		}
	}
	// pgtest.Main stops the package's shared Postgres when the tests end.
	return pgtest.Main(m)
}

func pgBin(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("PGBIN")
	if dir == "" {
		dir = "/usr/lib/postgresql/15/bin"
	}
	if _, err := os.Stat(filepath.Join(dir, "initdb")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("postgres binaries missing under CI: %v", err)
		}
		t.Skipf("postgres binaries not installed: %v", err)
	}
	return dir
}

// dataRoot is a temporary directory the postgres user can traverse, unlike
// t.TempDir(), whose parent is root-only.
func dataRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "jetsync-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	err            error
}

// baseEnv is the test's environment without any jetsync or zero-cache
// setting, so that the host's can't leak in (ZERO_UPSTREAM_DB above all).
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ZERO_") || strings.HasPrefix(kv, "JETSYNC_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// start runs jetsync in its own process group. Cleanup asks it to stop with
// SIGTERM, then kills the group.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(jetsyncBin, args...), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = append(baseEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start jetsync %v: %v", args, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t, 20*time.Second)
		if t.Failed() {
			t.Logf("jetsync %v stderr:\n%s", args, p.stderr.String())
		}
	})
	return p
}

// stop sends SIGTERM and waits; past the timeout it kills the process group.
// It returns the exit code, or -1 when it had to kill.
func (p *proc) stop(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return -1
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// logRecord waits for a JSON log line with this msg and returns it.
func (p *proc) logRecord(t *testing.T, msg string, timeout time.Duration) map[string]any {
	t.Helper()
	var rec map[string]any
	polltest.Until(t, timeout, "log "+strconv.Quote(msg), func() bool {
		if p.exited() {
			t.Fatalf("jetsync exited (%v) before logging %q:\n%s", p.err, msg, p.stderr.String())
		}
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var r map[string]any
			if json.Unmarshal(sc.Bytes(), &r) == nil && r["msg"] == msg {
				rec = r
				return true
			}
		}
		return false
	})
	return rec
}

// startDemoRun starts `jetsync run` with its demo upstream, in dataDir and
// on free ports, logging JSON; the demo Postgres is stopped at cleanup even
// if jetsync could not stop it.
func startDemoRun(t *testing.T, dataDir string, env ...string) *proc {
	t.Helper()
	bin := pgBin(t)
	t.Cleanup(func() { stopStrayPostgres(t, bin, filepath.Join(dataDir, "postgres")) })
	return start(t, append([]string{
		"JETSYNC_DATA_DIR=" + dataDir,
		"ZERO_PORT=0",
		"JETSYNC_NATS_LISTEN=127.0.0.1:0",
		"JETSYNC_DEMO_PG_PORT=0",
		"JETSYNC_PG_BIN=" + bin,
		"ZERO_LOG_FORMAT=json",
	}, env...), "run")
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"run", "--help"}, {"tail", "-h"}, {"replay", "--help"}} {
		out, err := exec.Command(jetsyncBin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("jetsync %v: %v\n%s", args, err, out)
		}
		if !strings.Contains(string(out), "Usage: jetsync") {
			t.Errorf("jetsync %v printed no usage:\n%s", args, out)
		}
	}
	if err := exec.Command(jetsyncBin, "no-such-command").Run(); err == nil {
		t.Error("jetsync no-such-command exited 0")
	}
}

// TestRun_FreshMachine is acceptance point 3: `jetsync run` with no upstream
// comes up with embedded NATS and a demo Postgres, and a row inserted with
// psql reaches `jetsync tail`, the replica, and a plain nats.go consumer of
// the documented subject.
func TestRun_FreshMachine(t *testing.T) {
	bin := pgBin(t)
	root := dataRoot(t)
	dataDir := filepath.Join(root, "data")
	srv := startDemoRun(t, dataDir)
	natsURL := str(t, srv.logRecord(t, "nats listening", 30*time.Second), "url")
	pgURL := str(t, srv.logRecord(t, "demo upstream ready: connect with psql", 90*time.Second), "url")
	httpPort := int(srv.logRecord(t, "http listening", 30*time.Second)["port"].(float64))
	if !strings.HasPrefix(natsURL, "nats://127.0.0.1:") || strings.HasSuffix(natsURL, ":4222") {
		t.Errorf("nats url %q: want 127.0.0.1 on a free port", natsURL)
	}

	t.Run("DemoPostgresPermissions", func(t *testing.T) { checkPGPermissions(t, filepath.Join(dataDir, "postgres")) })

	t.Run("Health", func(t *testing.T) {
		// / answers OK once the replica is ready, as zero-cache's does.
		var body string
		var code int
		polltest.Until(t, 90*time.Second, "GET / to answer 200", func() bool {
			body, code = get(t, fmt.Sprintf("http://127.0.0.1:%d/", httpPort))
			return code == http.StatusOK
		})
		if body != "OK" {
			t.Errorf("GET / = %d %q; want 200 OK", code, body)
		}
	})

	// The initial sync has landed once the demo rows are in the replica.
	replicaFile := filepath.Join(dataDir, "replica.db")
	db := openReplica(t, replicaFile)
	polltest.Until(t, 90*time.Second, "the demo rows in the replica", func() bool {
		var n int
		return db.QueryRow(`SELECT count(*) FROM issue`).Scan(&n) == nil && n == 4
	})
	var demoTitle string
	if err := db.QueryRow(`SELECT title FROM issue WHERE id = 'i4'`).Scan(&demoTitle); err != nil || demoTitle != "Unicode titles: ünïcødé ✓" {
		t.Errorf("replica issue i4 title = %q, %v; want the demo row", demoTitle, err)
	}

	// Consumers that attach from outside, before the insert.
	tail := start(t, []string{"JETSYNC_NATS_URL=" + natsURL, "ZERO_LOG_FORMAT=json"}, "tail", "--json", "--table", "issue")
	tail.logRecord(t, "tailing", 30*time.Second)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	subject := "jetsync.zero_0.changes.public.issue" // as documented in streams/README.md
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	const (
		id       = "e2e-1"
		title    = "hello from psql ✓ 'quoted'"
		modified = 1234.5
		created  = "2024-02-03T04:05:06.789Z"
	)
	createdMs := float64(time.Date(2024, 2, 3, 4, 5, 6, 789e6, time.UTC).UnixMilli())
	psql := exec.Command(filepath.Join(bin, "psql"), pgURL, "-v", "ON_ERROR_STOP=1", "-c",
		fmt.Sprintf(`INSERT INTO issue (id, title, open, modified, owner_id, created) VALUES ('%s', '%s', true, %v, 'u1', '%s')`,
			id, strings.ReplaceAll(title, "'", "''"), modified, created))
	psql.Env = baseEnv()
	if out, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("psql insert: %v\n%s", err, out)
	}

	checkRow := func(t *testing.T, where string, row map[string]json.RawMessage) {
		t.Helper()
		want := map[string]any{"id": id, "title": title, "open": true, "modified": modified, "owner_id": "u1", "created": createdMs}
		for col, w := range want {
			var got any
			if err := json.Unmarshal(row[col], &got); err != nil {
				t.Errorf("%s: column %s = %s: %v", where, col, row[col], err)
				continue
			}
			if g, ok := got.(float64); ok {
				if math.Abs(g-w.(float64)) > 1e-6 {
					t.Errorf("%s: %s = %v; want %v", where, col, got, w)
				}
				continue
			}
			if got != w {
				t.Errorf("%s: %s = %#v; want %#v", where, col, got, w)
			}
		}
	}

	t.Run("Tail", func(t *testing.T) {
		var ev struct {
			Schema, Table string
			Op            string
			Watermark     string
			New           map[string]json.RawMessage
		}
		polltest.Until(t, 30*time.Second, "the insert in jetsync tail", func() bool {
			for line := range strings.SplitSeq(tail.stdout.String(), "\n") {
				if json.Unmarshal([]byte(line), &ev) == nil && ev.Op == "insert" && string(ev.New["id"]) == `"`+id+`"` {
					return true
				}
			}
			return false
		})
		if ev.Schema != "public" || ev.Table != "issue" || ev.Watermark == "" {
			t.Errorf("tail event = %+v; want public.issue with a watermark", ev)
		}
		checkRow(t, "tail", ev.New)
	})

	t.Run("NATSSubscriber", func(t *testing.T) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			msg, err := sub.NextMsg(time.Until(deadline))
			if err != nil {
				t.Fatalf("no insert of %s on %s: %v", id, subject, err)
			}
			m, err := streams.Decode(msg.Data)
			if err != nil {
				t.Fatalf("decode message on %s: %v", subject, err)
			}
			last := m.Parts[len(m.Parts)-1]
			if got, want := msg.Header.Get(streams.HeaderWatermark), last.Watermark; got != want {
				t.Errorf("%s header = %q; want the last part's watermark %q", streams.HeaderWatermark, got, want)
			}
			if got, want := msg.Header.Get(streams.HeaderMsgID), streams.MsgID(m.Parts[0].Watermark, m.Parts[0].Num); got != want {
				t.Errorf("%s header = %q; want %q", streams.HeaderMsgID, got, want)
			}
			for _, p := range m.Parts {
				for _, c := range p.Changes {
					if c.Op == streams.OpInsert && string(c.New["id"]) == `"`+id+`"` {
						checkRow(t, "nats subscriber", c.New)
						return
					}
				}
			}
		}
	})

	t.Run("JetStreamConsumer", func(t *testing.T) {
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cons, err := js.OrderedConsumer(ctx, "JETSYNC_zero_0_CHANGES", jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
		if err != nil {
			t.Fatal(err)
		}
		it, err := cons.Messages()
		if err != nil {
			t.Fatal(err)
		}
		defer it.Stop()
		for {
			msg, err := it.Next(jetstream.NextContext(ctx))
			if err != nil {
				t.Fatalf("no insert of %s in the stream: %v", id, err)
			}
			m, err := streams.Decode(msg.Data())
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range m.Parts {
				for _, c := range p.Changes {
					if c.Op == streams.OpInsert && string(c.New["id"]) == `"`+id+`"` {
						checkRow(t, "jetstream consumer", c.New)
						return
					}
				}
			}
		}
	})

	t.Run("Replica", func(t *testing.T) {
		var (
			gotTitle, owner string
			open            int64
			mod, cr         float64
		)
		polltest.Until(t, 30*time.Second, "the insert in the replica", func() bool {
			return db.QueryRow(`SELECT title, open, modified, owner_id, created FROM issue WHERE id = ?`, id).
				Scan(&gotTitle, &open, &mod, &owner, &cr) == nil
		})
		if gotTitle != title || open != 1 || mod != modified || owner != "u1" || math.Abs(cr-createdMs) > 1e-3 {
			t.Errorf("replica row = (%q, %d, %v, %q, %v); want (%q, 1, %v, u1, %v)", gotTitle, open, mod, owner, cr, title, modified, createdMs)
		}
	})

	t.Run("Metrics", func(t *testing.T) {
		body, code := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", httpPort))
		if code != http.StatusOK {
			t.Fatalf("GET /metrics = %d", code)
		}
		var found bool
		for line := range strings.SplitSeq(body, "\n") {
			if !strings.HasPrefix(line, "zero_replication_") {
				continue
			}
			fields := strings.Fields(line)
			if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil && v > 0 {
				found = true
			}
		}
		if !found {
			t.Errorf("/metrics has no non-zero zero_replication_* sample:\n%s", body)
		}
	})

	t.Run("Replay", func(t *testing.T) {
		out, err := replay(natsURL, "--json", "--table", "issue")
		if err != nil {
			t.Fatalf("jetsync replay: %v\n%s", err, out)
		}
		var inserts, backfilled int
		for line := range strings.SplitSeq(out, "\n") {
			var ev struct {
				Op  string
				New map[string]json.RawMessage
			}
			if json.Unmarshal([]byte(line), &ev) != nil {
				continue
			}
			switch {
			case ev.Op == "backfill":
				backfilled++
			case ev.Op == "insert" && string(ev.New["id"]) == `"`+id+`"`:
				inserts++
				checkRow(t, "replay", ev.New)
			}
		}
		if inserts != 1 || backfilled != 4 {
			t.Errorf("replay --table issue printed %d inserts of %s and %d backfilled rows; want 1 and 4:\n%s", inserts, id, backfilled, out)
		}
	})

	t.Run("ReplayInto", func(t *testing.T) {
		file := filepath.Join(root, "replayed.db")
		if out, err := replay(natsURL, "--into", file); err != nil {
			t.Fatalf("jetsync replay --into: %v\n%s", err, out)
		}
		rebuilt := openReplica(t, file)
		for _, table := range []string{`"user"`, "issue", "comment", "label", "issue_label"} {
			want, got := dump(t, db, table), dump(t, rebuilt, table)
			if want != got {
				t.Errorf("table %s rebuilt by replay --into differs:\n got: %s\nwant: %s", table, got, want)
			}
		}
	})

	t.Run("Shutdown", func(t *testing.T) {
		db.Close()
		if code := tail.stop(t, 10*time.Second); code != 0 {
			t.Errorf("tail exit code %d after SIGTERM; want 0\n%s", code, tail.stderr.String())
		}
		if code := srv.stop(t, 60*time.Second); code != 0 {
			t.Errorf("jetsync run exit code %d after SIGTERM; want 0", code)
		}
		if _, err := os.Stat(filepath.Join(dataDir, "postgres", "postmaster.pid")); err == nil {
			t.Error("the demo postgres still runs after jetsync run stopped")
		}
	})
}

func replay(natsURL string, args ...string) (string, error) {
	cmd := exec.Command(jetsyncBin, append([]string{"replay"}, args...)...)
	cmd.Env = append(baseEnv(), "JETSYNC_NATS_URL="+natsURL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

// dump renders a replica table's user columns, ordered, for comparison.
func dump(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	rows, err := db.Query("SELECT * FROM " + table + " ORDER BY 1, 2")
	if err != nil {
		t.Fatalf("dump %s: %v", table, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	n := 0
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for i, c := range cols {
			fmt.Fprintf(&b, "%s=%v ", c, vals[i])
		}
		b.WriteString("\n")
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Errorf("table %s is empty", table)
	}
	return b.String()
}

func str(t *testing.T, rec map[string]any, key string) string {
	t.Helper()
	s, ok := rec[key].(string)
	if !ok || s == "" {
		t.Fatalf("log record %v has no %s", rec, key)
	}
	return s
}

func get(t *testing.T, url string) (string, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return string(b), resp.StatusCode
}

func openReplica(t *testing.T, file string) *sql.DB {
	t.Helper()
	// Read-only: the test must not take the replica's write lock.
	db, err := sql.Open("sqlite", "file:"+file+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

// checkPGPermissions applies the test helper's rule to the demo cluster: the
// data dir belongs to the postgres user (when jetsync runs as root), is not
// world-writable, and every parent is traversable.
func checkPGPermissions(t *testing.T, dir string) {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o002 != 0 {
		t.Errorf("%s is world-writable: %v", dir, fi.Mode())
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		if uid := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)); uid != u.Uid {
			t.Errorf("%s is owned by uid %s; want postgres (%s)", dir, uid, u.Uid)
		}
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		pi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if pi.Mode().Perm()&0o001 == 0 {
			t.Errorf("parent %s is not traversable by others: %v", p, pi.Mode())
		}
		if p == filepath.Dir(p) {
			break
		}
	}
}

// stopStrayPostgres stops a demo cluster that a killed jetsync left running.
func stopStrayPostgres(t *testing.T, bin, dir string) {
	if _, err := os.Stat(filepath.Join(dir, "postmaster.pid")); err != nil {
		return
	}
	args := []string{filepath.Join(bin, "pg_ctl"), "stop", "-D", dir, "-m", "immediate", "-w"}
	if os.Geteuid() == 0 {
		args = append([]string{"runuser", "-u", "postgres", "--"}, args...)
	}
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Logf("stop stray postgres in %s: %v\n%s", dir, err, out)
	}
}

// TestRoles runs the roles as separate processes: `jetsync run` provides
// the NATS server and the demo Postgres, and a change-streamer, a replicator
// and a view-syncer of another app ID attach to them, each with its own data
// dir and replica.
func TestRoles(t *testing.T) {
	bin := pgBin(t)
	root := dataRoot(t)
	host := startDemoRun(t, filepath.Join(root, "host"))
	natsURL := str(t, host.logRecord(t, "nats listening", 30*time.Second), "url")
	pgURL := str(t, host.logRecord(t, "demo upstream ready: connect with psql", 90*time.Second), "url")

	common := []string{"JETSYNC_NATS_URL=" + natsURL, "ZERO_APP_ID=other", "ZERO_PORT=0", "ZERO_LOG_FORMAT=json"}
	cs := start(t, append([]string{"JETSYNC_DATA_DIR=" + filepath.Join(root, "cs"), "ZERO_UPSTREAM_DB=" + pgURL}, common...), "change-streamer")
	rep := start(t, append([]string{"JETSYNC_DATA_DIR=" + filepath.Join(root, "rep")}, common...), "replicator")
	vs := start(t, append([]string{"JETSYNC_DATA_DIR=" + filepath.Join(root, "vs"), "ZERO_TASK_ID=vs-1"}, common...), "view-syncer")
	for _, p := range []*proc{cs, rep, vs} {
		p.logRecord(t, "http listening", 30*time.Second)
	}
	vsPort := int(vs.logRecord(t, "http listening", time.Second)["port"].(float64))
	// / answers OK once the view-syncer's replica is ready.
	var body string
	var code int
	polltest.Until(t, 90*time.Second, "the view-syncer's GET / to answer 200", func() bool {
		body, code = get(t, fmt.Sprintf("http://127.0.0.1:%d/", vsPort))
		return code == http.StatusOK
	})
	if body != "OK" {
		t.Errorf("view-syncer GET / = %d %q", code, body)
	}

	psql := exec.Command(filepath.Join(bin, "psql"), pgURL, "-v", "ON_ERROR_STOP=1", "-c",
		`INSERT INTO label (id, name) VALUES ('l-roles', 'split roles')`)
	psql.Env = baseEnv()
	if out, err := psql.CombinedOutput(); err != nil {
		t.Fatalf("psql insert: %v\n%s", err, out)
	}
	for _, file := range []string{
		filepath.Join(root, "cs", "backup-replica.db"),
		filepath.Join(root, "rep", "replicator-replica.db"),
		filepath.Join(root, "vs", "view-syncer-replica.db"),
	} {
		polltest.Until(t, 60*time.Second, "the insert in "+file, func() bool {
			if _, err := os.Stat(file); err != nil {
				return false
			}
			db := openReplica(t, file)
			defer db.Close()
			var name string
			return db.QueryRow(`SELECT name FROM label WHERE id = 'l-roles'`).Scan(&name) == nil && name == "split roles"
		})
	}
	if got := strings.TrimSpace(readFile(t, filepath.Join(root, "vs", "task-id"), true)); got != "" {
		t.Errorf("view-syncer with ZERO_TASK_ID persisted a task id %q", got)
	}
	if got := strings.TrimSpace(readFile(t, filepath.Join(root, "rep", "task-id"), false)); got == "" {
		t.Error("replicator persisted no task id")
	}
	for _, p := range []*proc{vs, rep, cs} {
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Errorf("%v exit code %d after SIGTERM; want 0\n%s", p.cmd.Args, code, p.stderr.String())
		}
	}
}

func readFile(t *testing.T, path string, mayMiss bool) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !(mayMiss && os.IsNotExist(err)) {
		t.Fatal(err)
	}
	return string(b)
}
