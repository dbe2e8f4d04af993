package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// The crash tests (issue 3, points 1 and 2) SIGKILL jetsync child processes
// while a single Postgres client writes a random workload, against a NATS
// server in this process that outlives them. One client, so that the order
// of its txlog sequence numbers is the commit order.

// crashSeed seeds what the tests choose at random: $JETSYNC_CRASH_SEED to
// replay a run, else the clock. Each test logs it.
func crashSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("JETSYNC_CRASH_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("JETSYNC_CRASH_SEED=%q: %v", v, err)
		}
		seed = n
	}
	t.Logf("seed %d (rerun with JETSYNC_CRASH_SEED=%d)", seed, seed)
	return seed
}

// crashRig is a Postgres database, a NATS server and a directory for the
// children's data. Its spine has no producer or consumer running in this
// process: it lends the spine tests' checks.
type crashRig struct {
	*spine
	root string
	r    *rand.Rand
}

const crashSeedRows = 80_000

func newCrashRig(t *testing.T, seed uint64) *crashRig {
	t.Helper()
	// Enough rows that an initial sync outlasts the first kills.
	s := newSpine(t, spineSchema+fmt.Sprintf(`
		INSERT INTO every (id, t, j, ai) SELECT g, 'seed ' || g || repeat(' padding', 20), '{"seed": true}', '{1,2}'
			FROM generate_series(1, %d) g;
		INSERT INTO pair SELECT 'seed-' || g, g %% 5, 'v' FROM generate_series(1, 100) g;`, crashSeedRows))
	s.file = ""
	return &crashRig{
		spine: s,
		root:  dataRoot(t),
		r:     rand.New(rand.NewPCG(seed, 7)),
	}
}

// dedupWindow is the change stream's JetStream dedup window in the tests:
// short, so that one restart can come after it.
const dedupWindow = time.Second

func (c *crashRig) startStreamer() *proc {
	p := start(c.t, []string{
		"JETSYNC_NATS_URL=" + c.nats,
		"ZERO_UPSTREAM_DB=" + c.url,
		"JETSYNC_DATA_DIR=" + filepath.Join(c.root, "cs"),
		"ZERO_TASK_ID=crash-cs",
		"ZERO_PORT=0",
		"ZERO_LOG_FORMAT=json",
		"JETSYNC_STREAM_DUPLICATES=" + dedupWindow.String(),
	}, "change-streamer")
	return p
}

func (c *crashRig) streamerReplica() string { return filepath.Join(c.root, "cs", "backup-replica.db") }

func (c *crashRig) startReplicator() *proc {
	p := start(c.t, []string{
		"JETSYNC_NATS_URL=" + c.nats,
		"JETSYNC_DATA_DIR=" + filepath.Join(c.root, "rep"),
		"ZERO_TASK_ID=crash-rep",
		"ZERO_PORT=0",
		"ZERO_LOG_FORMAT=json",
	}, "replicator")
	return p
}

func (c *crashRig) replicatorReplica() string {
	return filepath.Join(c.root, "rep", "replicator-replica.db")
}

// kill SIGKILLs p's process group and waits for it.
func kill(t *testing.T, p *proc) {
	t.Helper()
	if p.exited() {
		t.Fatalf("%v exited before it was killed (%v):\n%s", p.cmd.Args, p.err, p.stderr.String())
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %v: %v", p.cmd.Args, err)
	}
	<-p.done
}

// runFor lets a child run for d, failing the test if it exits meanwhile.
func runFor(t *testing.T, p *proc, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("%v exited (%v) while it should run:\n%s", p.cmd.Args, p.err, p.stderr.String())
	case <-time.After(d):
	}
}

func (c *crashRig) randDuration(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(c.r.Int64N(int64(hi-lo)))
}

// upstreamRecord reads the producer's record from the state bucket; nil
// when there is none yet.
func (c *crashRig) upstreamRecord() *streams.Upstream {
	ctx := context.Background()
	kv, err := c.js.KeyValue(ctx, c.shard.StateBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		c.t.Fatal(err)
	}
	e, err := kv.Get(ctx, streams.KeyUpstream)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		c.t.Fatal(err)
	}
	var u streams.Upstream
	if err := json.Unmarshal(e.Value(), &u); err != nil {
		c.t.Fatal(err)
	}
	return &u
}

// tail is the change stream's last message: its commit watermark and
// whether it ends a transaction. ok is false when the stream is empty.
func (c *crashRig) tail() (wm string, complete, ok bool) {
	ctx := context.Background()
	stream, err := c.js.Stream(ctx, c.shard.ChangesStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return "", false, false
	}
	if err != nil {
		c.t.Fatal(err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, c.shard.ChangesFilter())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", false, false
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return m.Header.Get(streams.HeaderWatermark), m.Header.Get(streams.HeaderCommit) != "", true
}

// confirmedLSN is the slot's confirmed_flush_lsn, 0 without a slot.
func (c *crashRig) confirmedLSN() uint64 {
	var lsn sql.NullString
	err := c.pg.QueryRow(context.Background(), `SELECT max(confirmed_flush_lsn)::text FROM pg_replication_slots WHERE database = current_database()`).Scan(&lsn)
	if err != nil {
		c.t.Fatal(err)
	}
	if !lsn.Valid {
		return 0
	}
	var hi, lo uint64
	if _, err := fmt.Sscanf(lsn.String, "%X/%X", &hi, &lo); err != nil {
		c.t.Fatalf("confirmed_flush_lsn %q: %v", lsn.String, err)
	}
	return hi<<32 | lo
}

// findRecord returns p's first JSON log line with this msg, or nil.
func findRecord(p *proc, msg string) map[string]any {
	for line := range strings.SplitSeq(p.stderr.String(), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil && r["msg"] == msg {
			return r
		}
	}
	return nil
}

// rowCounter counts the rows the writer's statements affect: each is one
// change in the stream.
type rowCounter struct{ n int64 }

func (rc *rowCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (rc *rowCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if d.Err == nil {
		rc.n += d.CommandTag.RowsAffected()
	}
}

// crashWriter runs the spine workload from one client until stopped, with
// a big multi-table transaction (several parts) every bigEvery.
type crashWriter struct {
	w       *workload
	conn    *pgx.Conn
	rows    *rowCounter
	changes map[int]int64 // txlog seq → the row changes its transaction made
	big     int           // big transactions committed
	// the previous big transaction's rows, deleted by the next one so
	// that the table stays small.
	bigFrom, bigTo int64
	stopc, done    chan struct{}
	err            error
}

const (
	bigEvery    = 40
	writerPace  = 3 * time.Millisecond
	bigIDOffset = 1 << 40
)

func startWriter(t *testing.T, url string, seed uint64) *crashWriter {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	rows := &rowCounter{}
	cfg.Tracer = rows
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorkload(0, 1_000_000)
	w.r = rand.New(rand.NewPCG(seed, 42))
	for id := int64(1); id <= 2000; id++ {
		w.ids = append(w.ids, id)
	}
	cw := &crashWriter{w: w, conn: conn, rows: rows, changes: map[int]int64{}, stopc: make(chan struct{}), done: make(chan struct{})}
	go cw.run()
	t.Cleanup(func() {
		cw.stop()
		conn.Close(context.Background())
	})
	return cw
}

func (cw *crashWriter) run() {
	defer close(cw.done)
	ctx := context.Background()
	tick := time.NewTicker(writerPace)
	defer tick.Stop()
	for i := 1; ; i++ {
		select {
		case <-cw.stopc:
			return
		case <-tick.C:
		}
		cw.rows.n = 0
		var err error
		if i%bigEvery == 0 {
			err = cw.bigTx(ctx)
		} else {
			err = cw.w.tx(ctx, cw.conn, false)
		}
		if err != nil {
			cw.err = fmt.Errorf("transaction %d: %w", cw.w.seq, err)
			return
		}
		cw.changes[cw.w.seq] = cw.rows.n
	}
}

// stop ends the workload after the transaction in hand and returns the
// writer's error.
func (cw *crashWriter) stop() error {
	select {
	case <-cw.stopc:
	default:
		close(cw.stopc)
	}
	<-cw.done
	return cw.err
}

// bigTx inserts 800-2,500 rows of ~700 bytes, upserts a pair row between
// them and the deletion of the previous big transaction's rows, so that it
// spans several messages and both tables.
func (cw *crashWriter) bigTx(ctx context.Context) error {
	w := cw.w
	w.seq++
	tx, err := cw.conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	from := bigIDOffset + int64(cw.big)*10_000
	to := from + 800 + w.r.Int64N(1700)
	if _, err := tx.Exec(ctx, `INSERT INTO every (id, t, jb, ai) SELECT g, repeat(md5(g::text), 20), jsonb_build_object('big', g), '{7,8}'
		FROM generate_series($1::int8, $2::int8) g`, from, to); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO pair VALUES ('big', $1, $2) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v`, int32(w.seq%5), fmt.Sprint("big ", w.seq)); err != nil {
		return err
	}
	if cw.bigTo != 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM every WHERE id BETWEEN $1 AND $2`, cw.bigFrom, cw.bigTo); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO txlog VALUES ($1, $2, $3)`, int64(w.client)<<32|int64(w.seq), w.client, w.seq); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	cw.big++
	cw.bigFrom, cw.bigTo = from, to
	return nil
}

// checkStreamExactlyOnce reads the whole stream as transactions (streamTxs
// fails on a part missing, repeated or out of place, and on a transaction
// left open) and checks it against what the writer committed: one initial
// sync, then every transaction committed after its snapshot exactly once, in
// commit order, with as many changes as the writer made.
func (c *crashRig) checkStreamExactlyOnce(cw *crashWriter, replicaVersion string) {
	t := c.t
	t.Helper()
	txs := c.streamTxs()
	if len(txs) == 0 {
		t.Fatal("the stream is empty")
	}
	resets := 0
	var backfilled []int
	var streamed []int
	for i, tx := range txs {
		if len(tx.changes) > 0 && tx.changes[0].c.Op == streams.OpReset {
			resets++
			if i != 0 {
				t.Errorf("transaction %d of the stream is a reset (%s): an initial sync beyond the first", i, tx.wm)
			}
			if got := tx.changes[0].c.Reset.ReplicaVersion; got != replicaVersion {
				t.Errorf("the stream's reset has replica version %s; the first completed initial sync had %s", got, replicaVersion)
			}
			for _, ch := range tx.changes {
				if ch.table != "txlog" || ch.c.Op != streams.OpBackfill {
					continue
				}
				ci, si := slices.Index(ch.c.Columns, "client"), slices.Index(ch.c.Columns, "seq")
				for _, row := range ch.c.Rows {
					var client, seq int
					if json.Unmarshal(row[ci], &client) != nil || json.Unmarshal(row[si], &seq) != nil {
						t.Fatalf("bad backfilled txlog row %s", row)
					}
					if client == 0 {
						backfilled = append(backfilled, seq)
					}
				}
			}
			continue
		}
		client, seq, n := -2, 0, 0
		for _, ch := range tx.changes {
			if ch.table == "txlog" && ch.c.Op == streams.OpInsert {
				n++
				if json.Unmarshal(ch.c.New["client"], &client) != nil || json.Unmarshal(ch.c.New["seq"], &seq) != nil {
					t.Fatalf("bad txlog row %v", ch.c.New)
				}
			}
		}
		if n != 1 {
			t.Errorf("transaction %s holds %d txlog rows; every transaction writes one", tx.wm, n)
			continue
		}
		switch client {
		case 0:
			streamed = append(streamed, seq)
			if want := cw.changes[seq]; int64(len(tx.changes)) != want {
				t.Errorf("transaction %d (%s): %d changes in the stream; the writer made %d", seq, tx.wm, len(tx.changes), want)
			}
		case -1: // a catch-up marker
			if len(tx.changes) != 1 {
				t.Errorf("marker transaction %s: %d changes in the stream; want 1", tx.wm, len(tx.changes))
			}
		default:
			t.Errorf("transaction %s by unknown client %d", tx.wm, client)
		}
	}
	if resets != 1 {
		t.Errorf("%d initial syncs in the stream; want 1", resets)
	}
	sort.Ints(backfilled)
	for i, seq := range backfilled {
		if seq != i+1 {
			t.Fatalf("the initial sync holds transactions %v…: not 1 to %d without a gap", backfilled[:min(i+1, 20)], len(backfilled))
		}
	}
	next := len(backfilled) + 1
	for _, seq := range streamed {
		switch {
		case seq < next:
			t.Fatalf("transaction %d is in the stream again (or out of commit order), after %d", seq, next-1)
		case seq > next:
			t.Fatalf("transaction %d follows %d in the stream: %d to %d are missing", seq, next-1, next, seq-1)
		}
		next++
	}
	if last := len(cw.changes); next-1 != last {
		t.Errorf("the stream ends at transaction %d; the writer committed %d", next-1, last)
	}
	t.Logf("stream: %d of the writer's transactions in the initial sync, %d streamed after it, %d in all", len(backfilled), len(streamed), len(txs))
}

// TestCrash_ChangeStreamer is issue 3 point 1: the change-streamer is
// SIGKILLed 24 times, at random, during its initial sync, while a big
// transaction is partly published, and whenever the stream holds
// transactions not yet confirmed upstream; once the restart comes after the
// dedup window. The stream then holds every committed transaction once and
// whole, in commit order, and both the replica that was killed with the
// change-streamer and a new one built from the stream equal Postgres.
func TestCrash_ChangeStreamer(t *testing.T) {
	seed := crashSeed(t)
	c := newCrashRig(t, seed)
	c.file = c.streamerReplica()
	cw := startWriter(t, c.url, seed)
	const iterations = 24
	var initialKills, midTxKills, unconfirmedKills int
	var replicaVersion string
	started := time.Now()
	for i := range iterations {
		p := c.startStreamer()
		rec := c.upstreamRecord()
		switch {
		case i < 3 && (rec == nil || !rec.Complete):
			// Into the initial sync, which takes half a second or more.
			p.logRecord(t, "initial sync started", time.Minute)
			runFor(t, p, c.randDuration(5*time.Millisecond, 250*time.Millisecond))
		case replicaVersion == "":
			polltest.Until(t, 2*time.Minute, "the initial sync to complete", func() bool {
				u := c.upstreamRecord()
				return u != nil && u.Complete
			})
			runFor(t, p, c.randDuration(50*time.Millisecond, 800*time.Millisecond))
		case i%3 == 0:
			// Mid-publish: as soon as the stream ends inside a transaction.
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				if _, complete, ok := c.tail(); ok && !complete {
					break
				}
				runFor(t, p, time.Millisecond)
			}
		default:
			runFor(t, p, c.randDuration(50*time.Millisecond, 800*time.Millisecond))
		}
		kill(t, p)
		u := c.upstreamRecord()
		wm, complete, ok := c.tail()
		switch {
		case u != nil && !u.Complete:
			initialKills++
		case ok && !complete:
			midTxKills++
		}
		if u != nil && u.Complete {
			if replicaVersion == "" {
				replicaVersion = u.ReplicaVersion
				if took, ok := findRecord(p, "initial sync done")["took"].(float64); ok {
					t.Logf("kill %d: the initial sync completed in %s", i, time.Duration(took))
				}
			} else if u.ReplicaVersion != replicaVersion {
				t.Errorf("kill %d: replica version %s after the initial sync %s completed: an unasked-for resync", i, u.ReplicaVersion, replicaVersion)
			}
			if lsn, err := streams.ParseLexi(wm); ok && err == nil && c.confirmedLSN() <= lsn {
				unconfirmedKills++
			}
		}
		if i == iterations/2 {
			// The next start comes after the dedup window: JetStream no
			// longer drops a republished message by its Nats-Msg-Id.
			<-time.After(dedupWindow + dedupWindow/2)
		}
		if err := cw.err; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	t.Logf("%d kills in %s: %d during the initial sync, %d inside a published transaction, %d with published transactions unconfirmed upstream; %d big transactions so far",
		iterations, time.Since(started).Round(time.Millisecond), initialKills, midTxKills, unconfirmedKills, cw.big)
	if initialKills == 0 || midTxKills == 0 || unconfirmedKills == 0 {
		t.Errorf("the kills missed a spot: %d during the initial sync, %d inside a transaction, %d unconfirmed; want each > 0", initialKills, midTxKills, unconfirmedKills)
	}

	final := c.startStreamer()
	if err := cw.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("the writer committed %d transactions, %d of them big", len(cw.changes), cw.big)
	c.waitCaughtUp(2 * time.Minute)
	c.checkReplicaEqualsPostgres()

	// A replica built from the stream alone.
	rep := c.startReplicator()
	fresh := *c.spine
	fresh.file = c.replicatorReplica()
	fresh.waitCaughtUp(2 * time.Minute)
	fresh.checkReplicaEqualsPostgres()
	for _, p := range []*proc{rep, final} {
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Errorf("%v exit code %d after SIGTERM; want 0", p.cmd.Args, code)
		}
	}
	c.checkStreamExactlyOnce(cw, replicaVersion)
	t.Logf("took %s", time.Since(started).Round(time.Millisecond))
}

// replicaState reads a replica file's state; the zero State when the file
// or its state is not there yet.
func replicaState(t *testing.T, file string) replica.State {
	t.Helper()
	if _, err := os.Stat(file); err != nil {
		return replica.State{}
	}
	db := openFile(t, file)
	defer db.Close()
	st, err := replica.LoadState(context.Background(), db)
	if err != nil {
		return replica.State{}
	}
	return st
}

// applyLogSQL makes the replica count, in its own transactions, every row
// its consumer writes to the user tables. The log rolls back with what it
// logs, so it holds what was committed: a change applied twice shows as two
// entries under its transaction's version.
const applyLogSQL = `
CREATE TABLE crash_applied (tbl TEXT NOT NULL, version TEXT NOT NULL);
CREATE TRIGGER crash_every_ins AFTER INSERT ON every BEGIN INSERT INTO crash_applied VALUES ('every', NEW._0_version); END;
CREATE TRIGGER crash_every_upd AFTER UPDATE ON every BEGIN INSERT INTO crash_applied VALUES ('every', NEW._0_version); END;
CREATE TRIGGER crash_pair_ins AFTER INSERT ON pair BEGIN INSERT INTO crash_applied VALUES ('pair', NEW._0_version); END;
CREATE TRIGGER crash_pair_upd AFTER UPDATE ON pair BEGIN INSERT INTO crash_applied VALUES ('pair', NEW._0_version); END;
CREATE TRIGGER crash_txlog_ins AFTER INSERT ON txlog BEGIN INSERT INTO crash_applied VALUES ('txlog', NEW._0_version); END;
CREATE TRIGGER crash_txlog_upd AFTER UPDATE ON txlog BEGIN INSERT INTO crash_applied VALUES ('txlog', NEW._0_version); END;
`

func installApplyLog(t *testing.T, file string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+file+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(applyLogSQL); err != nil {
		t.Fatalf("install the apply log in %s: %v", file, err)
	}
}

// TestCrash_Replica is issue 3 point 2: a replicator is SIGKILLed 14 times
// at random, during its initial sync and mid-batch (big transactions span
// several messages, which it holds uncommitted until the last), while a
// change-streamer streams a live workload. It then equals Postgres, and the
// rows it wrote, counted by triggers in its own transactions, match the
// stream's inserts and updates one for one: nothing was applied twice.
func TestCrash_Replica(t *testing.T) {
	seed := crashSeed(t)
	c := newCrashRig(t, seed)
	c.file = c.replicatorReplica()
	cw := startWriter(t, c.url, seed)
	cs := c.startStreamer()
	polltest.Until(t, 2*time.Minute, "the change-streamer's initial sync", func() bool {
		u := c.upstreamRecord()
		return u != nil && u.Complete
	})
	const iterations = 14
	var initialKills, behindKills int
	var logFrom replica.State // where the apply log starts
	started := time.Now()
	for i := range iterations {
		p := c.startReplicator()
		st := replicaState(t, c.file)
		if i < 2 {
			// Into the initial sync: it takes seconds to apply.
			p.logRecord(t, "following the change stream", time.Minute)
		} else if st.ReplicaVersion == "" {
			polltest.Until(t, 2*time.Minute, "the replica's initial sync", func() bool {
				return replicaState(t, c.file).ReplicaVersion != ""
			})
		}
		runFor(t, p, c.randDuration(50*time.Millisecond, 500*time.Millisecond))
		kill(t, p)
		st = replicaState(t, c.file)
		info, err := c.stream().Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case st.ReplicaVersion == "":
			initialKills++
		case st.StreamSeq < info.State.LastSeq:
			behindKills++
		}
		if logFrom.ReplicaVersion == "" && st.ReplicaVersion != "" {
			installApplyLog(t, c.file)
			logFrom = st
		}
		if cs.exited() {
			t.Fatalf("the change-streamer exited: %v\n%s", cs.err, cs.stderr.String())
		}
		if err := cw.err; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	t.Logf("%d kills in %s: %d during the initial sync, %d with the stream ahead of the replica; %d big transactions so far",
		iterations, time.Since(started).Round(time.Millisecond), initialKills, behindKills, cw.big)
	if initialKills == 0 || behindKills == 0 {
		t.Errorf("the kills missed a spot: %d during the initial sync, %d behind the stream; want each > 0", initialKills, behindKills)
	}
	if logFrom.ReplicaVersion == "" {
		t.Fatal("the replica never completed its initial sync")
	}

	rep := c.startReplicator()
	if err := cw.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	c.waitCaughtUp(2 * time.Minute)
	for _, p := range []*proc{rep, cs} {
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Errorf("%v exit code %d after SIGTERM; want 0", p.cmd.Args, code)
		}
	}
	c.checkReplicaEqualsPostgres()
	if st := replicaState(t, c.file); st.ReplicaVersion != logFrom.ReplicaVersion {
		t.Errorf("replica version %s; it was %s: the replica was rebuilt", st.ReplicaVersion, logFrom.ReplicaVersion)
	}

	// What the stream holds past the replica's state when the log started,
	// against what the replica wrote.
	want := map[string]int{}
	for _, tx := range c.streamTxs() {
		if tx.wm <= logFrom.Watermark {
			continue
		}
		for _, ch := range tx.changes {
			if ch.c.Op == streams.OpInsert || ch.c.Op == streams.OpUpdate {
				want[ch.table+" "+tx.wm]++
			}
		}
	}
	db := openFile(t, c.file)
	defer db.Close()
	rows, err := db.Query(`SELECT tbl, version, count(*) FROM crash_applied GROUP BY 1, 2`)
	if err != nil {
		t.Fatalf("read the apply log (gone if the replica dropped its tables to rebuild): %v", err)
	}
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var tbl, version string
		var n int
		if err := rows.Scan(&tbl, &version, &n); err != nil {
			t.Fatal(err)
		}
		got[tbl+" "+version] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for k, n := range got {
		if n != want[k] {
			if bad++; bad <= 10 {
				t.Errorf("%s: the replica wrote %d rows; the stream has %d inserts and updates", k, n, want[k])
			}
		}
	}
	for k, n := range want {
		if _, ok := got[k]; !ok {
			if bad++; bad <= 10 {
				t.Errorf("%s: the replica wrote no rows; the stream has %d inserts and updates", k, n)
			}
		}
	}
	t.Logf("the replica applied %d transactions' rows once each since %s; took %s", len(want), logFrom.Watermark, time.Since(started).Round(time.Millisecond))
}

func (c *crashRig) stream() jetstream.Stream {
	s, err := c.js.Stream(context.Background(), c.shard.ChangesStream())
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}
