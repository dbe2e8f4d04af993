package e2e

import (
	"context"
	"crypto/md5"
	"database/sql"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// The big-row test (issue 3, point 5): rows far larger than a NATS message
// travel as fragments, through the initial sync, streaming (TOASTed columns
// left unchanged by an update included) and a change-streamer SIGKILLed in
// the middle of a fragment sequence.

const bigRowSchema = `
CREATE TABLE big (id int8 PRIMARY KEY, t text, b bytea, n int4);
ALTER TABLE big REPLICA IDENTITY DEFAULT;
CREATE FUNCTION bigtext(mb int, salt text) RETURNS text LANGUAGE sql AS $$
	-- Incompressible, with quotes, backslashes and multi-byte runes to escape.
	SELECT string_agg(md5(salt || g::text) || CASE WHEN g % 100 = 0 THEN ' "é\€' ELSE '' END, '')
	FROM generate_series(1, mb * 1048576 / 32) g
$$;
`

// bigRowSeed holds the rows present at the initial sync: a 3 MB text and a
// 20 MB bytea (40 MB as Postgres's hex text).
const bigRowSeed = `
INSERT INTO big VALUES (1, bigtext(3, 'one'), NULL, 1);
INSERT INTO big VALUES (2, 'small', convert_to(bigtext(20, 'two'), 'UTF8'), 2);
INSERT INTO big VALUES (3, 'small', '\x00ff', 3);
`

// checkBigEqualsPostgres compares table big row for row, by digest.
func (s *spine) checkBigEqualsPostgres(file string) {
	t := s.t
	t.Helper()
	rows, err := s.pg.Query(context.Background(), `SELECT id, coalesce(md5(t), 'null'), coalesce(md5(encode(b, 'hex')), 'null'), n FROM big ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for rows.Next() {
		var id int64
		var tm, bm string
		var n sql.NullInt32
		if err := rows.Scan(&id, &tm, &bm, &n); err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%d|%s|%s|%v", id, tm, bm, n.Int32))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	db := openFile(t, file)
	defer db.Close()
	rrows, err := db.Query(`SELECT id, t, b, n FROM big ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rrows.Close()
	digest := func(v sql.NullString, prefix string) string {
		if !v.Valid {
			return "null"
		}
		sum := md5.Sum([]byte(strings.TrimPrefix(v.String, prefix)))
		return hex.EncodeToString(sum[:])
	}
	var got []string
	for rrows.Next() {
		var id int64
		var tv, bv sql.NullString
		var n sql.NullInt32
		if err := rrows.Scan(&id, &tv, &bv, &n); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d|%s|%s|%v", id, digest(tv, ""), digest(bv, `\x`), n.Int32))
	}
	if err := rrows.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s: big rows (id|md5 t|md5 b|n)\n%s\nPostgres:\n%s", file, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// tailFragment reports whether the stream's last message is a fragment that
// more fragments must follow.
func (c *crashRig) tailFragment() bool {
	ctx := context.Background()
	stream, err := c.js.Stream(ctx, c.shard.ChangesStream())
	if err != nil {
		return false
	}
	m, err := stream.GetLastMsgForSubject(ctx, c.shard.ChangesFilter())
	if err != nil {
		return false
	}
	dm, err := streams.Decode(m.Data)
	if err != nil {
		c.t.Fatalf("decode the stream's tail: %v", err)
	}
	last := dm.Parts[len(dm.Parts)-1]
	if len(last.Changes) == 0 {
		return false
	}
	f := last.Changes[len(last.Changes)-1]
	return f.Op == streams.OpFragment && f.FragNum < f.FragCount-1
}

// bigInserts counts, per id, the inserts into big the stream holds, with
// fragments joined, and the fragments it took.
func (s *spine) bigInserts() (map[int64]int, int) {
	t := s.t
	t.Helper()
	counts := map[int64]int{}
	frags := 0
	for _, tx := range s.streamTxs() {
		var a streams.Assembler
		for i, ch := range tx.changes {
			if ch.c.Op == streams.OpFragment {
				frags++
			}
			cs, err := a.Part("public", ch.table, &streams.Part{Watermark: tx.wm, Num: i, Last: i == len(tx.changes)-1, Changes: []streams.Change{ch.c}})
			if err != nil {
				t.Fatalf("transaction %s: %v", tx.wm, err)
			}
			for _, c := range cs {
				if ch.table != "big" {
					continue
				}
				switch c.Op {
				case streams.OpInsert:
					var id int64
					fmt.Sscan(string(c.New["id"]), &id)
					counts[id]++
				case streams.OpBackfill:
					for _, r := range c.Rows {
						var id int64
						fmt.Sscan(string(r[0]), &id)
						counts[id]++
					}
				}
			}
		}
	}
	return counts, frags
}

func TestBigRow(t *testing.T) {
	started := time.Now()
	s := newSpine(t, spineSchema+bigRowSchema+bigRowSeed)
	s.file = ""
	c := &crashRig{spine: s, root: dataRoot(t), r: rand.New(rand.NewPCG(1, 7))}
	c.file = c.streamerReplica()
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := s.pg.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	p := c.startStreamer()
	polltest.Until(t, 2*time.Minute, "the initial sync to complete", func() bool {
		u := c.upstreamRecord()
		return u != nil && u.Complete
	})
	rv := c.upstreamRecord().ReplicaVersion
	c.waitCaughtUp(2 * time.Minute)
	s.checkBigEqualsPostgres(c.file)
	t.Logf("initial sync with a 3 MB and a 20 MB row: %s", time.Since(started).Round(time.Millisecond))

	// Streaming: new big values, and updates that leave TOASTed columns
	// unchanged (pgoutput sends them as 'u', unchanged-toast markers).
	exec(`INSERT INTO big VALUES (4, bigtext(20, 'four'), NULL, 4)`)
	exec(`INSERT INTO big VALUES (5, 'x', convert_to(bigtext(3, 'five'), 'UTF8'), 5)`)
	exec(`UPDATE big SET n = 40 WHERE id = 4`)
	exec(`UPDATE big SET n = 20 WHERE id = 2`)
	exec(`UPDATE big SET t = bigtext(3, 'one again') WHERE id = 1`)
	exec(`BEGIN; UPDATE big SET b = convert_to(bigtext(3, 'three'), 'UTF8') WHERE id = 3; INSERT INTO pair VALUES ('big', 1, 'v'); COMMIT`)
	c.waitCaughtUp(2 * time.Minute)
	s.checkBigEqualsPostgres(c.file)
	c.checkReplicaEqualsPostgres()

	// SIGKILL the change-streamer while a fragment sequence is partly in
	// the stream; the restart sends the rest, once.
	hits := 0
	for i := range 5 {
		exec(`INSERT INTO big VALUES ($1, bigtext(20, $2), NULL, $3)`, 10+i, fmt.Sprint("kill", i), 10+i)
		hit := false
		deadline := time.Now().Add(30 * time.Second)
		for !hit && time.Now().Before(deadline) {
			hit = c.tailFragment()
			if !hit {
				runFor(t, p, time.Millisecond)
			}
		}
		kill(t, p)
		if hit {
			hits++
		}
		p = c.startStreamer()
		if hits >= 2 {
			break
		}
	}
	if hits == 0 {
		t.Fatal("no kill fell inside a fragment sequence")
	}
	c.waitCaughtUp(2 * time.Minute)
	s.checkBigEqualsPostgres(c.file)
	c.checkReplicaEqualsPostgres()

	// A replica built from the stream alone.
	rep := c.startReplicator()
	fresh := *c.spine
	fresh.file = c.replicatorReplica()
	fresh.waitCaughtUp(2 * time.Minute)
	fresh.checkBigEqualsPostgres(fresh.file)
	fresh.checkReplicaEqualsPostgres()
	for _, p := range []*proc{rep, p} {
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Errorf("%v exit code %d after SIGTERM; want 0", p.cmd.Args, code)
		}
	}

	if u := c.upstreamRecord(); u.ReplicaVersion != rv {
		t.Errorf("replica version %s after the kills; want %s: a restart resynced", u.ReplicaVersion, rv)
	}
	counts, frags := s.bigInserts()
	var ids []int64
	rows, err := s.pg.Query(ctx, `SELECT id FROM big ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		if counts[id] != 1 {
			t.Errorf("row %d is inserted %d times in the stream; want once", id, counts[id])
		}
	}
	if frags < 200 {
		t.Errorf("%d fragments in the stream; the big rows need more", frags)
	}
	t.Logf("%d kills inside a fragment sequence; %d fragments in the stream; took %s", hits, frags, time.Since(started).Round(time.Millisecond))
}
