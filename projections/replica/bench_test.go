package replica_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// sync is an initial sync's parts, with each part's table.
type sync struct {
	schema, table []string
	parts         []streams.Part
}

func (s *sync) add(schema, table string, p streams.Part) {
	s.schema = append(s.schema, schema)
	s.table = append(s.table, table)
	s.parts = append(s.parts, p)
}

var itemSpec = streams.TableSpec{
	Schema: "public", Name: "item", PrimaryKey: []string{"id"},
	Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "text", Kind: streams.KindString, NotNull: true},
		{Name: "title", Pos: 2, DataType: "text", Kind: streams.KindString},
		{Name: "n", Pos: 3, DataType: "int8", Kind: streams.KindNumber},
		{Name: "open", Pos: 4, DataType: "bool", Kind: streams.KindBoolean},
		{Name: "score", Pos: 5, DataType: "float8", Kind: streams.KindNumber},
		{Name: "created", Pos: 6, DataType: "timestamptz", Kind: streams.KindNumber},
	},
}

func raw(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func itemRow(i int) []json.RawMessage {
	return []json.RawMessage{
		raw(fmt.Sprintf("i%07d", i)), raw("title of item " + strconv.Itoa(i)), raw(i), raw(i%2 == 0),
		raw(float64(i) / 7), raw(1764504000123.5 + float64(i)),
	}
}

// initialSync builds the parts of an initial sync of n items, 2000 rows per
// backfill part as a producer would chunk them.
func initialSync(version string, n int) *sync {
	s := &sync{}
	s.add("", "", streams.Part{Watermark: version, Num: 0, Changes: []streams.Change{{
		Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: version, Publications: []string{"p"}, SystemID: "1", Slot: "s"},
	}}})
	spec := itemSpec
	s.add("public", "item", streams.Part{Watermark: version, Num: 1, Changes: []streams.Change{{Op: streams.OpCreateTable, Spec: &spec}}})
	cols := []string{"id", "title", "n", "open", "score", "created"}
	for lo := 0; lo < n; lo += 2000 {
		var rows [][]json.RawMessage
		for i := lo; i < min(n, lo+2000); i++ {
			rows = append(rows, itemRow(i))
		}
		s.add("public", "item", streams.Part{Watermark: version, Num: len(s.parts), Changes: []streams.Change{{Op: streams.OpBackfill, Columns: cols, Rows: rows}}})
	}
	s.add("public", "item", streams.Part{Watermark: version, Num: len(s.parts), Changes: []streams.Change{
		{Op: streams.OpCreateIndex, Index: &streams.IndexSpec{Schema: "public", TableName: "item", Name: "item_pkey", Unique: true, Columns: []string{"id"}}},
		{Op: streams.OpCreateIndex, Index: &streams.IndexSpec{Schema: "public", TableName: "item", Name: "item_title", Columns: []string{"title"}}},
	}})
	s.add("", "", streams.Part{Watermark: version, Num: len(s.parts), Last: true, Changes: []streams.Change{}})
	return s
}

func BenchmarkApplyBackfill(b *testing.B) {
	const rows = 20000
	ctx := context.Background()
	db := openDB(b)
	s := initialSync("0a", rows)
	a := replica.NewApplier(db)
	b.ReportAllocs()
	for b.Loop() {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := range s.parts {
			if err := a.Apply(ctx, tx, s.schema[i], s.table[i], &s.parts[i]); err != nil {
				b.Fatal(err)
			}
		}
		if err := a.Flush(ctx, tx); err != nil {
			b.Fatal(err)
		}
		if err := a.Commit(tx); err != nil {
			b.Fatal(err)
		}
		a.KeepStatements(ctx)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*rows), "ns/row")
}

// BenchmarkApplyBatch applies batches of updates, deletes and inserts. In
// the full cases each update and delete carries the whole old row, as a
// table with REPLICA IDENTITY FULL publishes them.
func BenchmarkApplyBatch(b *testing.B) {
	for _, bc := range []struct{ collect, full bool }{{false, false}, {true, false}, {true, true}} {
		collect := bc.collect
		name := "size=256"
		if collect {
			name += "/collect"
		}
		if bc.full {
			name += "/full"
		}
		b.Run(name, func(b *testing.B) {
			const size = 256
			ctx := context.Background()
			db := openDB(b)
			a := replica.NewApplier(db)
			s := initialSync("0a", 10000)
			tx, _ := db.BeginTx(ctx, nil)
			for i := range s.parts {
				if err := a.Apply(ctx, tx, s.schema[i], s.table[i], &s.parts[i]); err != nil {
					b.Fatal(err)
				}
			}
			if err := a.Commit(tx); err != nil {
				b.Fatal(err)
			}
			a.KeepStatements(ctx)
			if collect {
				a.Collector = discard{}
			}
			lsn := uint64(1000)
			b.ReportAllocs()
			for b.Loop() {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				for j := range size {
					lsn++
					id := raw(fmt.Sprintf("i%07d", int(lsn)%10000))
					var old streams.Row
					if bc.full {
						old = streams.Row{"id": id, "title": raw("x"), "n": raw(j), "open": raw(false), "score": raw(2.5), "created": raw(2.0)}
					}
					var c streams.Change
					switch j % 4 {
					case 0, 1:
						c = streams.Change{Op: streams.OpUpdate, New: streams.Row{"id": id, "title": raw("t" + strconv.Itoa(j)), "n": raw(j), "open": raw(true), "score": raw(1.5), "created": raw(1.0)}, Old: old}
					case 2:
						if old == nil {
							old = streams.Row{"id": id}
						}
						c = streams.Change{Op: streams.OpDelete, Old: old}
					case 3:
						c = streams.Change{Op: streams.OpInsert, New: streams.Row{"id": id, "title": raw("x"), "n": raw(j), "open": raw(false), "score": raw(2.5), "created": raw(2.0)}}
					}
					p := streams.Part{Watermark: streams.Lexi(lsn), Num: 0, Last: true, Changes: []streams.Change{c}}
					if err := a.Apply(ctx, tx, "public", "item", &p); err != nil {
						b.Fatal(err)
					}
				}
				if err := replica.SaveProgress(ctx, tx, replica.State{Watermark: streams.Lexi(lsn), StreamSeq: lsn}); err != nil {
					b.Fatal(err)
				}
				if err := a.Commit(tx); err != nil {
					b.Fatal(err)
				}
				a.KeepStatements(ctx)
			}
		})
	}
}

type discard struct{}

func (discard) RowChanged(replica.RowChange) {}
func (discard) TableChanged(string)          {}

// BenchmarkApplyOps applies, collecting, batches of 256 changes of one kind
// to distinct rows that exist (updates, deletes) or not (inserts), with old
// rows as a table of the given replica identity sends them.
func BenchmarkApplyOps(b *testing.B) {
	const size, rows = 256, 10000
	cols := []string{"id", "title", "n", "open", "score", "created"}
	rowOf := func(vals []json.RawMessage) streams.Row {
		r := streams.Row{}
		for i, c := range cols {
			r[c] = vals[i]
		}
		return r
	}
	for _, bc := range []struct{ op, identity string }{
		{"update", "default"}, {"update", "full"}, {"delete", "default"}, {"delete", "full"}, {"insert", "default"},
	} {
		b.Run("op="+bc.op+"/identity="+bc.identity, func(b *testing.B) {
			ctx := context.Background()
			db := openDB(b)
			a := replica.NewApplier(db)
			s := initialSync("0a", rows)
			tx, _ := db.BeginTx(ctx, nil)
			for i := range s.parts {
				if err := a.Apply(ctx, tx, s.schema[i], s.table[i], &s.parts[i]); err != nil {
					b.Fatal(err)
				}
			}
			if err := a.Commit(tx); err != nil {
				b.Fatal(err)
			}
			a.KeepStatements(ctx)
			lsn := uint64(1000)
			// apply applies changes in one transaction, one part each.
			apply := func(changes []streams.Change, collect bool) {
				a.Collector = nil
				if collect {
					a.Collector = discard{}
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				for i := range changes {
					lsn++
					p := streams.Part{Watermark: streams.Lexi(lsn), Num: 0, Last: true, Changes: changes[i : i+1]}
					if err := a.Apply(ctx, tx, "public", "item", &p); err != nil {
						b.Fatal(err)
					}
				}
				if err := a.Commit(tx); err != nil {
					b.Fatal(err)
				}
				a.KeepStatements(ctx)
			}
			changes := make([]streams.Change, size)
			undo := make([]streams.Change, size)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				base := i * size % (rows - size)
				for j := range size {
					row := itemRow(base + j)
					full := rowOf(row)
					key := streams.Row{"id": row[0]}
					switch bc.op {
					case "update":
						nv := slices.Clone(row)
						nv[2] = raw(i)
						changes[j] = streams.Change{Op: streams.OpUpdate, New: rowOf(nv)}
						undo[j] = streams.Change{Op: streams.OpUpdate, New: full}
						if bc.identity == "full" {
							changes[j].Old = full
						}
					case "delete":
						changes[j] = streams.Change{Op: streams.OpDelete, Old: key}
						if bc.identity == "full" {
							changes[j].Old = full
						}
						undo[j] = streams.Change{Op: streams.OpInsert, New: full}
					case "insert":
						changes[j] = streams.Change{Op: streams.OpInsert, New: full}
						undo[j] = streams.Change{Op: streams.OpDelete, Old: key}
					}
				}
				if bc.op == "insert" {
					b.StopTimer()
					apply(undo, false)
					b.StartTimer()
				}
				apply(changes, true)
				if bc.op != "insert" {
					b.StopTimer()
					apply(undo, false)
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/change")
		})
	}
}

// BenchmarkApplyTx applies transactions of 1,000 inserted rows, each in one
// part as the producer packs a transaction on one table, with and without
// a collector: the replica's share of aim 4's rows per second.
func BenchmarkApplyTx(b *testing.B) {
	const txRows = 1000
	cols := []string{"id", "title", "n", "open", "score", "created"}
	for _, collect := range []bool{false, true} {
		b.Run(fmt.Sprintf("rows=%d/collect=%v", txRows, collect), func(b *testing.B) {
			ctx := context.Background()
			db := openDB(b)
			a := replica.NewApplier(db)
			s := initialSync("0a", 0)
			tx, _ := db.BeginTx(ctx, nil)
			for i := range s.parts {
				if err := a.Apply(ctx, tx, s.schema[i], s.table[i], &s.parts[i]); err != nil {
					b.Fatal(err)
				}
			}
			if err := a.Commit(tx); err != nil {
				b.Fatal(err)
			}
			a.KeepStatements(ctx)
			if collect {
				a.Collector = discard{}
			}
			lsn, next := uint64(1000), 0
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				changes := make([]streams.Change, txRows)
				for j := range changes {
					vals := itemRow(next)
					next++
					r := make(streams.Row, len(cols))
					for k, c := range cols {
						r[c] = vals[k]
					}
					changes[j] = streams.Change{Op: streams.OpInsert, New: r}
				}
				lsn++
				p := streams.Part{Watermark: streams.Lexi(lsn), Num: 0, Last: true, Changes: changes}
				b.StartTimer()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Apply(ctx, tx, "public", "item", &p); err != nil {
					b.Fatal(err)
				}
				if err := replica.SaveProgress(ctx, tx, replica.State{Watermark: p.Watermark, StreamSeq: lsn}); err != nil {
					b.Fatal(err)
				}
				if err := a.Commit(tx); err != nil {
					b.Fatal(err)
				}
				a.KeepStatements(ctx)
			}
			b.ReportMetric(float64(b.N*txRows)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
