package pgrepl_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// The streamed-transaction tests run with logical_decoding_work_mem at its
// minimum, 64kB, so that Postgres streams any transaction of more than a
// few hundred rows before its commit (pgoutput protocol 2).

const streamedSchema = `CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (id int PRIMARY KEY)`

// newStreamingEnv is newEnv with the database's walsenders streaming early.
func newStreamingEnv(t *testing.T, schema string) *env {
	t.Helper()
	e := newEnv(t, schema)
	var db string
	if err := e.conn.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	e.exec(t, fmt.Sprintf(`ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'`, pgx.Identifier{db}.Sanitize()))
	return e
}

// streamedTxns is what Postgres's own statistics count as streamed on the
// slot: transactions, and blocks sent.
func (e *env) streamedTxns(t *testing.T, slot string) (txns, blocks int64) {
	t.Helper()
	err := e.conn.QueryRow(context.Background(),
		`SELECT coalesce(sum(stream_txns), 0), coalesce(sum(stream_count), 0) FROM pg_stat_replication_slots WHERE slot_name = $1`, slot).Scan(&txns, &blocks)
	if err != nil {
		t.Fatal(err)
	}
	return txns, blocks
}

// waitStreamed waits until Postgres has sent more than blocks stream
// blocks on the slot.
func (e *env) waitStreamed(t *testing.T, slot string, blocks int64) int64 {
	t.Helper()
	var n int64
	polltest.Until(t, 30*time.Second, "Postgres to stream a block", func() bool {
		_, n = e.streamedTxns(t, slot)
		return n > blocks
	})
	return n
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func execOn(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// idRange is lo..hi.
func idRange(lo, hi int) []int {
	out := make([]int, 0, hi-lo+1)
	for i := lo; i <= hi; i++ {
		out = append(out, i)
	}
	return out
}

// txWith returns the transaction of the stream that inserted id into
// table, or nil.
func txWith(txs []txn, table string, id int) *txn {
	for i := range txs {
		if slices.Contains(inserted(txs[i:i+1], table), id) {
			return &txs[i]
		}
	}
	return nil
}

// TestSource_StreamedCommit: a transaction Postgres streams before its
// commit, with a schema change and a second table in it, is in the stream
// once, whole, at its commit, after the small transactions that committed
// while it ran.
func TestSource_StreamedCommit(t *testing.T) {
	e := newStreamingEnv(t, streamedSchema)
	e.run(t)
	u := e.waitSynced(t, "")
	_, blocks := e.streamedTxns(t, u.Slot)

	big := connect(t, e.url)
	execOn(t, big, `BEGIN`)
	execOn(t, big, `INSERT INTO a SELECT g, repeat('x', 100) FROM generate_series(1, 10000) g`)
	blocks = e.waitStreamed(t, u.Slot, blocks)
	// Committed while the big one is open: in the stream before it.
	e.exec(t, `INSERT INTO a VALUES (-1, 'small')`)
	polltest.Until(t, 30*time.Second, "the small transaction in the stream", func() bool {
		_, txs := transactions(t, e.messages(t))
		return txWith(txs, "a", -1) != nil
	})
	execOn(t, big, `ALTER TABLE a ADD COLUMN extra int DEFAULT 7`)
	execOn(t, big, `INSERT INTO a SELECT g, 'late', 8 FROM generate_series(10001, 20000) g`)
	execOn(t, big, `INSERT INTO b SELECT g FROM generate_series(1, 3000) g`)
	e.waitStreamed(t, u.Slot, blocks)
	// Nothing of it before the commit.
	if _, txs := transactions(t, e.messages(t)); txWith(txs, "a", 1) != nil {
		t.Fatal("the open transaction's rows are in the stream before its commit")
	}
	execOn(t, big, `COMMIT`)
	e.exec(t, `INSERT INTO a VALUES (-2, 'after', 0)`)

	txs := e.waitTxs(t, 4)
	if n := len(txs); n != 4 {
		t.Fatalf("%d transactions; want 4 (initial sync, small, big, after)", n)
	}
	if got := inserted(txs[1:2], "a"); !slices.Equal(got, []int{-1}) {
		t.Errorf("second transaction inserts %v into a; want [-1]", got)
	}
	bigTx := txs[2:3]
	if got := inserted(bigTx, "a"); !slices.Equal(got, idRange(1, 20000)) {
		t.Errorf("the streamed transaction inserts %d rows into a (first %v); want ids 1..20000 in order", len(got), got[:min(len(got), 5)])
	}
	if got := inserted(bigTx, "b"); !slices.Equal(got, idRange(1, 3000)) {
		t.Errorf("the streamed transaction inserts %d rows into b; want ids 1..3000", len(got))
	}
	addCol := slices.IndexFunc(bigTx[0].changes, func(c tchange) bool { return c.Op == streams.OpAddColumn })
	firstLate := slices.IndexFunc(bigTx[0].changes, func(c tchange) bool { return string(c.New["id"]) == "10001" })
	if addCol < 0 || firstLate < addCol || string(bigTx[0].changes[firstLate].New["extra"]) != "8" {
		t.Errorf("add-column at change %d, first row after it at %d (%v); want the column added before the rows that use it", addCol, firstLate, bigTx[0].changes[max(firstLate, 0)].New)
	}
	if got := inserted(txs[3:], "a"); !slices.Equal(got, []int{-2}) {
		t.Errorf("last transaction inserts %v; want [-2]", got)
	}
	if n, _ := e.streamedTxns(t, u.Slot); n < 1 {
		t.Errorf("Postgres streamed %d transactions; want the big one streamed", n)
	}
}

// TestSource_StreamedAbort: a streamed transaction that rolls back, and
// one whose subtransactions roll back, leave no trace in the stream.
func TestSource_StreamedAbort(t *testing.T) {
	e := newStreamingEnv(t, streamedSchema)
	e.run(t)
	u := e.waitSynced(t, "")
	e.exec(t, `INSERT INTO a SELECT g, 'seed' FROM generate_series(-200, -101) g`)
	_, blocks := e.streamedTxns(t, u.Slot)

	// Rolled back whole, after Postgres streamed part of it.
	c := connect(t, e.url)
	execOn(t, c, `BEGIN`)
	execOn(t, c, `INSERT INTO a SELECT g, repeat('x', 100) FROM generate_series(1, 10000) g`)
	execOn(t, c, `UPDATE a SET v = 'aborted' WHERE id < 0`)
	blocks = e.waitStreamed(t, u.Slot, blocks)
	execOn(t, c, `ROLLBACK`)

	// Savepoints: what ROLLBACK TO undoes (nested ones included) is gone,
	// what RELEASE keeps stays.
	execOn(t, c, `BEGIN`)
	execOn(t, c, `INSERT INTO a SELECT g, 'kept' FROM generate_series(20001, 25000) g`)
	execOn(t, c, `SAVEPOINT s1`)
	execOn(t, c, `INSERT INTO a SELECT g, repeat('y', 100) FROM generate_series(25001, 30000) g`)
	execOn(t, c, `SAVEPOINT s2`)
	execOn(t, c, `UPDATE a SET v = 'aborted' WHERE id < 0`)
	execOn(t, c, `INSERT INTO b SELECT g FROM generate_series(1, 3000) g`)
	blocks = e.waitStreamed(t, u.Slot, blocks)
	execOn(t, c, `ROLLBACK TO s1`)
	execOn(t, c, `SAVEPOINT s3`)
	execOn(t, c, `INSERT INTO a SELECT g, 'released' FROM generate_series(30001, 32000) g`)
	execOn(t, c, `RELEASE s3`)
	execOn(t, c, `SAVEPOINT s4`)
	execOn(t, c, `INSERT INTO a SELECT g, repeat('z', 100) FROM generate_series(40001, 45000) g`)
	e.waitStreamed(t, u.Slot, blocks)
	execOn(t, c, `ROLLBACK TO s4`)
	execOn(t, c, `UPDATE a SET v = 'updated' WHERE id = -101`)
	execOn(t, c, `COMMIT`)
	e.exec(t, `INSERT INTO a VALUES (-1, 'after')`)

	txs := e.waitTxs(t, 4)
	if n := len(txs); n != 4 {
		t.Fatalf("%d transactions; want 4 (initial sync, seed, savepoints, after)", n)
	}
	for _, tx := range txs[1:] {
		for _, ch := range tx.changes {
			if ch.table == "b" || string(ch.New["v"]) == `"aborted"` {
				t.Fatalf("transaction %s holds a rolled-back change: %s %s %v", tx.wm, ch.table, ch.Op, ch.New)
			}
		}
	}
	sp := txs[2:3]
	want := append(idRange(20001, 25000), idRange(30001, 32000)...)
	if got := inserted(sp, "a"); !slices.Equal(got, want) {
		t.Errorf("the savepoint transaction inserts %d rows; want 20001..25000 and 30001..32000", len(got))
	}
	var updates []string
	for _, ch := range sp[0].changes {
		if ch.Op == streams.OpUpdate {
			updates = append(updates, string(ch.New["id"])+"="+string(ch.New["v"]))
		}
	}
	if !slices.Equal(updates, []string{`-101="updated"`}) {
		t.Errorf("updates %v; want only -101's", updates)
	}
	if got := inserted(txs[3:], "a"); !slices.Equal(got, []int{-1}) {
		t.Errorf("last transaction inserts %v; want [-1]", got)
	}
	if n, _ := e.streamedTxns(t, u.Slot); n < 1 {
		t.Errorf("Postgres streamed %d transactions; want both streamed", n)
	}
}

// TestSource_StreamedInterleaved: two transactions streamed at once, whose
// blocks Postgres interleaves, each come out whole and in commit order.
func TestSource_StreamedInterleaved(t *testing.T) {
	e := newStreamingEnv(t, streamedSchema)
	e.run(t)
	u := e.waitSynced(t, "")
	_, blocks := e.streamedTxns(t, u.Slot)

	c1, c2 := connect(t, e.url), connect(t, e.url)
	execOn(t, c1, `BEGIN`)
	execOn(t, c2, `BEGIN`)
	const chunk, rounds = 2000, 4
	for r := range rounds {
		execOn(t, c1, `INSERT INTO a SELECT g, repeat('1', 100) FROM generate_series($1::int, $2::int) g`, r*chunk+1, (r+1)*chunk)
		blocks = e.waitStreamed(t, u.Slot, blocks)
		execOn(t, c2, `INSERT INTO a SELECT g, repeat('2', 100) FROM generate_series($1::int, $2::int) g`, 100000+r*chunk+1, 100000+(r+1)*chunk)
		blocks = e.waitStreamed(t, u.Slot, blocks)
		e.exec(t, `INSERT INTO b VALUES ($1)`, r)
	}
	// The second to start commits first.
	execOn(t, c2, `COMMIT`)
	e.exec(t, `INSERT INTO b VALUES (100)`)
	execOn(t, c1, `COMMIT`)

	txs := e.waitTxs(t, 1+rounds+3)
	var order []string
	for _, tx := range txs[1:] {
		ids := inserted([]txn{tx}, "a")
		switch {
		case len(ids) == 0:
			order = append(order, fmt.Sprint(inserted([]txn{tx}, "b")))
		case slices.Equal(ids, idRange(1, rounds*chunk)):
			order = append(order, "c1")
		case slices.Equal(ids, idRange(100001, 100000+rounds*chunk)):
			order = append(order, "c2")
		default:
			t.Fatalf("transaction %s inserts %d rows into a, from %d: not one whole streamed transaction", tx.wm, len(ids), ids[0])
		}
	}
	want := []string{"[0]", "[1]", "[2]", "[3]", "c2", "[100]", "c1"}
	if !slices.Equal(order, want) {
		t.Errorf("transactions in the stream: %v; want %v", order, want)
	}
	if n, _ := e.streamedTxns(t, u.Slot); n < 2 {
		t.Errorf("Postgres streamed %d transactions; want both", n)
	}
}
