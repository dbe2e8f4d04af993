package cvr

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/jetsync/jetsync/streams"
)

func prepare(t testing.TB, db *sql.DB) *Stmts {
	t.Helper()
	s, err := Prepare(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// applyWith applies m at seq with s's statements in its own transaction.
func applyWith(t testing.TB, db *sql.DB, s *Stmts, seq uint64, m *streams.CVRMessage) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, tx, seq, m); err != nil {
		tx.Rollback()
		t.Fatalf("Apply(seq %d) = %v", seq, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// advance is what a replica advance publishes for a group: its instance
// record and one changed row.
func advance(group string, seq uint64) *streams.CVRMessage {
	v := fmt.Sprintf("%04d", seq)
	return &streams.CVRMessage{Group: group, Version: v, Prev: seq - 1, Last: true, Events: []streams.CVREvent{
		{Op: streams.CVROpInstance, Instance: &streams.CVRInstance{Version: v, ReplicaVersion: "r1", LastActiveMs: int64(seq)}},
		{Op: streams.CVROpGot, Got: &streams.CVRGot{Hash: "q", Got: true, PatchVersion: v}},
		{Op: streams.CVROpPutRows, Rows: &streams.CVRRows{Table: "issue", PatchVersion: v, Refs: map[string]int{"q": 1},
			Keys: []json.RawMessage{json.RawMessage(fmt.Sprintf(`{"id":"i%d"}`, seq%3))}, RowVersions: []string{v}}},
		{Op: streams.CVROpPutRow, Row: &streams.CVRRow{Table: "comment", Key: json.RawMessage(`{"id":"c1"}`), RowVersion: v, PatchVersion: v}},
	}}
}

func TestStmts(t *testing.T) {
	t.Run("SameStateAsApply", func(t *testing.T) {
		plain, prepared := openDB(t), openDB(t)
		s := prepare(t, prepared)
		for seq := uint64(1); seq <= 5; seq++ {
			for _, g := range []string{"a", "b"} {
				mustApply(t, plain, seq, advance(g, seq))
				applyWith(t, prepared, s, seq, advance(g, seq))
			}
		}
		for _, g := range []string{"a", "b"} {
			if d := cmp.Diff(load(t, plain, g), load(t, prepared, g)); d != "" {
				t.Errorf("group %s with prepared statements (-unprepared +prepared):\n%s", g, d)
			}
		}
		// An advance's statements are all prepared once: none is parsed
		// again per message.
		if n := s.misses.Load(); n != 0 {
			t.Errorf("%d statements prepared in transactions; want none", n)
		}
	})

	t.Run("TablesRecreated", func(t *testing.T) {
		// SQLite prepares a statement again once the schema it was
		// prepared against changed.
		db := openDB(t)
		s := prepare(t, db)
		applyWith(t, db, s, 1, advance("g", 1))
		for _, tbl := range []string{"instances", "clients", "queries", "desires", "rows"} {
			if _, err := db.Exec("DROP TABLE " + tbl); err != nil {
				t.Fatal(err)
			}
		}
		if err := Init(context.Background(), db); err != nil {
			t.Fatal(err)
		}
		applyWith(t, db, s, 1, advance("g", 1))
		applyWith(t, db, s, 2, advance("g", 2))
		if st := load(t, db, "g"); st.Progress.Seq != 2 || st.Instance.Version != "0002" || len(st.Rows) != 3 {
			t.Errorf("after the tables were recreated: seq %d, version %q, %d rows; want 2, 0002, 3", st.Progress.Seq, st.Instance.Version, len(st.Rows))
		}
	})

	t.Run("ConnectionReplaced", func(t *testing.T) {
		// No idle connection is kept: each transaction has a new one, on
		// which the statements are prepared again.
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "cvr.db")+"?_pragma=journal_mode(WAL)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(0)
		if err := Init(context.Background(), db); err != nil {
			t.Fatal(err)
		}
		s := prepare(t, db)
		for seq := uint64(1); seq <= 3; seq++ {
			applyWith(t, db, s, seq, advance("g", seq))
		}
		if st := load(t, db, "g"); st.Progress.Seq != 3 {
			t.Errorf("group at seq %d; want 3", st.Progress.Seq)
		}
	})

	t.Run("Closed", func(t *testing.T) {
		db := openDB(t)
		s := prepare(t, db)
		applyWith(t, db, s, 1, advance("g", 1))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		applyWith(t, db, s, 2, advance("g", 2))
		if st := load(t, db, "g"); st.Progress.Seq != 2 {
			t.Errorf("group at seq %d; want 2", st.Progress.Seq)
		}
	})
}
