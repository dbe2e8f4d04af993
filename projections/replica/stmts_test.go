package replica_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"maps"
	"slices"
	"testing"

	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// withColumn is itemSpec with column c added.
func withColumn(c streams.ColumnSpec) *streams.TableSpec {
	spec := itemSpec
	spec.Columns = append(slices.Clone(spec.Columns), c)
	return &spec
}

var extraColumn = streams.ColumnSpec{Name: "extra", Pos: 7, DataType: "int8", Kind: streams.KindNumber}

// TestApplier_StmtCache checks that statements outlive the transaction
// that prepared them, and that every way the replica's schema changes
// drops them: each case's change runs after transactions that filled the
// cache, which must be empty right after it, and the rows written after it
// must have the new shape.
func TestApplier_StmtCache(t *testing.T) {
	ctx := context.Background()
	renamed := itemSpec
	renamed.Columns = slices.Clone(itemSpec.Columns)
	renamed.Columns[1].Name = "headline"
	other := streams.TableSpec{Schema: "public", Name: "item", PrimaryKey: []string{"id"}, Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "text", Kind: streams.KindString, NotNull: true},
		{Name: "title", Pos: 2, DataType: "text", Kind: streams.KindString},
		{Name: "extra", Pos: 3, DataType: "int8", Kind: streams.KindNumber},
	}}
	pkey := &streams.IndexSpec{Schema: "public", TableName: "item", Name: "item_pkey", Unique: true, Columns: []string{"id"}}
	// after is a row written after the change, in its shape, and what
	// reading the item back gives.
	type after struct {
		row  streams.Row
		want map[string]any
	}
	withExtra := after{
		row:  streams.Row{"id": raw("i0000001"), "title": raw("new"), "n": raw(1), "open": raw(true), "score": raw(0.5), "created": raw(1.0), "extra": raw(9)},
		want: map[string]any{"title": "new", "extra": int64(9)},
	}
	plain := after{
		row:  streams.Row{"id": raw("i0000001"), "title": raw("new"), "n": raw(1), "open": raw(true), "score": raw(0.5), "created": raw(1.0)},
		want: map[string]any{"title": "new"},
	}
	for _, tc := range []struct {
		name    string
		changes []streams.Change
		after   after
	}{
		{"AddColumn", []streams.Change{{Op: streams.OpAddColumn, Spec: withColumn(extraColumn), Columns: []string{"extra"}, New: streams.Row{"extra": raw(7)}}}, withExtra},
		{"UpdateColumn", []streams.Change{{Op: streams.OpUpdateColumn, Spec: &renamed, Columns: []string{"title", "headline"}}}, after{
			row:  streams.Row{"id": raw("i0000001"), "headline": raw("new"), "n": raw(1), "open": raw(true), "score": raw(0.5), "created": raw(1.0)},
			want: map[string]any{"headline": "new"},
		}},
		{"DropColumn", []streams.Change{{Op: streams.OpDropColumn, Spec: &streams.TableSpec{Schema: "public", Name: "item", PrimaryKey: []string{"id"}, Columns: slices.Delete(slices.Clone(itemSpec.Columns), 2, 3)}, Columns: []string{"n"}}}, after{
			row:  streams.Row{"id": raw("i0000001"), "title": raw("new"), "open": raw(true), "score": raw(0.5), "created": raw(1.0)},
			want: map[string]any{"title": "new"},
		}},
		{"CreateIndex", []streams.Change{{Op: streams.OpCreateIndex, Index: &streams.IndexSpec{Schema: "public", TableName: "item", Name: "item_n", Columns: []string{"n"}}}}, plain},
		{"DropIndex", []streams.Change{{Op: streams.OpDropIndex, Index: &streams.IndexSpec{Schema: "public", TableName: "item", Name: "item_title", Columns: []string{"title"}}}}, plain},
		// Dropped and created again with other columns under the same name.
		{"RecreateTable", []streams.Change{{Op: streams.OpDropTable}, {Op: streams.OpCreateTable, Spec: &other}, {Op: streams.OpCreateIndex, Index: pkey}}, after{
			row:  streams.Row{"id": raw("i0000001"), "title": raw("new"), "extra": raw(3)},
			want: map[string]any{"title": "new", "extra": int64(3)},
		}},
		// A column with a computed default: the producer copies the
		// table's rows again in the same transaction.
		{"Recopy", []streams.Change{
			{Op: streams.OpAddColumn, Spec: withColumn(extraColumn), Columns: []string{"extra"}},
			{Op: streams.OpBackfill, Columns: []string{"id", "title", "n", "open", "score", "created", "extra"}, Rows: [][]json.RawMessage{
				append(itemRow(1), raw(5)), append(itemRow(2), raw(6)),
			}},
		}, withExtra},
		// A new initial sync (a resync), with the table in another shape.
		{"Reset", []streams.Change{
			{Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: "0b", Publications: []string{"p"}, SystemID: "1", Slot: "s"}},
			{Op: streams.OpCreateTable, Spec: &other},
			{Op: streams.OpBackfill, Columns: []string{"id", "title", "extra"}, Rows: [][]json.RawMessage{{raw("i0000001"), raw("copied"), raw(1)}}},
			{Op: streams.OpCreateIndex, Index: pkey},
		}, after{
			row:  streams.Row{"id": raw("i0000001"), "title": raw("new"), "extra": raw(3)},
			want: map[string]any{"title": "new", "extra": int64(3)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := openDB(t)
			a := replica.NewApplier(db)
			a.Collector = &recorder{}
			s := initialSync("0a", 10)
			lsn := uint64(10)
			apply := func(changes ...streams.Change) *sql.Tx {
				t.Helper()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				lsn++
				p := streams.Part{Watermark: streams.Lexi(lsn), Num: 0, Last: true, Changes: changes}
				if err := a.Apply(ctx, tx, "public", "item", &p); err != nil {
					t.Fatalf("Apply: %v", err)
				}
				return tx
			}
			commit := func(tx *sql.Tx) {
				t.Helper()
				if err := a.Flush(ctx, tx); err != nil {
					t.Fatal(err)
				}
				if err := a.Commit(tx); err != nil {
					t.Fatal(err)
				}
				a.KeepStatements(ctx)
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range s.parts {
				if err := a.Apply(ctx, tx, s.schema[i], s.table[i], &s.parts[i]); err != nil {
					t.Fatal(err)
				}
			}
			commit(tx)
			update := func(title string) streams.Change {
				r := rowOf(itemRow(1))
				r["title"] = raw(title)
				return streams.Change{Op: streams.OpUpdate, New: r}
			}
			commit(apply(update("warm")))
			if a.KeptStatements() == 0 {
				t.Fatal("no statement kept after a committed transaction")
			}
			before := replica.StmtsPrepared(a)
			commit(apply(update("again")))
			if n := replica.StmtsPrepared(a) - before; n != 0 {
				t.Errorf("the same transaction again prepared %d statements; want 0", n)
			}

			tx = apply(tc.changes...)
			if n := a.KeptStatements(); n != 0 {
				t.Errorf("after the change %d statements are kept; want 0", n)
			}
			commit(tx)
			for _, title := range []string{"first", "second"} {
				tc.after.row[keyOf(tc.after.want, "title", "headline")] = raw(title)
				commit(apply(streams.Change{Op: streams.OpUpdate, New: tc.after.row}))
				want := maps.Clone(tc.after.want)
				want[keyOf(tc.after.want, "title", "headline")] = title
				for col, v := range want {
					var got any
					if err := db.QueryRowContext(ctx, `SELECT "`+col+`" FROM "item" WHERE id = 'i0000001'`).Scan(&got); err != nil {
						t.Fatalf("read %s: %v", col, err)
					}
					if got != v {
						t.Errorf("after the change, item.%s = %v (%T); want %v", col, got, got, v)
					}
				}
			}
			if a.KeptStatements() == 0 {
				t.Error("no statement kept in the transactions after the change")
			}
		})
	}
	t.Run("Rollback", func(t *testing.T) {
		db := openDB(t)
		a := replica.NewApplier(db)
		s := initialSync("0a", 10)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range s.parts {
			if err := a.Apply(ctx, tx, s.schema[i], s.table[i], &s.parts[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Flush(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := a.Commit(tx); err != nil {
			t.Fatal(err)
		}
		a.KeepStatements(ctx)
		upd := streams.Part{Watermark: "0b", Num: 0, Last: true, Changes: []streams.Change{{Op: streams.OpUpdate, New: rowOf(itemRow(1))}}}
		tx, _ = db.BeginTx(ctx, nil)
		if err := a.Apply(ctx, tx, "public", "item", &upd); err != nil {
			t.Fatal(err)
		}
		if err := a.Commit(tx); err != nil {
			t.Fatal(err)
		}
		a.KeepStatements(ctx)
		if a.KeptStatements() == 0 {
			t.Fatal("no statement kept after a committed transaction")
		}
		tx, _ = db.BeginTx(ctx, nil)
		if err := a.Apply(ctx, tx, "public", "item", &upd); err != nil {
			t.Fatal(err)
		}
		tx.Rollback()
		a.Discard()
		if n := a.KeptStatements(); n != 0 {
			t.Errorf("after a rollback %d statements are kept; want 0", n)
		}
	})
}

func rowOf(vals []json.RawMessage) streams.Row {
	r := streams.Row{}
	for i, c := range []string{"id", "title", "n", "open", "score", "created"} {
		r[c] = vals[i]
	}
	return r
}

// keyOf returns the first of names that m has.
func keyOf(m map[string]any, names ...string) string {
	for _, n := range names {
		if _, ok := m[n]; ok {
			return n
		}
	}
	return names[0]
}
