package pgrepl_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/producers/pgrepl"
	"github.com/jetsync/jetsync/streams"
)

// TestSource_Throughput measures small transactions per second through the
// producer into a server that fsyncs every message. JETSYNC_PERF=1 runs it.
func TestSource_Throughput(t *testing.T) {
	if os.Getenv("JETSYNC_PERF") == "" {
		t.Skip("JETSYNC_PERF not set")
	}
	c := pgtest.Start(t)
	url := pgtest.NewDB(t, c)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE a (id int PRIMARY KEY, v text)`); err != nil {
		t.Fatal(err)
	}
	ns := natstest.Start(t, natstest.SyncAlways())
	_, js := natstest.Connect(t, ns)
	e := &env{url: url, conn: conn, js: js}
	e.run(t)
	e.waitSynced(t, "")

	writers, _ := strconv.Atoi(os.Getenv("JETSYNC_PERF_WRITERS"))
	if writers == 0 {
		writers = 8
	}
	const perWriter = 5000
	start := time.Now()
	insertConcurrently(t, url, `INSERT INTO a VALUES ($1, 'x')`, writers, perWriter)
	wrote := time.Since(start)
	n := writers * perWriter
	// The sentinel commits after every insert: once it is in the stream,
	// all of them are.
	var lsn string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	l, _ := pglogrepl.ParseLSN(lsn)
	before := uint64(l)
	if _, err := conn.Exec(ctx, `INSERT INTO a VALUES (-1, 'sentinel')`); err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, shard.ChangesStream())
	var msgs uint64
	polltest.Until(t, 5*time.Minute, "all transactions", func() bool {
		m, err := s.GetLastMsgForSubject(ctx, shard.ChangesFilter())
		if err != nil {
			return false
		}
		msgs = m.Sequence
		wm, _ := streams.ParseLexi(m.Header.Get(streams.HeaderCommit))
		return wm > before
	})
	took := time.Since(start)
	t.Logf("%d transactions: written in %v (%.0f/s), streamed in %v (%.0f tx/s), %d messages",
		n, wrote.Round(time.Millisecond), float64(n)/wrote.Seconds(), took.Round(time.Millisecond), float64(n)/took.Seconds(), msgs)
	_, txs := transactions(t, e.messages(t))
	if len(txs) != n+2 {
		t.Errorf("%d transactions in the stream; want %d", len(txs), n+2)
	}
}

// TestSource_CopyWorkers measures the initial sync with 1 and 5 workers.
func TestSource_CopyWorkers(t *testing.T) {
	if os.Getenv("JETSYNC_PERF") == "" {
		t.Skip("JETSYNC_PERF not set")
	}
	c := pgtest.Start(t)
	url := pgtest.NewDB(t, c)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for i := range 6 {
		_, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE t%d (id int PRIMARY KEY, v text, n float8, ts timestamptz);
			INSERT INTO t%d SELECT g, md5(g::text), g / 3.0, now() FROM generate_series(1, 100000) g`, i, i))
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, workers := range []int{1, 2, 5} {
		ns := natstest.Start(t, natstest.SyncAlways())
		_, js := natstest.Connect(t, ns)
		src, err := pgrepl.New(pgrepl.Config{UpstreamURL: url, Shard: shard, CopyWorkers: workers,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}, js)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { src.Run(rctx); close(done) }()
		e := &env{url: url, conn: conn, js: js}
		e.waitSynced(t, "")
		cancel()
		<-done
	}
}
