// Package backuptest stands up what backup and restore tests need: an
// embedded JetStream with the shard's stream and buckets, the hand-rolled
// producer of streams/streamstest publishing valid change messages, replica
// consumers, and a fake clock.
package backuptest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
	"github.com/jetsync/jetsync/streams/streamstest"
)

// Clock is a fake clock for the Now fields of configs.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock starts at the real time, so that server timestamps and the fake
// clock stay comparable until the test advances it.
func NewClock() *Clock { return &Clock{now: time.Now()} }

// Now returns the fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Env is one shard on an embedded server, with its backup buckets.
type Env struct {
	*streamstest.Producer
	NS     *server.Server
	NC     *nats.Conn
	Backup streams.Backup

	n int
}

// New starts a server and ensures the shard's stream and buckets.
func New(t testing.TB) *Env {
	t.Helper()
	ns := natstest.Start(t)
	nc, js := natstest.Connect(t, ns)
	p := streamstest.New(t, js)
	b, err := streams.EnsureBackup(context.Background(), js, streams.Config{Shard: p.Shard})
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Producer: p, NS: ns, NC: nc, Backup: b}
}

// Restart restarts the server; connections reconnect.
func (e *Env) Restart() {
	e.T.Helper()
	before := e.NC.Stats().Reconnects
	e.NS = natstest.Restart(e.T, e.NS)
	polltest.Until(e.T, 10*time.Second, "reconnect", func() bool { return e.NC.Stats().Reconnects > before && e.NC.IsConnected() })
}

var itemSpec = streams.TableSpec{
	Schema: "public", Name: "item", PrimaryKey: []string{"id"},
	Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "int8", Kind: streams.KindNumber, NotNull: true},
		{Name: "v", Pos: 2, DataType: "text", Kind: streams.KindString},
	},
}

var raw = streamstest.Raw

// InitialSync publishes a new initial sync of table item with rows rows,
// records it as the upstream's and returns the reset's sequence.
func (e *Env) InitialSync(rows int) uint64 {
	e.T.Helper()
	spec := itemSpec
	copies := []streamstest.Copy{{Schema: "public", Table: "item", Changes: []streams.Change{{Op: streams.OpCreateTable, Spec: &spec}}}}
	for lo := 0; lo < rows; lo += 500 {
		var rs [][]json.RawMessage
		for i := lo; i < min(rows, lo+500); i++ {
			rs = append(rs, []json.RawMessage{raw(i), raw("v" + strconv.Itoa(i))})
		}
		copies = append(copies, streamstest.Copy{Schema: "public", Table: "item", Changes: []streams.Change{{Op: streams.OpBackfill, Columns: []string{"id", "v"}, Rows: rs}}})
	}
	return e.Producer.InitialSync(copies...)
}

// Tx publishes a one-message transaction upserting item id with a new value
// and returns its sequence.
func (e *Env) Tx(id int) uint64 {
	e.T.Helper()
	e.n++
	return e.Producer.Tx("public", "item", streams.Change{Op: streams.OpInsert, New: streams.Row{"id": raw(id), "v": raw(fmt.Sprintf("tx%d", e.n))}})
}

// Running is a replica consumer running in the background.
type Running struct {
	C    *replicator.Consumer
	File string
	stop func() error
	once sync.Once
	err  error
}

// Stop stops the consumer and returns Run's error.
func (r *Running) Stop() error {
	r.once.Do(func() { r.err = r.stop() })
	return r.err
}

// Logger is a test logger: quiet unless BACKUP_TEST_LOGS is set.
func Logger() *slog.Logger {
	if os.Getenv("BACKUP_TEST_LOGS") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// StartReplica runs a replica consumer on file under taskID.
func (e *Env) StartReplica(file, taskID string) *Running {
	e.T.Helper()
	c, err := replicator.New(replicator.Config{File: file, Shard: e.Shard, TaskID: taskID, Logger: Logger().With(logkey.TaskID, taskID)}, e.JS)
	if err != nil {
		e.T.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	r := &Running{C: c, File: file, stop: func() error { cancel(); return <-done }}
	e.T.Cleanup(func() { r.Stop() })
	return r
}

// WaitSeq waits until r has applied seq.
func (r *Running) WaitSeq(t testing.TB, seq uint64) {
	t.Helper()
	polltest.Until(t, 20*time.Second, fmt.Sprintf("replica at seq %d", seq), func() bool { return r.C.State().StreamSeq >= seq })
}

// StreamState returns the stream's first and last sequences.
func (e *Env) StreamState() (first, last uint64) {
	e.T.Helper()
	info, err := e.Stream.Info(context.Background())
	if err != nil {
		e.T.Fatal(err)
	}
	return info.State.FirstSeq, info.State.LastSeq
}
