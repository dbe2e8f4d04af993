package replica_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	a := replica.NewApplier()
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
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
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
			a := replica.NewApplier()
			s := initialSync("0a", 10000)
			tx, _ := db.BeginTx(ctx, nil)
			for i := range s.parts {
				if err := a.Apply(ctx, tx, s.schema[i], s.table[i], &s.parts[i]); err != nil {
					b.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
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
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type discard struct{}

func (discard) RowChanged(replica.RowChange) {}
func (discard) TableChanged(string)          {}
