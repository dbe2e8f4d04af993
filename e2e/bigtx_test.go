package e2e

import (
	"context"
	"crypto/md5"
	"database/sql"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jetsync/jetsync/internal/polltest"
)

// Issue 3, point 4: a large transaction streams through in bounded memory,
// is applied atomically, and delays only what committed after it.
const (
	bigRows = 200_000
	// bigHeapLimit bounds each process's peak Go heap.
	bigHeapLimit = 64 << 20
	// smallLag bounds how long a small transaction may take to reach the
	// replica beyond what the big one makes it wait: commit to applied
	// under a 200 MB load on two shared cores.
	smallLag = 3 * time.Second
	// smallPace is how often the second client commits.
	smallPace = 10 * time.Millisecond
)

const bigSchema = `
CREATE TABLE big (id int8 PRIMARY KEY, payload text NOT NULL);
CREATE TABLE txlog (n int8 PRIMARY KEY, client int4 NOT NULL, seq int4 NOT NULL);
`

// smallTx is one of the second client's transactions.
type smallTx struct {
	committed time.Time // when its COMMIT returned
	seen      time.Time // when the replica first showed it
	version   string    // its commit watermark, from the replica
}

// TestBigTransaction commits 200,000 rows of 1 kB in one transaction while
// a second client commits small transactions, with the change-streamer and
// a replicator in processes of their own. The replica shows the big
// transaction whole or not at all; each process's Go heap stays under
// 64 MiB; a small transaction committed before the big one does not wait
// for it, and one committed after it waits no longer than the big one takes
// to apply.
func TestBigTransaction(t *testing.T) {
	s := newSpine(t, bigSchema)
	url, pg, ctx := s.url, s.pg, context.Background()
	root := dataRoot(t)
	s.file = filepath.Join(root, "rep", "replicator-replica.db")

	common := []string{"JETSYNC_NATS_URL=" + s.nats, "ZERO_PORT=0", "ZERO_LOG_FORMAT=json"}
	cs := start(t, append([]string{"ZERO_UPSTREAM_DB=" + url, "JETSYNC_DATA_DIR=" + filepath.Join(root, "cs"), "ZERO_TASK_ID=big-cs"}, common...), "change-streamer")
	rep := start(t, append([]string{"JETSYNC_DATA_DIR=" + filepath.Join(root, "rep"), "ZERO_TASK_ID=big-rep"}, common...), "replicator")
	csPort := int(cs.logRecord(t, "http listening", 30*time.Second)["port"].(float64))
	repPort := int(rep.logRecord(t, "http listening", 30*time.Second)["port"].(float64))
	s.waitCaughtUp(time.Minute)
	started := time.Now()

	db := s.openReplica()
	t.Cleanup(func() { db.Close() })
	w := startSmallWriter(t, url)
	poll := startBigPoller(db)

	// The big transaction, once the small ones flow.
	polltest.Until(t, 10*time.Second, "the first small transactions in the replica", func() bool { return poll.smallSeen() >= 3 })
	bigStart := time.Now()
	tx, err := pg.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// md5 text repeated: 1 kB that Postgres stores inline, uncompressed.
	if _, err := tx.Exec(ctx, `INSERT INTO big SELECT g, repeat(md5(g::text), 32) FROM generate_series(1, $1::int8) g`, bigRows); err != nil {
		t.Fatal(err)
	}
	commitStart := time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	t.Logf("big transaction: %d rows inserted in %s, committed in %s", bigRows, commitStart.Sub(bigStart).Round(time.Millisecond), committed.Sub(commitStart).Round(time.Millisecond))
	// 200 MB of changes pass logical_decoding_work_mem (64 MB by default):
	// Postgres streamed it before its commit (pgoutput protocol 2), so the
	// heap bound below holds on that path.
	polltest.Until(t, 30*time.Second, "Postgres to count the big transaction as streamed", func() bool {
		_, n := s.streamBlocks()
		return n >= 1
	})

	polltest.Until(t, 80*time.Second, "the big transaction in the replica", func() bool {
		if cs.exited() || rep.exited() {
			t.Fatalf("a jetsync process exited: change-streamer %v, replicator %v", cs.err, rep.err)
		}
		return !poll.bigSeen().IsZero() || poll.failed()
	})
	visible := poll.bigSeen()
	// Small transactions keep coming for a while after it.
	polltest.Until(t, 20*time.Second, "small transactions after the big one", func() bool {
		return w.count() > w.countAt(visible)+50
	})
	w.stop()
	s.waitCaughtUp(time.Minute)
	// The replica holds every small transaction now; let the poller take
	// its next look before it stops, or the last ones go unseen.
	polltest.Until(t, 10*time.Second, "the poller to see every small transaction", func() bool {
		return poll.smallSeen() >= w.count() || poll.failed()
	})
	poll.stop()
	if err := poll.err(); err != nil {
		t.Fatal(err)
	}
	if !visible.IsZero() {
		t.Logf("big transaction visible in the replica %s after its commit (%s after the test's start)", visible.Sub(committed).Round(time.Millisecond), visible.Sub(started).Round(time.Millisecond))
	}

	t.Run("ReplicaEqualsPostgres", func(t *testing.T) { checkBigEqual(t, pg, db) })

	t.Run("PeakHeap", func(t *testing.T) {
		for _, p := range []struct {
			name string
			port int
		}{{"change-streamer", csPort}, {"replicator", repPort}} {
			peak, goal := heapPeaks(t, p.port)
			t.Logf("%s: peak Go heap %.1f MiB (heap goal peak %.1f MiB)", p.name, float64(peak)/(1<<20), float64(goal)/(1<<20))
			// The sampled peak can miss the top of a short GC cycle; the
			// heap goal bounds it from above, so both must stay under.
			if peak >= bigHeapLimit || goal >= bigHeapLimit {
				t.Errorf("%s: peak Go heap %.1f MiB, heap goal peak %.1f MiB; want both < 64 MiB", p.name, float64(peak)/(1<<20), float64(goal)/(1<<20))
			}
		}
	})

	t.Run("SmallTransactions", func(t *testing.T) {
		var bigVersion string
		if err := db.QueryRow(`SELECT _0_version FROM big WHERE id = 1`).Scan(&bigVersion); err != nil {
			t.Fatal(err)
		}
		txs := w.result(t, db, poll)
		var before, after int
		var worstBefore, worstAfter time.Duration
		bad := 0
		for seq, st := range txs {
			if st.seen.IsZero() {
				t.Errorf("small transaction %d never seen in the replica", seq)
				continue
			}
			if st.version < bigVersion {
				// Committed before the big one: it must not wait for it.
				before++
				lag := st.seen.Sub(st.committed)
				worstBefore = max(worstBefore, lag)
				if !st.seen.Before(visible) || lag > smallLag {
					if bad++; bad <= 5 {
						t.Errorf("small transaction %d committed before the big one: seen %s after its commit, %s before the big one; want < %s, and before it",
							seq, lag.Round(time.Millisecond), visible.Sub(st.seen).Round(time.Millisecond), smallLag)
					}
				}
				continue
			}
			// After it: it waits for the big one to apply, and no longer.
			after++
			due := st.committed
			if visible.After(due) {
				due = visible
			}
			late := st.seen.Sub(due)
			worstAfter = max(worstAfter, late)
			if late > smallLag {
				if bad++; bad <= 5 {
					t.Errorf("small transaction %d committed after the big one: seen %s after max(its commit, the big one's apply); want < %s", seq, late.Round(time.Millisecond), smallLag)
				}
			}
		}
		t.Logf("%d small transactions committed before the big one (worst commit → replica %s), %d after (worst beyond the big one's apply %s)",
			before, worstBefore.Round(time.Millisecond), after, worstAfter.Round(time.Millisecond))
		if before < 10 || after < 10 {
			t.Errorf("%d small transactions before the big one and %d after; want at least 10 of each", before, after)
		}
	})
	t.Logf("took %s", time.Since(started).Round(time.Millisecond))
	for _, p := range []*proc{rep, cs} {
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Errorf("%v exit code %d after SIGTERM; want 0", p.cmd.Args, code)
		}
	}
}

// smallWriter commits one-row transactions on its own connection, each
// recording when its COMMIT returned.
type smallWriter struct {
	conn        *pgx.Conn
	mu          sync.Mutex
	commits     []time.Time // by seq-1
	err         error
	stopc, done chan struct{}
}

func startSmallWriter(t *testing.T, url string) *smallWriter {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	w := &smallWriter{conn: conn, stopc: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	t.Cleanup(func() {
		w.stop()
		conn.Close(context.Background())
	})
	return w
}

func (w *smallWriter) run() {
	defer close(w.done)
	ctx := context.Background()
	tick := time.NewTicker(smallPace)
	defer tick.Stop()
	for seq := 1; ; seq++ {
		select {
		case <-w.stopc:
			return
		case <-tick.C:
		}
		if _, err := w.conn.Exec(ctx, `INSERT INTO txlog VALUES ($1, 1, $2)`, int64(1)<<32|int64(seq), seq); err != nil {
			w.mu.Lock()
			w.err = fmt.Errorf("small transaction %d: %w", seq, err)
			w.mu.Unlock()
			return
		}
		now := time.Now()
		w.mu.Lock()
		w.commits = append(w.commits, now)
		w.mu.Unlock()
	}
}

func (w *smallWriter) stop() {
	select {
	case <-w.stopc:
	default:
		close(w.stopc)
	}
	<-w.done
}

func (w *smallWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.commits)
}

// countAt is how many transactions had committed at t.
func (w *smallWriter) countAt(t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for n < len(w.commits) && !w.commits[n].After(t) {
		n++
	}
	return n
}

// result joins what the writer committed with what the poller saw and the
// replica's commit watermarks.
func (w *smallWriter) result(t *testing.T, db *sql.DB, p *bigPoller) map[int]*smallTx {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Fatal(w.err)
	}
	out := map[int]*smallTx{}
	for i, c := range w.commits {
		out[i+1] = &smallTx{committed: c}
	}
	p.mu.Lock()
	for seq, at := range p.seen {
		if st, ok := out[seq]; ok {
			st.seen = at
		}
	}
	p.mu.Unlock()
	rows, err := db.Query(`SELECT seq, _0_version FROM txlog WHERE client = 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var seq int
		var v string
		if err := rows.Scan(&seq, &v); err != nil {
			t.Fatal(err)
		}
		if st, ok := out[seq]; ok {
			st.version = v
		} else {
			t.Errorf("the replica holds small transaction %d, which the writer did not commit", seq)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// bigPoller reads the replica every few milliseconds, each time in one read
// transaction: the big transaction's rows must all be there or none, and it
// notes when each small transaction first shows.
type bigPoller struct {
	db          *sql.DB
	mu          sync.Mutex
	seen        map[int]time.Time // small seq → first seen
	maxSeq      int
	big         time.Time // when the big transaction first showed
	failure     error
	stopc, done chan struct{}
}

const pollEvery = 10 * time.Millisecond

func startBigPoller(db *sql.DB) *bigPoller {
	p := &bigPoller{db: db, seen: map[int]time.Time{}, stopc: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *bigPoller) run() {
	defer close(p.done)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		select {
		case <-p.stopc:
			return
		case <-tick.C:
		}
		if err := p.once(); err != nil {
			p.mu.Lock()
			p.failure = err
			p.mu.Unlock()
			return
		}
	}
}

func (p *bigPoller) once() error {
	ctx := context.Background()
	tx, err := p.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("poll: %w", err)
	}
	defer tx.Rollback()
	p.mu.Lock()
	from, bigDone := p.maxSeq, !p.big.IsZero()
	p.mu.Unlock()
	rows, err := tx.Query(`SELECT seq FROM txlog WHERE client = 1 AND seq > ?`, from)
	if err != nil {
		return fmt.Errorf("poll txlog: %w", err)
	}
	var seqs []int
	for rows.Next() {
		var seq int
		if err := rows.Scan(&seq); err != nil {
			rows.Close()
			return err
		}
		seqs = append(seqs, seq)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("poll txlog: %w", err)
	}
	var bigAt time.Time
	if !bigDone {
		// The first, middle and last rows, and the count when any shows:
		// a partly applied transaction shows in one of them.
		var first, mid, last int
		if err := tx.QueryRow(`SELECT (SELECT count(*) FROM big WHERE id = 1), (SELECT count(*) FROM big WHERE id = ?), (SELECT count(*) FROM big WHERE id = ?)`,
			bigRows/2, bigRows).Scan(&first, &mid, &last); err != nil {
			return fmt.Errorf("poll big: %w", err)
		}
		if first+mid+last > 0 {
			var n int
			if err := tx.QueryRow(`SELECT count(*) FROM big`).Scan(&n); err != nil {
				return fmt.Errorf("poll big: %w", err)
			}
			if n != bigRows || first+mid+last != 3 {
				return fmt.Errorf("the replica shows part of the big transaction: %d of %d rows (first %d, middle %d, last %d)", n, bigRows, first, mid, last)
			}
			bigAt = time.Now()
		}
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, seq := range seqs {
		if _, ok := p.seen[seq]; !ok {
			p.seen[seq] = now
		}
		p.maxSeq = max(p.maxSeq, seq)
	}
	if !bigAt.IsZero() {
		p.big = bigAt
	}
	return nil
}

func (p *bigPoller) smallSeen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

func (p *bigPoller) bigSeen() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.big
}

func (p *bigPoller) failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failure != nil
}

func (p *bigPoller) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failure
}

func (p *bigPoller) stop() {
	select {
	case <-p.stopc:
	default:
		close(p.stopc)
	}
	<-p.done
}

// checkBigEqual compares big row by row, by md5 of the payload, and txlog
// whole.
func checkBigEqual(t *testing.T, pg *pgx.Conn, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	pgRows, err := pg.Query(ctx, `SELECT id, md5(payload) FROM big ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer pgRows.Close()
	repRows, err := db.Query(`SELECT id, payload FROM big ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer repRows.Close()
	n, bad := 0, 0
	for pgRows.Next() {
		var id int64
		var sum string
		if err := pgRows.Scan(&id, &sum); err != nil {
			t.Fatal(err)
		}
		if !repRows.Next() {
			t.Fatalf("big: the replica ends before Postgres's row %d", id)
		}
		var rid int64
		var payload string
		if err := repRows.Scan(&rid, &payload); err != nil {
			t.Fatal(err)
		}
		h := md5.Sum([]byte(payload))
		if rid != id || hex.EncodeToString(h[:]) != sum {
			if bad++; bad <= 5 {
				t.Errorf("big: replica row %d (payload %.40q…) where Postgres has row %d", rid, payload, id)
			}
		}
		n++
	}
	if err := pgRows.Err(); err != nil {
		t.Fatal(err)
	}
	if repRows.Next() {
		t.Errorf("big: the replica has rows past Postgres's %d", n)
	}
	if n != bigRows {
		t.Errorf("big: Postgres has %d rows; want %d", n, bigRows)
	}

	want := map[string]bool{}
	rows, err := pg.Query(ctx, `SELECT n, client, seq FROM txlog`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var nn int64
		var client, seq int32
		if err := rows.Scan(&nn, &client, &seq); err != nil {
			t.Fatal(err)
		}
		want[fmt.Sprint(nn, client, seq)] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	rrows, err := db.Query(`SELECT n, client, seq FROM txlog`)
	if err != nil {
		t.Fatal(err)
	}
	defer rrows.Close()
	for rrows.Next() {
		var nn int64
		var client, seq int32
		if err := rrows.Scan(&nn, &client, &seq); err != nil {
			t.Fatal(err)
		}
		got[fmt.Sprint(nn, client, seq)] = true
	}
	if len(got) != len(want) {
		t.Errorf("txlog: the replica has %d rows; Postgres %d", len(got), len(want))
	}
	for k := range want {
		if !got[k] {
			t.Errorf("txlog: row %s missing from the replica", k)
			break
		}
	}
}

// heapPeaks scrapes a jetsync process's /metrics for its peak Go heap and
// peak GC heap goal.
func heapPeaks(t *testing.T, port int) (peak, goal uint64) {
	t.Helper()
	body, code := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if code != 200 {
		t.Fatalf("GET /metrics on port %d = %d", port, code)
	}
	read := func(name string) uint64 {
		for line := range strings.SplitSeq(body, "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				return uint64(f)
			}
		}
		t.Fatalf("/metrics on port %d has no %s", port, name)
		return 0
	}
	return read("jetsync_go_heap_peak_bytes"), read("jetsync_go_heap_goal_peak_bytes")
}
