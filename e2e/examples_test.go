package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

// The examples tests (issue 18, point 3) run each analytics consumer under
// examples/ against `jetsync run` with a real Postgres, as a user would: rows
// are written with SQL while the consumer is SIGKILLed and restarted and
// jetsync itself restarts, and the consumer's per-table counts must then be
// exactly what the SQL did: no gap, no duplicate.

// exTables are the upstream tables of the examples tests, with their seed
// rows (the initial sync's backfill, not inserts).
var exTables = map[string]int{"item": 40, "note": 15}

// exCounts are one table's counts as the examples report them.
type exCounts struct {
	Insert   int64 `json:"insert"`
	Update   int64 `json:"update"`
	Delete   int64 `json:"delete"`
	Truncate int64 `json:"truncate"`
	Backfill int64 `json:"backfill"`
}

// exReport is one JSON report line of an example consumer (-json).
type exReport struct {
	Seq          uint64               `json:"seq"`
	Watermark    string               `json:"watermark"`
	Transactions int64                `json:"transactions"`
	Tables       map[string]*exCounts `json:"tables"`
	RatePerSec   float64              `json:"ratePerSec"`
}

// exRig is an upstream, `jetsync run` on it with a NATS listener, and a
// client of that NATS.
type exRig struct {
	t        *testing.T
	upstream string
	pg       *pgx.Conn
	env      []string
	natsURL  string
	httpURL  string
	srv      *proc
	js       jetstream.JetStream
	shard    streams.Shard
}

// exSetup is the upstream of the consumer tests: two tables with seed rows
// and the publication runEnv names.
var exSetup = fmt.Sprintf(`
	CREATE TABLE item (id int8 PRIMARY KEY, v text NOT NULL, n int4 NOT NULL DEFAULT 0);
	CREATE TABLE note (id int8 PRIMARY KEY, body text);
	INSERT INTO item (id, v) SELECT g, 'seed ' || g FROM generate_series(1, %d) g;
	INSERT INTO note (id, body) SELECT g, 'seed ' || g FROM generate_series(1, %d) g;
	CREATE PUBLICATION %s FOR TABLE item, note;`, exTables["item"], exTables["note"], zeroPublication)

// newExRig loads setupSQL into a new upstream and starts `jetsync run` on
// it for app, with extra settings last.
func newExRig(t *testing.T, app, setupSQL string, extra ...string) *exRig {
	t.Helper()
	pgBin(t)
	upstream := pgtest.NewDB(t, pgtest.Start(t))
	pg, err := pgx.Connect(context.Background(), upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	if _, err := pg.Exec(context.Background(), setupSQL); err != nil {
		t.Fatal(err)
	}
	natsPort, httpPort := freePort(t), freePort(t)
	extra = append([]string{"ZERO_APP_ID=" + app, fmt.Sprintf("JETSYNC_NATS_LISTEN=127.0.0.1:%d", natsPort)}, extra...)
	r := &exRig{
		t:        t,
		upstream: upstream,
		pg:       pg,
		env:      runEnv(t, upstream, httpPort, extra...),
		natsURL:  fmt.Sprintf("nats://127.0.0.1:%d", natsPort),
		httpURL:  fmt.Sprintf("http://127.0.0.1:%d", httpPort),
		shard:    streams.Shard{App: app},
	}
	r.startJetsync()
	nc, err := nats.Connect(r.natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if r.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *exRig) startJetsync() {
	r.t.Helper()
	r.srv = start(r.t, r.env, "run")
	waitHealthy(r.t, r.srv, r.httpURL, 60*time.Second)
}

// restartJetsync stops `jetsync run` with SIGTERM and starts it again on
// the same data, ports and upstream.
func (r *exRig) restartJetsync() {
	r.t.Helper()
	if code := r.srv.stop(r.t, 30*time.Second); code != 0 {
		r.t.Fatalf("jetsync run exited %d on SIGTERM:\n%s", code, r.srv.stderr.String())
	}
	r.startJetsync()
}

// tail is the change stream's last message: its watermark and whether it
// completes a transaction.
func (r *exRig) tail() (wm string, complete bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := r.js.Stream(ctx, r.shard.ChangesStream())
	if err != nil {
		return "", false // jetsync may be restarting
	}
	m, err := stream.GetLastMsgForSubject(ctx, r.shard.ChangesFilter())
	if err != nil {
		return "", false
	}
	return m.Header.Get(streams.HeaderWatermark), m.Header.Get(streams.HeaderCommit) != ""
}

// exWriter writes transactions from one client until stopped, and counts
// the row changes each kind of statement made, per table.
type exWriter struct {
	t     *testing.T
	conn  *pgx.Conn
	r     *rand.Rand
	mu    sync.Mutex
	want  map[string]*exCounts // committed only
	txs   int                  // committed transactions that changed a row
	next  map[string]int64     // the next free ID per table
	stopc chan struct{}
	done  chan struct{}
	err   error
}

func startExWriter(t *testing.T, upstream string, seed uint64) *exWriter {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), upstream)
	if err != nil {
		t.Fatal(err)
	}
	w := &exWriter{t: t, conn: conn, r: rand.New(rand.NewPCG(seed, 18)), want: map[string]*exCounts{},
		next: map[string]int64{}, stopc: make(chan struct{}), done: make(chan struct{})}
	for table, n := range exTables {
		w.want["public."+table] = &exCounts{Backfill: int64(n)}
		w.next[table] = int64(n) + 1
	}
	go w.run()
	t.Cleanup(func() {
		w.stop()
		conn.Close(context.Background())
	})
	return w
}

func (w *exWriter) run() {
	defer close(w.done)
	for i := 1; ; i++ {
		select {
		case <-w.stopc:
			return
		case <-time.After(4 * time.Millisecond):
		}
		if err := w.tx(i%150 == 0); err != nil {
			w.err = err
			return
		}
	}
}

// tx commits one transaction of 1-4 random statements, or a big one that
// spans several messages.
func (w *exWriter) tx(big bool) error {
	ctx := context.Background()
	tx, err := w.conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	got := map[string]*exCounts{}
	add := func(table string, f func(c *exCounts) *int64, sql string, args ...any) error {
		tag, err := tx.Exec(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		c := got["public."+table]
		if c == nil {
			c = &exCounts{}
			got["public."+table] = c
		}
		*f(c) += tag.RowsAffected()
		return nil
	}
	ins := func(c *exCounts) *int64 { return &c.Insert }
	upd := func(c *exCounts) *int64 { return &c.Update }
	del := func(c *exCounts) *int64 { return &c.Delete }
	next := maps.Clone(w.next)
	if big {
		// About 1.5 MB of rows: three messages or more.
		n := int64(1500)
		if err := add("item", ins, `INSERT INTO item (id, v) SELECT g, repeat(md5(g::text), 30) FROM generate_series($1::int8, $2::int8) g`,
			next["item"], next["item"]+n-1); err != nil {
			return err
		}
		next["item"] += n
		if err := add("note", upd, `UPDATE note SET body = 'big ' || id WHERE id % 3 = 0`); err != nil {
			return err
		}
		if err := add("item", del, `DELETE FROM item WHERE id BETWEEN $1 AND $2`, next["item"]-n, next["item"]-n/2); err != nil {
			return err
		}
	} else {
		for range 1 + w.r.IntN(4) {
			table := "item"
			if w.r.IntN(3) == 0 {
				table = "note"
			}
			col := map[string]string{"item": "v", "note": "body"}[table]
			hi := next[table]
			switch k := w.r.IntN(10); {
			case k < 5:
				n := int64(1 + w.r.IntN(3))
				if err := add(table, ins, fmt.Sprintf(`INSERT INTO %s (id, %s) SELECT g, 'w' || g FROM generate_series($1::int8, $2::int8) g`, table, col),
					hi, hi+n-1); err != nil {
					return err
				}
				next[table] += n
			case k < 8:
				lo := 1 + w.r.Int64N(hi)
				if err := add(table, upd, fmt.Sprintf(`UPDATE %s SET %s = %s || '+' WHERE id BETWEEN $1 AND $2`, table, col, col), lo, lo+2); err != nil {
					return err
				}
			default:
				id := 1 + w.r.Int64N(hi)
				if err := add(table, del, fmt.Sprintf(`DELETE FROM %s WHERE id = $1`, table), id); err != nil {
					return err
				}
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next = next
	changed := false
	for table, c := range got {
		changed = changed || *c != exCounts{}
		want := w.want[table]
		want.Insert += c.Insert
		want.Update += c.Update
		want.Delete += c.Delete
	}
	// Postgres sends no changes for a transaction that changed no row,
	// and the stream has none of it.
	if changed {
		w.txs++
	}
	return nil
}

func (w *exWriter) stop() error {
	select {
	case <-w.stopc:
	default:
		close(w.stopc)
	}
	<-w.done
	return w.err
}

func (w *exWriter) committed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.txs
}

// exConsumer starts one example consumer against natsURL with its state
// in stateFile, printing JSON reports on stdout.
type exConsumer func(t *testing.T, natsURL, stateFile string) *proc

// lastReport is the consumer's last JSON report, nil before its first.
func lastReport(t *testing.T, p *proc) *exReport {
	t.Helper()
	var last *exReport
	sc := bufio.NewScanner(strings.NewReader(p.stdout.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var r exReport
		if err := json.Unmarshal(line, &r); err != nil {
			continue // a line cut short by a kill
		}
		last = &r
	}
	return last
}

// waitProgress waits until p reports more than from transactions.
func waitProgress(t *testing.T, p *proc, from int64, what string) int64 {
	t.Helper()
	var n int64
	polltest.Until(t, 30*time.Second, what, func() bool {
		if p.exited() {
			t.Fatalf("%v exited (%v):\nstdout:\n%s\nstderr:\n%s", p.cmd.Args, p.err, tailLines(p.stdout.String(), 5), p.stderr.String())
		}
		if r := lastReport(t, p); r != nil {
			n = r.Transactions
		}
		return n > from
	})
	return n
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runExampleConsumer is the scenario every example consumer goes through:
// writes while it runs, two SIGKILLs mid-stream and a jetsync restart, then
// exact per-table counts.
func runExampleConsumer(t *testing.T, startConsumer exConsumer) {
	began := time.Now()
	r := newExRig(t, zeroAppID, exSetup)
	state := filepath.Join(t.TempDir(), "state.json")
	seed := uint64(time.Now().UnixNano())
	t.Logf("writer seed %d", seed)

	c := startConsumer(t, r.natsURL, state)
	// The initial sync first, then writes from a live upstream.
	waitProgress(t, c, 0, "the consumer to count the initial sync")
	w := startExWriter(t, r.upstream, seed)

	n := waitProgress(t, c, 20, "the consumer to count 20 transactions")
	kill(t, c)
	t.Logf("killed the consumer after %d transactions; the writer had committed %d", n, w.committed())
	runFor(t, r.srv, 300*time.Millisecond)

	c = startConsumer(t, r.natsURL, state)
	n = waitProgress(t, c, n+20, "the restarted consumer to go on")
	// The writer commits every few milliseconds: the rolling rate shows it.
	polltest.Until(t, 10*time.Second, "a rolling rate above zero", func() bool {
		rep := lastReport(t, c)
		return rep != nil && rep.RatePerSec > 0
	})
	r.restartJetsync()
	t.Logf("restarted jetsync run after %d transactions; the writer had committed %d", n, w.committed())
	n = waitProgress(t, c, n+20, "the consumer to go on after jetsync's restart")

	// Past a big (multi-message) transaction, so that a kill may fall
	// inside one.
	n = waitProgress(t, c, n+150, "the consumer to count a big transaction")
	kill(t, c)
	t.Logf("killed the consumer again after %d transactions", n)
	c = startConsumer(t, r.natsURL, state)
	waitProgress(t, c, n, "the consumer to resume again")

	r.checkExact(w, exRun{"the consumer", c, state})
	t.Logf("the scenario took %s", time.Since(began).Round(time.Millisecond))
}

// exRun is an example consumer under test: its process and state file.
type exRun struct {
	name  string
	p     *proc
	state string
}

// checkExact stops the writer, waits for each consumer to reach the
// stream's last transaction, and checks its counts, its transaction count
// and its state file against what the writer committed.
func (r *exRig) checkExact(w *exWriter, runs ...exRun) {
	t := r.t
	t.Helper()
	if err := w.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	w.mu.Lock()
	want := w.want
	txs := w.txs
	w.mu.Unlock()
	t.Logf("the writer committed %d transactions that changed rows: %s", txs, jsonString(want))

	for _, run := range runs {
		c := run.p
		var got *exReport
		polltest.Until(t, 60*time.Second, run.name+"'s counts to reach the writer's", func() bool {
			if c.exited() {
				t.Fatalf("%s exited (%v):\n%s", run.name, c.err, c.stderr.String())
			}
			got = lastReport(t, c)
			wm, complete := r.tail()
			return got != nil && complete && got.Watermark == wm && countsEqual(got.Tables, want)
		})
		// Caught up with a stream that no longer grows: nothing more may come.
		runFor(t, c, 500*time.Millisecond)
		got = lastReport(t, c)
		if !countsEqual(got.Tables, want) {
			t.Errorf("%s's counts changed after catching up: got %s, want %s", run.name, jsonString(got.Tables), jsonString(want))
		}
		// The writer's transactions, the initial sync, and nothing else.
		if got.Transactions != int64(txs)+1 {
			t.Errorf("%s counted %d transactions; want the initial sync and the writer's %d", run.name, got.Transactions, txs)
		}
		// The state file agrees with what was printed.
		if code := c.stop(t, 10*time.Second); code != 0 {
			t.Errorf("%s exited %d on SIGTERM:\n%s", run.name, code, c.stderr.String())
		}
		var saved exReport
		data, err := os.ReadFile(run.state)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &saved); err != nil {
			t.Fatalf("%s's state file: %v\n%s", run.name, err, data)
		}
		if !countsEqual(saved.Tables, want) || saved.Watermark != got.Watermark {
			t.Errorf("%s's state file %s; want the counts %s at %s", run.name, data, jsonString(want), got.Watermark)
		}
		t.Logf("%s: %d transactions, counts %s", run.name, got.Transactions, jsonString(got.Tables))
	}
}

// countsEqual compares the tables the writer writes; others (jetsync's own
// shard tables) may appear and are not checked.
func countsEqual(got, want map[string]*exCounts) bool {
	for table, w := range want {
		g := got[table]
		if g == nil || *g != *w {
			return false
		}
	}
	return true
}

func jsonString(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}

// buildExample builds examples/<dir> into the test's temporary folder.
func buildExample(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(dir))
	cmd := exec.Command("go", "build", "-o", bin, "./examples/"+dir)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/%s: %v\n%s", dir, err, out)
	}
	return bin
}

// goConsumer builds examples/analytics-go and starts it.
func goConsumer(t *testing.T) exConsumer {
	bin := buildExample(t, "analytics-go")
	return func(t *testing.T, natsURL, stateFile string) *proc {
		cmd := exec.Command(bin, "-nats", natsURL, "-app", zeroAppID, "-state", stateFile, "-json", "-every", "100ms", "-window", "10s")
		cmd.Env = baseEnv()
		return startProc(t, "analytics-go", cmd)
	}
}

// tsConsumer starts examples/analytics-ts under Node 22.
func tsConsumer(t *testing.T) exConsumer {
	node, main := exampleTS(t)
	return func(t *testing.T, natsURL, stateFile string) *proc {
		cmd := exec.Command(node, main, "--nats", natsURL, "--app", zeroAppID, "--state", stateFile, "--json", "--every", "100", "--window", "10")
		cmd.Env = baseEnv()
		return startProc(t, "analytics-ts", cmd)
	}
}

// TestExamples_AnalyticsGo runs examples/analytics-go through the
// scenario.
func TestExamples_AnalyticsGo(t *testing.T) {
	runExampleConsumer(t, goConsumer(t))
}

// exampleTS finds Node 22 and the TypeScript example's installed
// packages.
func exampleTS(t *testing.T) (node, main string) {
	t.Helper()
	node = nodeBin(t)
	dir, err := filepath.Abs(filepath.Join("..", "examples", "analytics-ts"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@nats-io", "jetstream")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("examples/analytics-ts has no node_modules under CI (make node-deps): %v", err)
		}
		t.Skipf("examples/analytics-ts not installed (make node-deps): %v", err)
	}
	return node, filepath.Join(dir, "main.ts")
}

// TestExamples_AnalyticsTS runs examples/analytics-ts under Node 22
// through the scenario.
func TestExamples_AnalyticsTS(t *testing.T) {
	runExampleConsumer(t, tsConsumer(t))
}

// TestExamples_AnalyticsTSTypes type-checks examples/analytics-ts with its
// pinned TypeScript: Node runs the file with its types stripped, unchecked.
func TestExamples_AnalyticsTSTypes(t *testing.T) {
	node, main := exampleTS(t)
	dir := filepath.Dir(main)
	cmd := exec.Command(node, filepath.Join(dir, "node_modules", "typescript", "bin", "tsc"), "-p", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc -p examples/analytics-ts: %v\n%s", err, out)
	}
}

// natsCLI is the stock nats CLI: $JETSYNC_NATS_CLI, else .tools/bin/nats,
// which `make nats-cli` installs.
func natsCLI(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("JETSYNC_NATS_CLI")
	if bin == "" {
		var err error
		if bin, err = filepath.Abs(filepath.Join("..", ".tools", "bin", "nats")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("nats CLI missing under CI (make nats-cli): %v", err)
		}
		t.Skipf("nats CLI not installed (make nats-cli): %v", err)
	}
	return bin
}

// shBlocks returns the fenced sh blocks of a markdown file, in order.
func shBlocks(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	in := false
	for line := range strings.SplitSeq(string(data), "\n") {
		switch {
		case !in && strings.TrimSpace(line) == "```sh":
			in = true
		case in && strings.TrimSpace(line) == "```":
			in = false
			b.WriteString("\n")
		case in:
			b.WriteString(line + "\n")
		}
	}
	if in {
		t.Fatalf("%s: an sh block is not closed", file)
	}
	return b.String()
}

// TestExamples_NatsCLI runs every sh block of examples/nats-cli/README.md
// in one bash, against `jetsync run` on the demo schema, and checks what
// its reads printed: the durable consumer resumes past the initial sync,
// the read from a watermark starts at that transaction, and the window holds
// exactly the transactions committed inside it.
func TestExamples_NatsCLI(t *testing.T) {
	began := time.Now()
	cli := natsCLI(t)
	if _, err := exec.LookPath("jq"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("jq missing under CI (make nats-cli): %v", err)
		}
		t.Skipf("jq not installed (make nats-cli): %v", err)
	}
	demo, err := os.ReadFile(filepath.Join("..", "cmd", "jetsync", "demo.sql"))
	if err != nil {
		t.Fatal(err)
	}
	// The walkthrough's names: app zero, the default publication.
	r := newExRig(t, "zero", string(demo), "ZERO_APP_PUBLICATIONS=")
	script := shBlocks(t, filepath.Join("..", "examples", "nats-cli", "README.md"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = t.TempDir()
	cmd.Env = append(baseEnv(), "NATS_URL="+r.natsURL, "PG="+r.upstream,
		"PATH="+filepath.Dir(cli)+":"+pgBin(t)+":"+os.Getenv("PATH"))
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the walkthrough failed: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("walkthrough output:\n%s", stdout.String())

	// The reads of rows the walkthrough wrote, in order.
	var ops []string
	var initial []string
	for line := range strings.SplitSeq(stdout.String(), "\n") {
		var rec struct {
			Ops   []string `json:"ops"`
			Parts []struct {
				Ops []string `json:"ops"`
			} `json:"parts"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		for _, p := range rec.Parts {
			initial = append(initial, p.Ops...)
		}
		if len(rec.Ops) > 0 {
			ops = append(ops, strings.Join(rec.Ops, ","))
		}
	}
	want := []string{
		"insert cli-1", "update cli-1", // the durable consumer, after the initial sync
		"insert cli-1", "update cli-1", // from the insert's watermark
		"insert cli-2", "insert cli-3", // the window: not cli-4
	}
	if strings.Join(ops, "|") != strings.Join(want, "|") {
		t.Errorf("the walkthrough read %q; want %q", ops, want)
	}
	// The first read was the initial sync, whole: a reset first, each
	// demo table created and backfilled.
	if len(initial) == 0 || initial[0] != "reset" {
		t.Errorf("the durable consumer's first read began with %q; want the reset", initial)
	}
	for _, op := range []string{"create-table", "backfill", "create-index"} {
		if !slices.Contains(initial, op) {
			t.Errorf("the initial sync read has no %s: %q", op, initial)
		}
	}
	if !strings.Contains(stdout.String(), "watermark ") || !strings.Contains(stdout.String(), " starts at stream sequence ") {
		t.Errorf("no watermark lookup in the output")
	}
	t.Logf("the walkthrough ran in %s", time.Since(began).Round(time.Millisecond))
}

// TestExamples_Failover runs both example consumers while the
// change-streamer fails over: the one holding the producer role is
// SIGKILLed mid-workload and another (another host: its own data and task
// ID) takes over, against a NATS server that outlives both. The consumers
// must count every transaction exactly once across it.
func TestExamples_Failover(t *testing.T) {
	began := time.Now()
	consumers := map[string]exConsumer{"analytics-go": goConsumer(t)}
	if _, err := os.Stat(filepath.Join("..", "examples", "analytics-ts", "node_modules")); err == nil || os.Getenv("CI") == "true" {
		consumers["analytics-ts"] = tsConsumer(t)
	}
	pgBin(t)
	upstream := pgtest.NewDB(t, pgtest.Start(t))
	pg, err := pgx.Connect(context.Background(), upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	if _, err := pg.Exec(context.Background(), exSetup); err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t)
	_, js := natstest.Connect(t, ns)
	r := &exRig{t: t, upstream: upstream, pg: pg, natsURL: ns.ClientURL(), js: js, shard: streams.Shard{App: zeroAppID}}
	root := dataRoot(t)
	streamer := func(name string) *proc {
		p := start(t, []string{
			"JETSYNC_NATS_URL=" + r.natsURL,
			"ZERO_UPSTREAM_DB=" + upstream,
			"ZERO_APP_ID=" + zeroAppID,
			"ZERO_APP_PUBLICATIONS=" + zeroPublication,
			"JETSYNC_DATA_DIR=" + filepath.Join(root, name),
			"ZERO_TASK_ID=" + name,
			"ZERO_PORT=0",
			"ZERO_LOG_FORMAT=json",
		}, "change-streamer")
		p.logRecord(t, "streaming", 60*time.Second)
		return p
	}
	first := streamer("cs-a")

	runs := map[string]*exRun{}
	for name, startConsumer := range consumers {
		state := filepath.Join(t.TempDir(), "state.json")
		runs[name] = &exRun{name: name, p: startConsumer(t, r.natsURL, state), state: state}
		waitProgress(t, runs[name].p, 0, name+" to count the initial sync")
	}
	w := startExWriter(t, upstream, uint64(time.Now().UnixNano()))
	for name, run := range runs {
		waitProgress(t, run.p, 50, name+" to count 50 transactions")
	}
	kill(t, first)
	t.Logf("killed the change-streamer holding the producer role; the writer had committed %d", w.committed())
	second := streamer("cs-b")
	if !strings.Contains(second.stderr.String(), `"previous_task_id":"cs-a"`) {
		t.Errorf("the second change-streamer did not log taking the role from cs-a:\n%s", second.stderr.String())
	}
	n := int64(w.committed())
	for name, run := range runs {
		waitProgress(t, run.p, n+50, name+" to count past the failover")
	}
	var all []exRun
	for _, run := range runs {
		all = append(all, *run)
	}
	r.checkExact(w, all...)
	t.Logf("the failover scenario took %s", time.Since(began).Round(time.Millisecond))
}
