package replicator_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"modernc.org/sqlite"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

const issues = "SELECT id, title, n, _0_version FROM issue ORDER BY id"

func TestConsumer_Run(t *testing.T) {
	t.Run("InitialSyncAndChanges", func(t *testing.T) {
		e := newEnv(t)
		resetSeq := e.initialSync(250)
		r := e.start(e.config(tempFile(t)))
		r.waitWM(t, e.Version)
		if got := query(t, r.file, "SELECT count(*) FROM issue"); got[0] != "250" {
			t.Fatalf("issue rows after initial sync = %v; want 250", got)
		}
		st := r.c.State()
		if st.ReplicaVersion != e.Version || st.ResetSeq != resetSeq {
			t.Errorf("State = %+v; want replica version %s, reset seq %d", st, e.Version, resetSeq)
		}

		e.tx(streams.Change{Op: streams.OpTruncate})
		e.tx(ins(issue("a", "A", 1)), ins(issue("b", "B", 2)), ins(issue("c", "C", 3)))
		wmIns := e.WM
		e.tx(upd(nil, streams.Row{"id": raw("a"), "title": raw("A2")}))
		e.tx(upd(streams.Row{"id": raw("b")}, issue("bb", "B2", 20)))
		last := e.tx(del("c"))
		r.waitWM(t, e.WM)
		want := []string{
			"a|A2|1|" + streams.Lexi(e.LSN-16),
			"bb|B2|20|" + streams.Lexi(e.LSN-8),
		}
		if diff := cmp.Diff(want, query(t, r.file, issues)); diff != "" {
			t.Errorf("issue rows (-want +got):\n%s", diff)
		}
		_ = wmIns
		if st := r.c.State(); st.StreamSeq != last {
			t.Errorf("State().StreamSeq = %d; want %d", st.StreamSeq, last)
		}
		// The watermark's copy in the state bucket.
		polltest.Until(t, 10*time.Second, "watermark in KV", func() bool {
			kve, err := e.KV.Get(context.Background(), streams.KeyWatermark("task1", "replica"))
			return err == nil && string(kve.Value()) == e.WM
		})
		// Everything is acked once committed.
		cons, err := e.Stream.Consumer(context.Background(), "task1_replica")
		if err != nil {
			t.Fatal(err)
		}
		polltest.Until(t, 10*time.Second, "ack floor", func() bool {
			info, err := cons.Info(context.Background())
			return err == nil && info.AckFloor.Stream == last
		})
	})

	// The watermark's copy is written off the commit path, coalesced;
	// the last one is there once Run returns.
	t.Run("WatermarkAtShutdown", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(0)
		r := e.start(e.config(tempFile(t)))
		for i := range 50 {
			e.tx(ins(issue(string(rune('a'+i%26))+strings.Repeat("x", i), "T", i)))
		}
		r.waitWM(t, e.WM)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		kve, err := e.KV.Get(context.Background(), streams.KeyWatermark("task1", "replica"))
		if err != nil || string(kve.Value()) != e.WM {
			t.Fatalf("watermark in KV after Run = %v, %v; want %s", kve, err, e.WM)
		}
	})

	t.Run("PackedMessages", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(0)
		r := e.start(e.config(tempFile(t)))
		e.packed(
			[]streams.Change{ins(issue("a", "A", 1))},
			[]streams.Change{ins(issue("b", "B", 2)), del("a")},
			[]streams.Change{upd(nil, issue("b", "B3", 3))},
		)
		r.waitWM(t, e.WM)
		want := []string{"b|B3|3|" + e.WM}
		if diff := cmp.Diff(want, query(t, r.file, issues)); diff != "" {
			t.Errorf("issue rows (-want +got):\n%s", diff)
		}
	})

	t.Run("TransactionCommitsAtItsLastPart", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(0)
		r := e.start(e.config(tempFile(t)))
		r.waitWM(t, e.Version)
		wm := e.NextWM()
		e.Publish(&streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{{Watermark: wm, Prev: e.WM, Num: 0, Changes: []streams.Change{ins(issue("a", "A", 1))}}}})
		e.Publish(&streams.Message{Schema: "app", Table: "user", Parts: []streams.Part{{Watermark: wm, Num: 1, Changes: []streams.Change{{Op: streams.OpInsert, New: streams.Row{"id": raw(2), "name": raw("bob")}}}}}})
		seq := e.Publish(&streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{{Watermark: wm, Num: 2, Changes: []streams.Change{ins(issue("b", "B", 2))}}}})
		// Once the consumer holds the parts in an open write transaction,
		// none of them may be visible.
		cons, err := e.Stream.Consumer(context.Background(), "task1_replica")
		if err != nil {
			t.Fatal(err)
		}
		polltest.Until(t, 10*time.Second, "the parts delivered and a write transaction open", func() bool {
			info, err := cons.Info(context.Background())
			return err == nil && info.Delivered.Stream >= seq && writeLocked(t, r.file)
		})
		if got := query(t, r.file, "SELECT id FROM issue UNION ALL SELECT name FROM \"app.user\" WHERE id = 2"); len(got) != 0 {
			t.Fatalf("rows of an incomplete transaction are visible: %v", got)
		}
		if st := r.c.State(); st.Watermark != e.Version {
			t.Fatalf("watermark moved to %s before the last part", st.Watermark)
		}
		e.Publish(&streams.Message{Parts: []streams.Part{{Watermark: wm, Num: 3, Last: true, Changes: []streams.Change{}}}})
		e.WM = wm
		r.waitWM(t, wm)
		got := query(t, r.file, "SELECT id FROM issue UNION ALL SELECT name FROM \"app.user\" WHERE id = 2")
		if diff := cmp.Diff([]string{"a", "b", "bob"}, got); diff != "" {
			t.Errorf("rows (-want +got):\n%s", diff)
		}
	})

	t.Run("ResetAbortsOpenTransaction", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(3)
		r := e.start(e.config(tempFile(t)))
		r.waitWM(t, e.WM)
		e.Publish(&streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{{Watermark: e.NextWM(), Prev: e.WM, Num: 0, Changes: []streams.Change{ins(issue("lost", "L", 1))}}}})
		polltest.Until(t, 10*time.Second, "the part applied in an open transaction", func() bool { return writeLocked(t, r.file) })
		e.initialSync(1)
		e.tx(ins(issue("z", "Z", 26)))
		r.waitWM(t, e.WM)
		want := []string{"i0|title 0|0|" + e.Version, "z|Z|26|" + e.WM}
		if diff := cmp.Diff(want, query(t, r.file, issues)); diff != "" {
			t.Errorf("issue rows (-want +got):\n%s", diff)
		}
	})

	t.Run("RestartResumesWithoutReapplying", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(10)
		file := tempFile(t)
		r := e.start(e.config(file))
		e.tx(ins(issue("a", "A", 1)))
		r.waitWM(t, e.WM)
		if err := r.stop(); err != nil {
			t.Fatalf("Run = %v", err)
		}
		e.tx(ins(issue("b", "B", 2)))
		e.packed([]streams.Change{del("a")}, []streams.Change{ins(issue("c", "C", 3))})
		reg := prometheus.NewRegistry()
		cfg := e.config(file)
		cfg.Registerer = reg
		r2 := e.start(cfg)
		r2.waitWM(t, e.WM)
		if diff := cmp.Diff([]string{"b", "c"}, query(t, file, "SELECT id FROM issue WHERE id < 'i' ORDER BY id")); diff != "" {
			t.Errorf("issue rows (-want +got):\n%s", diff)
		}
		// Only the three new transactions were applied: one replayed would
		// have broken the prev chain.
		if n := (metric(t, reg, "jetsync_replica_transactions_total")); n != 3 {
			t.Errorf("transactions applied after restart = %v; want 3", n)
		}
		// One lag sample per transaction, each from its upstream commit time.
		if n := metric(t, reg, "jetsync_replication_lag_seconds"); n != 3 {
			t.Errorf("replication lag samples = %v; want 3", n)
		}
		if n := (metric(t, reg, "jetsync_replica_watermark_lsn")); n != float64(e.LSN) {
			t.Errorf("watermark gauge = %v; want %d", n, e.LSN)
		}
		if strings.Contains(r2.logs.String(), "level=ERROR") {
			t.Errorf("errors logged:\n%s", r2.logs)
		}
	})

	t.Run("RecreatesConsumerAtReplicaPosition", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(2)
		file := tempFile(t)
		r := e.start(e.config(file))
		e.tx(ins(issue("a", "A", 1)))
		r.waitWM(t, e.WM)
		r.stop()
		// Someone moved the durable consumer past the replica.
		ctx := context.Background()
		e.tx(ins(issue("b", "B", 2)))
		if err := e.Stream.DeleteConsumer(ctx, "task1_replica"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "task1_replica", DeliverPolicy: jetstream.DeliverNewPolicy, AckPolicy: jetstream.AckAllPolicy}); err != nil {
			t.Fatal(err)
		}
		r2 := e.start(e.config(file))
		r2.waitWM(t, e.WM)
		if got := query(t, file, "SELECT id FROM issue WHERE id < 'i' ORDER BY id"); !cmp.Equal(got, []string{"a", "b"}) {
			t.Errorf("issue rows = %v; want a, b", got)
		}
	})

	t.Run("NewReplicaStartsAtRecordedReset", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(5)
		e.tx(ins(issue("old", "O", 1)))
		e.initialSync(2) // a newer history: the first one is ignored
		e.tx(ins(issue("a", "A", 1)))
		r := e.start(e.config(tempFile(t)))
		r.waitWM(t, e.WM)
		if got := query(t, r.file, "SELECT id FROM issue ORDER BY id"); !cmp.Equal(got, []string{"a", "i0", "i1"}) {
			t.Errorf("issue rows = %v", got)
		}
	})

	t.Run("NATSRestartsMidStream", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(2)
		r := e.start(e.config(tempFile(t)))
		e.tx(ins(issue("a", "A", 1)))
		r.waitWM(t, e.WM)
		e.restart()
		e.tx(ins(issue("b", "B", 2)))
		r.waitWM(t, e.WM)
		if got := query(t, r.file, "SELECT id FROM issue WHERE id < 'i' ORDER BY id"); !cmp.Equal(got, []string{"a", "b"}) {
			t.Errorf("issue rows = %v; want a, b", got)
		}
	})

	t.Run("PoisonMessageStops", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(1)
		r := e.start(e.config(tempFile(t)))
		r.waitWM(t, e.WM)
		seq := e.PublishRaw("public", "issue", []byte(`{"parts":[{"wm":"not a watermark"}]}`), nil)
		e.tx(ins(issue("after", "X", 1)))
		<-r.done
		err := r.stop()
		var de *replicator.DecodeError
		if !errors.As(err, &de) || de.Seq != seq {
			t.Fatalf("Run = %v; want a DecodeError at seq %d", err, seq)
		}
		if got := query(t, r.file, "SELECT count(*) FROM issue WHERE id = 'after'"); got[0] != "0" {
			t.Error("a message past the poison one was applied")
		}
	})
}

// writeLocked reports whether another connection holds file's write lock.
func writeLocked(t *testing.T, file string) bool {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+file+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		return true
	}
	conn.ExecContext(context.Background(), "ROLLBACK")
	return false
}

func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestConsumer_Gaps(t *testing.T) {
	t.Run("PurgedPastConsumerRebuildsFromReset", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(3)
		file := tempFile(t)
		r := e.start(e.config(file))
		e.tx(ins(issue("a", "A", 1)))
		r.waitWM(t, e.WM)
		r.stop()
		// While it is stopped, history moves on: more transactions, a new
		// initial sync, and a purge of everything before it.
		e.tx(ins(issue("b", "B", 2)))
		reset := e.initialSync(2)
		e.tx(ins(issue("c", "C", 3)))
		if err := e.Stream.Purge(context.Background(), jetstream.WithPurgeSequence(reset)); err != nil {
			t.Fatal(err)
		}
		r2 := e.start(e.config(file))
		sub := r2.c.Subscribe()
		r2.waitWM(t, e.WM)
		if got := query(t, file, "SELECT id FROM issue ORDER BY id"); !cmp.Equal(got, []string{"c", "i0", "i1"}) {
			t.Errorf("issue rows = %v", got)
		}
		if !strings.Contains(r2.logs.String(), "replica missed history") {
			t.Errorf("gap not reported:\n%s", r2.logs)
		}
		if st := r2.c.State(); st.ResetSeq != reset {
			t.Errorf("ResetSeq = %d; want %d", st.ResetSeq, reset)
		}
		u, err := sub.Next(context.Background())
		if err != nil || !u.Reset {
			t.Errorf("Next = %+v, %v; want a reset", u, err)
		}
	})

	t.Run("PurgedResetRequestsResync", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(3)
		file := tempFile(t)
		r := e.start(e.config(file))
		r.waitWM(t, e.WM)
		r.stop()
		e.tx(ins(issue("a", "A", 1)))
		e.tx(ins(issue("b", "B", 2)))
		if err := e.Stream.Purge(context.Background(), jetstream.WithPurgeKeep(1)); err != nil {
			t.Fatal(err)
		}
		requests := make(chan *nats.Msg, 10)
		sub, err := e.nc.ChanSubscribe(e.Shard.ResyncSubject(), requests)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		e.nc.Flush()
		cfg := e.config(file)
		cfg.ResyncInterval = 50 * time.Millisecond
		r2 := e.start(cfg)
		// Unanswered, the request is repeated.
		<-requests
		var req streams.ResyncRequest
		m := <-requests
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Fatal(err)
		}
		m.Respond([]byte("ok"))
		if req.TaskID != "task1" || req.Consumer != "replica" {
			t.Errorf("resync request = %+v", req)
		}
		// The producer answers with a new initial sync.
		e.initialSync(1)
		e.tx(ins(issue("c", "C", 3)))
		r2.waitWM(t, e.WM)
		if got := query(t, file, "SELECT id FROM issue ORDER BY id"); !cmp.Equal(got, []string{"c", "i0"}) {
			t.Errorf("issue rows = %v", got)
		}
	})

	t.Run("GapInsideHistoryRequestsResync", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(2)
		file := tempFile(t)
		r := e.start(e.config(file))
		r.waitWM(t, e.WM)
		r.stop()
		lost := e.tx(ins(issue("a", "A", 1)))
		e.tx(ins(issue("b", "B", 2)))
		if err := e.Stream.DeleteMsg(context.Background(), lost); err != nil {
			t.Fatal(err)
		}
		requests := make(chan *nats.Msg, 10)
		sub, err := e.nc.ChanSubscribe(e.Shard.ResyncSubject(), requests)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		e.nc.Flush()
		r2 := e.start(e.config(file))
		// The rebuild from the reset meets the same gap, so it asks for a
		// new history instead of looping.
		m := <-requests
		m.Respond(nil)
		e.initialSync(1)
		r2.waitWM(t, e.WM)
		if got := query(t, file, "SELECT id FROM issue ORDER BY id"); !cmp.Equal(got, []string{"i0"}) {
			t.Errorf("issue rows = %v", got)
		}
		if n := strings.Count(r2.logs.String(), "replica missed history"); n != 2 {
			t.Errorf("gaps logged %d times; want 2:\n%s", n, r2.logs)
		}
	})
}

// TestConsumer_InitialSyncLeavesNoCache checks that the writer does not
// keep the initial copy's pages in its page cache: they would stay
// resident for the life of the process.
func TestConsumer_InitialSyncLeavesNoCache(t *testing.T) {
	e := newEnv(t)
	e.initialSync(30000)
	dbs := make(chan *sql.DB, 1)
	defer replicator.SetOpenHook(func(db *sql.DB) { dbs <- db })()
	file := tempFile(t)
	r := e.start(e.config(file))
	db := <-dbs
	r.waitWM(t, e.Version)
	fi, err := os.Stat(file + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	// What the copy wrote is in the WAL until a checkpoint; a cache that
	// kept it would hold about as much.
	var used int
	polltest.Until(t, 10*time.Second, "page cache emptied", func() bool {
		conn, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := conn.Raw(func(dc any) error {
			used, _, err = dc.(sqlite.DBStatus).Status(sqlite.DBStatusCacheUsed, false)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return int64(used) < fi.Size()/4
	})
}

// TestConsumer_KeepsStatementsAfterPublish checks that a commit's new
// statements are prepared for the next transactions only once the commit
// is published: preparing them takes a while after DDL, and must not delay
// the subscribers.
func TestConsumer_KeepsStatementsAfterPublish(t *testing.T) {
	e := newEnv(t)
	e.initialSync(10)
	var mu sync.Mutex
	var kept, early []uint64
	var r *running
	started := make(chan struct{})
	defer replicator.SetKeepHook(func(seq uint64) {
		<-started
		mu.Lock()
		defer mu.Unlock()
		kept = append(kept, seq)
		if got := r.c.State().StreamSeq; got < seq {
			early = append(early, seq)
		}
	})()
	r = e.start(e.config(tempFile(t)))
	close(started)
	last := e.tx(upd(nil, issue("i1", "one", 1)))
	for i := range 5 {
		last = e.tx(ins(issue(fmt.Sprintf("n%d", i), "new", i)))
	}
	polltest.Until(t, 10*time.Second, "the last transaction applied", func() bool { return r.c.State().StreamSeq >= last })
	mu.Lock()
	defer mu.Unlock()
	if len(kept) == 0 {
		t.Fatal("no commit kept its statements")
	}
	if len(early) > 0 {
		t.Errorf("statements of seqs %v were kept before their commit was published", early)
	}
}
