package e2e

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// Issue 17, aim 4: Postgres streams large transactions before their commit
// (pgoutput protocol 2); the change-streamer applies them at their commit,
// exactly once, across SIGKILLs.

// streamEarly makes the spine's walsenders stream any transaction past
// 64kB of changes, the least Postgres allows.
func (s *spine) streamEarly() {
	s.t.Helper()
	ctx := context.Background()
	var db string
	if err := s.pg.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.pg.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'`, pgx.Identifier{db}.Sanitize())); err != nil {
		s.t.Fatal(err)
	}
}

// streamBlocks is how many blocks of streamed transactions Postgres has
// sent on the database's slots, and how many such transactions.
func (s *spine) streamBlocks() (blocks, txns int64) {
	s.t.Helper()
	err := s.pg.QueryRow(context.Background(), `SELECT coalesce(sum(s.stream_count), 0), coalesce(sum(s.stream_txns), 0)
		FROM pg_stat_replication_slots s JOIN pg_replication_slots r USING (slot_name) WHERE r.database = current_database()`).Scan(&blocks, &txns)
	if err != nil {
		s.t.Fatal(err)
	}
	return blocks, txns
}

// streamedKill is where a round of TestCrash_StreamedTransaction kills
// the change-streamer.
type streamedKill int

const (
	killNone       streamedKill = iota
	killMidStream               // while Postgres streams the open transaction
	killAbort                   // the same, and the transaction rolls back
	killMidPublish              // after the commit, with the transaction partly in the stream
)

func (k streamedKill) String() string {
	return [...]string{"none", "mid-stream", "mid-stream, then rollback", "mid-publish"}[k]
}

// TestCrash_StreamedTransaction runs big transactions that Postgres streams
// to the change-streamer before their commit, while a second client commits
// small ones, and SIGKILLs the change-streamer while a transaction streams
// (some of which then roll back) and while a committed one is being
// published. The stream then holds every committed transaction once, whole
// and in commit order, no row of a rolled-back one, and the replica equals
// Postgres.
func TestCrash_StreamedTransaction(t *testing.T) {
	seed := crashSeed(t)
	s := newSpine(t, bigSchema)
	s.streamEarly()
	c := &crashRig{spine: s, root: dataRoot(t), r: rand.New(rand.NewPCG(seed, 11))}
	c.file = c.streamerReplica()
	ctx := context.Background()

	p := c.startStreamer()
	polltest.Until(t, time.Minute, "the initial sync", func() bool {
		u := c.upstreamRecord()
		return u != nil && u.Complete
	})
	w := startSmallWriter(t, s.url)
	big, err := pgx.Connect(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { big.Close(context.Background()) })
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := big.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	const chunk = 20_000 // rows per statement: ~2.4 MB of changes, dozens of blocks
	rounds := []streamedKill{killMidStream, killAbort, killMidPublish, killNone, killMidStream, killMidPublish, killAbort, killMidPublish}
	committed := map[int]int{} // round -> first id
	next := 1
	kills := map[streamedKill]int{}
	for round, k := range rounds {
		blocks, _ := s.streamBlocks()
		first := next
		exec(`BEGIN`)
		exec(`INSERT INTO txlog VALUES ($1, 2, $2)`, int64(2)<<32|int64(round), round)
		exec(`INSERT INTO big SELECT g, repeat(md5(g::text), 3) FROM generate_series($1::int8, $2::int8) g`, next, next+chunk-1)
		next += chunk
		polltest.Until(t, 30*time.Second, "Postgres to stream the open transaction", func() bool {
			b, _ := s.streamBlocks()
			return b > blocks
		})
		if k == killMidStream || k == killAbort {
			runFor(t, p, c.randDuration(0, 100*time.Millisecond))
			kill(t, p)
			kills[k]++
			if k == killMidStream {
				// Back while the transaction is still open: Postgres
				// streams it again from its start.
				p = c.startStreamer()
			}
		}
		exec(`UPDATE big SET payload = 'updated' WHERE id = $1`, first)
		exec(`INSERT INTO big SELECT g, repeat(md5(g::text), 3) FROM generate_series($1::int8, $2::int8) g`, next, next+chunk-1)
		next += chunk
		if k == killAbort {
			exec(`ROLLBACK`)
		} else {
			exec(`COMMIT`)
			committed[round] = first
		}
		if k == killMidPublish {
			// As soon as the stream ends inside a transaction.
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				if _, complete, ok := c.tail(); ok && !complete {
					kills[k]++
					break
				}
				runFor(t, p, time.Millisecond)
			}
			kill(t, p)
		}
		if p.exited() {
			p = c.startStreamer()
		}
	}
	if err := w.err; err != nil {
		t.Fatalf("small writer: %v", err)
	}
	w.stop()
	c.waitCaughtUp(2 * time.Minute)
	_, txns := s.streamBlocks()
	t.Logf("kills: %v; Postgres streamed %d transactions; %d small transactions", kills, txns, w.count())
	if kills[killMidStream] == 0 || kills[killAbort] == 0 || kills[killMidPublish] == 0 {
		t.Errorf("kills %v: want each kind at least once", kills)
	}
	if txns < int64(len(rounds)) {
		t.Errorf("Postgres streamed %d transactions; want at least %d", txns, len(rounds))
	}

	t.Run("StreamExactlyOnce", func(t *testing.T) {
		bigRounds := map[int]int{} // round -> times seen
		smallSeq := 0
		for _, tx := range c.streamTxs() {
			var ids []int64
			round, client, seq := -1, 0, 0
			updated := false
			for _, ch := range tx.changes {
				switch {
				case ch.table == "big" && ch.c.Op == streams.OpInsert:
					var id int64
					json.Unmarshal(ch.c.New["id"], &id)
					ids = append(ids, id)
				case ch.table == "big" && ch.c.Op == streams.OpUpdate:
					updated = true
				case ch.table == "txlog" && ch.c.Op == streams.OpInsert:
					json.Unmarshal(ch.c.New["client"], &client)
					json.Unmarshal(ch.c.New["seq"], &seq)
					if client == 2 {
						round = seq
					}
				}
			}
			switch {
			case round >= 0:
				bigRounds[round]++
				first, ok := committed[round]
				if !ok {
					t.Errorf("round %d (rolled back) is in the stream as %s", round, tx.wm)
					continue
				}
				whole := len(ids) == 2*chunk && updated
				for i, id := range ids {
					whole = whole && id == int64(first+i)
				}
				if !whole {
					t.Errorf("round %d (%s): %d inserts, update %v; want ids %d..%d in order and the update", round, tx.wm, len(ids), updated, first, first+2*chunk-1)
				}
			case len(ids) > 0:
				t.Errorf("transaction %s inserts %d big rows without its txlog row", tx.wm, len(ids))
			case client == 1:
				if seq != smallSeq+1 {
					t.Errorf("small transaction %d follows %d in the stream", seq, smallSeq)
				}
				smallSeq = seq
			}
		}
		for round := range rounds {
			_, ok := committed[round]
			if want := map[bool]int{true: 1, false: 0}[ok]; bigRounds[round] != want {
				t.Errorf("round %d (%s) is %d times in the stream; want %d", round, rounds[round], bigRounds[round], want)
			}
		}
		if smallSeq != w.count() {
			t.Errorf("the stream holds small transactions 1..%d; %d committed", smallSeq, w.count())
		}
	})

	t.Run("ReplicaEqualsPostgres", func(t *testing.T) {
		db := s.openReplica()
		defer db.Close()
		var pgDigest string
		var pgN int
		if err := s.pg.QueryRow(ctx, `SELECT count(*), md5(coalesce(string_agg(id || ':' || payload, ',' ORDER BY id), '')) FROM big`).Scan(&pgN, &pgDigest); err != nil {
			t.Fatal(err)
		}
		rows, err := db.Query(`SELECT id, payload FROM big ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var b strings.Builder
		n := 0
		for rows.Next() {
			var id int64
			var payload string
			if err := rows.Scan(&id, &payload); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%d:%s", id, payload)
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		sum := md5.Sum([]byte(b.String()))
		if got := hex.EncodeToString(sum[:]); n != pgN || got != pgDigest {
			t.Errorf("big: the replica has %d rows (digest %s); Postgres %d (%s)", n, got, pgN, pgDigest)
		}
		if want := 2 * chunk * len(committed); pgN != want {
			t.Errorf("Postgres has %d big rows; want %d", pgN, want)
		}
		var pgLog, repLog []string
		pgRows, err := s.pg.Query(ctx, `SELECT n, client, seq FROM txlog`)
		if err != nil {
			t.Fatal(err)
		}
		for pgRows.Next() {
			var nn int64
			var client, seq int32
			if err := pgRows.Scan(&nn, &client, &seq); err != nil {
				t.Fatal(err)
			}
			pgLog = append(pgLog, fmt.Sprint(nn, client, seq))
		}
		rr, err := db.Query(`SELECT n, client, seq FROM txlog`)
		if err != nil {
			t.Fatal(err)
		}
		defer rr.Close()
		for rr.Next() {
			var nn int64
			var client, seq int32
			if err := rr.Scan(&nn, &client, &seq); err != nil {
				t.Fatal(err)
			}
			repLog = append(repLog, fmt.Sprint(nn, client, seq))
		}
		sort.Strings(pgLog)
		sort.Strings(repLog)
		if strings.Join(pgLog, "\n") != strings.Join(repLog, "\n") {
			t.Errorf("txlog: the replica has %d rows, Postgres %d, and they differ", len(repLog), len(pgLog))
		}
	})
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Errorf("change-streamer exit code %d after SIGTERM; want 0", code)
	}
	// The transactions' files were unlinked as they were made: SIGKILLs
	// leave none behind.
	left, err := filepath.Glob(filepath.Join(c.root, "cs", "jetsync-streamed-*"))
	if err != nil || len(left) > 0 {
		t.Errorf("spill files left in the data directory: %v %v", left, err)
	}
}
