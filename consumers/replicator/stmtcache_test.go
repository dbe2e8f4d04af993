package replicator

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// procEnv drives a processor by hand, one message per commit.
type procEnv struct {
	t   *testing.T
	p   *processor
	seq uint64
	lsn uint64
}

func (e *procEnv) handle(m *streams.Message) {
	e.t.Helper()
	e.seq++
	if err := e.p.handle(context.Background(), e.seq, m); err != nil {
		e.t.Fatalf("handle seq %d: %v", e.seq, err)
	}
}

func (e *procEnv) commit() {
	e.t.Helper()
	if _, err := e.p.commit(context.Background(), time.Now()); err != nil {
		e.t.Fatal(err)
	}
	e.p.keepStatements(context.Background())
}

// initialSync handles, without committing, a reset and a table item whose
// columns are cols (id first, all text), with one row per id.
func (e *procEnv) initialSync(cols []string, ids ...string) {
	e.t.Helper()
	e.lsn++
	v := streams.Lexi(e.lsn)
	spec := streams.TableSpec{Schema: "public", Name: "item", PrimaryKey: []string{"id"}}
	for i, c := range cols {
		spec.Columns = append(spec.Columns, streams.ColumnSpec{Name: c, Pos: i + 1, DataType: "text", Kind: streams.KindString})
	}
	var rows [][]json.RawMessage
	for _, id := range ids {
		var r []json.RawMessage
		for _, c := range cols {
			r = append(r, json.RawMessage(`"`+c+`-`+id+`"`))
		}
		r[0] = json.RawMessage(`"` + id + `"`)
		rows = append(rows, r)
	}
	e.handle(&streams.Message{Parts: []streams.Part{{Watermark: v, Num: 0, Changes: []streams.Change{{Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: v, Publications: []string{"p"}, SystemID: "1", Slot: "s"}}}}}})
	e.handle(&streams.Message{Schema: "public", Table: "item", Parts: []streams.Part{{Watermark: v, Num: 1, Changes: []streams.Change{
		{Op: streams.OpCreateTable, Spec: &spec},
		{Op: streams.OpBackfill, Columns: cols, Rows: rows},
		{Op: streams.OpCreateIndex, Index: &streams.IndexSpec{Schema: "public", TableName: "item", Name: "item_pkey", Unique: true, Columns: []string{"id"}}},
	}}}})
	e.handle(&streams.Message{Parts: []streams.Part{{Watermark: v, Num: 2, Last: true, Changes: []streams.Change{}}}})
}

// update commits a transaction that sets column col of row id.
func (e *procEnv) update(id, col, val string) {
	e.t.Helper()
	prev := e.p.pending.Watermark
	e.lsn++
	e.handle(&streams.Message{Schema: "public", Table: "item", Parts: []streams.Part{{Watermark: streams.Lexi(e.lsn), Prev: prev, Num: 0, Last: true, Changes: []streams.Change{
		{Op: streams.OpUpdate, New: streams.Row{"id": json.RawMessage(`"` + id + `"`), col: json.RawMessage(`"` + val + `"`)}},
	}}}})
	e.commit()
}

func (e *procEnv) read(id, col string) string {
	e.t.Helper()
	var v string
	if err := e.p.db.QueryRow(`SELECT "`+col+`" FROM "item" WHERE id = ?`, id).Scan(&v); err != nil {
		e.t.Fatalf("read item %s.%s: %v", id, col, err)
	}
	return v
}

// warm commits updates until the processor keeps statements.
func (e *procEnv) warm() {
	e.t.Helper()
	e.update("a", "title", "warm")
	e.update("a", "title", "warm again")
	if e.p.applier.KeptStatements() == 0 {
		e.t.Fatal("no statement kept after committed transactions")
	}
}

// TestProcessor_StmtCache checks the processor's kept statements across
// the ways its replica's schema changes under it: a new initial sync in
// the stream (a resync), a rebuild after a gap, and a replica file
// restored in place of the one a processor used.
func TestProcessor_StmtCache(t *testing.T) {
	open := func(t *testing.T, file string) *procEnv {
		db, err := OpenDB(file)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		st, err := replica.LoadState(context.Background(), db)
		if err != nil {
			t.Fatal(err)
		}
		return &procEnv{t: t, p: newProcessor(db, st), lsn: 100}
	}
	t.Run("Resync", func(t *testing.T) {
		e := open(t, filepath.Join(t.TempDir(), "replica.db"))
		e.initialSync([]string{"id", "title"}, "a")
		e.commit()
		e.warm()
		e.initialSync([]string{"id", "body", "title"}, "a")
		if n := e.p.applier.KeptStatements(); n != 0 {
			t.Errorf("after a reset %d statements are kept; want 0", n)
		}
		e.commit()
		e.update("a", "title", "after")
		e.update("a", "body", "b2")
		if got := e.read("a", "title") + "/" + e.read("a", "body"); got != "after/b2" {
			t.Errorf("after the resync item a = %s; want after/b2", got)
		}
	})
	t.Run("Rebuild", func(t *testing.T) {
		e := open(t, filepath.Join(t.TempDir(), "replica.db"))
		e.initialSync([]string{"id", "title"}, "a")
		e.commit()
		e.warm()
		if err := e.p.wipe(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := e.p.applier.KeptStatements(); n != 0 {
			t.Errorf("after a wipe %d statements are kept; want 0", n)
		}
		e.initialSync([]string{"id", "body", "title"}, "a")
		e.commit()
		e.update("a", "title", "after")
		e.update("a", "body", "b2")
		if got := e.read("a", "title") + "/" + e.read("a", "body"); got != "after/b2" {
			t.Errorf("after the rebuild item a = %s; want after/b2", got)
		}
	})
	t.Run("Restored", func(t *testing.T) {
		// A restore downloads a snapshot before the consumer opens the
		// file: the replica's schema can be anything the processor
		// before it never saw.
		dir := t.TempDir()
		file := filepath.Join(dir, "replica.db")
		e := open(t, file)
		e.initialSync([]string{"id", "title"}, "a")
		e.commit()
		e.warm()
		snap := open(t, filepath.Join(dir, "snapshot.db"))
		snap.initialSync([]string{"id", "body", "title"}, "a")
		snap.commit()
		if err := e.p.db.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := snap.p.db.Exec(`VACUUM INTO ?`, file+".new"); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{file, file + "-wal", file + "-shm"} {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
		if err := os.Rename(file+".new", file); err != nil {
			t.Fatal(err)
		}
		r := open(t, file)
		r.lsn = snap.lsn
		r.update("a", "title", "after")
		r.update("a", "body", "b2")
		if got := r.read("a", "title") + "/" + r.read("a", "body"); got != "after/b2" {
			t.Errorf("after the restore item a = %s; want after/b2", got)
		}
		if r.p.applier.KeptStatements() == 0 {
			t.Error("no statement kept after committed transactions on the restored replica")
		}
	})
}
