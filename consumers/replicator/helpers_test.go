package replicator_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
	"github.com/jetsync/jetsync/streams/streamstest"
)

// env is an embedded JetStream with the shard's stream and bucket, and a
// hand-rolled producer: the tests publish what pgrepl would.
type env struct {
	*streamstest.Producer
	ns *server.Server
	nc *nats.Conn
}

func newEnv(t testing.TB) *env {
	t.Helper()
	ns := natstest.Start(t)
	nc, js := natstest.Connect(t, ns)
	return &env{Producer: streamstest.New(t, js), ns: ns, nc: nc}
}

// restart restarts the NATS server; connections reconnect.
func (e *env) restart() {
	e.T.Helper()
	before := e.nc.Stats().Reconnects
	e.ns = natstest.Restart(e.T, e.ns)
	polltest.Until(e.T, 10*time.Second, "reconnect", func() bool { return e.nc.Stats().Reconnects > before && e.nc.IsConnected() })
}

var issueSpec = streams.TableSpec{
	Schema: "public", Name: "issue", PrimaryKey: []string{"id"},
	Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "text", Kind: streams.KindString, NotNull: true},
		{Name: "title", Pos: 2, DataType: "text", Kind: streams.KindString},
		{Name: "n", Pos: 3, DataType: "int8", Kind: streams.KindNumber},
	},
}

var userSpec = streams.TableSpec{
	Schema: "app", Name: "user", PrimaryKey: []string{"id"},
	Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "int4", Kind: streams.KindNumber, NotNull: true},
		{Name: "name", Pos: 2, DataType: "text", Kind: streams.KindString},
	},
}

var raw = streamstest.Raw

func issue(id, title string, n int) streams.Row {
	return streams.Row{"id": raw(id), "title": raw(title), "n": raw(n)}
}

// initialSync publishes a reset and an initial copy of issue (rows i0..)
// and app.user (one row), records it as the upstream's, and returns the
// reset's sequence.
func (e *env) initialSync(rows int) uint64 {
	e.T.Helper()
	is, us := issueSpec, userSpec
	copies := []streamstest.Copy{{Schema: "public", Table: "issue", Changes: []streams.Change{{Op: streams.OpCreateTable, Spec: &is}}}}
	for lo := 0; lo < rows; lo += 100 {
		var rs [][]json.RawMessage
		for i := lo; i < min(rows, lo+100); i++ {
			rs = append(rs, []json.RawMessage{raw(fmt.Sprintf("i%d", i)), raw("title " + strconv.Itoa(i)), raw(i)})
		}
		copies = append(copies, streamstest.Copy{Schema: "public", Table: "issue", Changes: []streams.Change{{Op: streams.OpBackfill, Columns: []string{"id", "title", "n"}, Rows: rs}}})
	}
	copies = append(copies,
		streamstest.Copy{Schema: "public", Table: "issue", Changes: []streams.Change{{Op: streams.OpCreateIndex, Index: &streams.IndexSpec{Schema: "public", TableName: "issue", Name: "issue_title", Columns: []string{"title"}}}}},
		streamstest.Copy{Schema: "app", Table: "user", Changes: []streams.Change{{Op: streams.OpCreateTable, Spec: &us},
			{Op: streams.OpBackfill, Columns: []string{"id", "name"}, Rows: [][]json.RawMessage{{raw(1), raw("ann")}}}}})
	return e.InitialSync(copies...)
}

// tx publishes a one-message transaction on issue and returns its seq.
func (e *env) tx(cs ...streams.Change) uint64 {
	e.T.Helper()
	return e.Tx("public", "issue", cs...)
}

// packed publishes several transactions on issue in one message.
func (e *env) packed(txs ...[]streams.Change) uint64 {
	e.T.Helper()
	return e.Packed("public", "issue", txs...)
}

var nowMs = streamstest.NowMs

func ins(r streams.Row) streams.Change { return streams.Change{Op: streams.OpInsert, New: r} }
func upd(old, r streams.Row) streams.Change {
	return streams.Change{Op: streams.OpUpdate, Old: old, New: r}
}
func del(id string) streams.Change {
	return streams.Change{Op: streams.OpDelete, Old: streams.Row{"id": raw(id)}}
}

// logBuffer collects log lines for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type running struct {
	c    *replicator.Consumer
	file string
	logs *logBuffer
	done chan struct{} // closed when Run returns
	stop func() error
}

func (e *env) config(file string) replicator.Config {
	return replicator.Config{File: file, Shard: e.Shard, TaskID: "task1"}
}

// start runs a consumer on file until stop or the test's end.
func (e *env) start(cfg replicator.Config) *running {
	e.T.Helper()
	logs := &logBuffer{}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c, err := replicator.New(cfg, e.JS)
	if err != nil {
		e.T.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() {
		runErr = c.Run(ctx)
		close(done)
	}()
	stop := func() error {
		cancel()
		<-done
		return runErr
	}
	e.T.Cleanup(func() {
		stop()
		if e.T.Failed() || testing.Verbose() && os.Getenv("REPLICA_TEST_LOGS") != "" {
			e.T.Logf("consumer log:\n%s", logs)
		}
	})
	return &running{c: c, file: cfg.File, logs: logs, done: done, stop: stop}
}

func (r *running) waitWM(t *testing.T, wm string) {
	t.Helper()
	polltest.Until(t, 10*time.Second, "watermark "+wm, func() bool { return r.c.State().Watermark == wm })
}

func tempFile(t *testing.T) string { return filepath.Join(t.TempDir(), "replica.db") }

// query reads the replica file through its own read-only connection.
func query(t *testing.T, file, q string) []string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+file+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		s := make([]string, len(vals))
		for i, v := range vals {
			s[i] = fmt.Sprint(v)
		}
		out = append(out, strings.Join(s, "|"))
	}
	return out
}
