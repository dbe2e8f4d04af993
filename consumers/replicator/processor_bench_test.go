package replicator

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

var benchSpec = streams.TableSpec{Schema: "public", Name: "item", PrimaryKey: []string{"id"}, Columns: []streams.ColumnSpec{
	{Name: "id", Pos: 1, DataType: "text", Kind: streams.KindString, NotNull: true},
	{Name: "title", Pos: 2, DataType: "text", Kind: streams.KindString},
	{Name: "n", Pos: 3, DataType: "int8", Kind: streams.KindNumber},
	{Name: "open", Pos: 4, DataType: "bool", Kind: streams.KindBoolean},
	{Name: "score", Pos: 5, DataType: "float8", Kind: streams.KindNumber},
	{Name: "created", Pos: 6, DataType: "timestamptz", Kind: streams.KindNumber},
}}

// cpuTime is the process's CPU time so far (user and system).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchRow(i int, title string) streams.Row {
	r := func(v any) json.RawMessage {
		b, _ := json.Marshal(v)
		return b
	}
	return streams.Row{
		"id": r(fmt.Sprintf("i%07d", i)), "title": r(title), "n": r(i), "open": r(i%2 == 0),
		"score": r(float64(i) / 7), "created": r(1764504000123.5 + float64(i)),
	}
}

// BenchmarkProcessorTx applies upstream transactions one SQLite
// transaction each, as the replica consumer does when it keeps up: with
// the savepoint, the progress record and a subscriber collecting the
// changes. rows=1 is a single-row UPDATE (the loaded measure's
// transactions); rows=1000 inserts 1,000 rows in one part (bench/bigtx's
// throughput phase).
func BenchmarkProcessorTx(b *testing.B) {
	const seeded = 10000
	for _, rows := range []int{1, 1000} {
		b.Run("rows="+strconv.Itoa(rows), func(b *testing.B) {
			ctx := context.Background()
			db, err := OpenDB(filepath.Join(b.TempDir(), "replica.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			p := newProcessor(db, replica.State{})
			p.newBatch = func() *changeBatch { return &changeBatch{cap: 1 << 20} }
			seq := uint64(0)
			lsn := uint64(1)
			apply := func(m *streams.Message) {
				seq++
				if err := p.handle(ctx, seq, m); err != nil {
					b.Fatal(err)
				}
				if _, err := p.commit(ctx, time.Now()); err != nil {
					b.Fatal(err)
				}
				p.keepStatements(ctx)
			}
			v := streams.Lexi(lsn)
			spec := benchSpec
			var backfill [][]json.RawMessage
			cols := []string{"id", "title", "n", "open", "score", "created"}
			for i := range seeded {
				r := benchRow(i, "seeded")
				vals := make([]json.RawMessage, len(cols))
				for j, c := range cols {
					vals[j] = r[c]
				}
				backfill = append(backfill, vals)
			}
			for _, m := range []*streams.Message{
				{Parts: []streams.Part{{Watermark: v, Num: 0, Changes: []streams.Change{{Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: v, Publications: []string{"p"}, SystemID: "1", Slot: "s"}}}}}},
				{Schema: "public", Table: "item", Parts: []streams.Part{{Watermark: v, Num: 1, Changes: []streams.Change{
					{Op: streams.OpCreateTable, Spec: &spec},
					{Op: streams.OpBackfill, Columns: cols, Rows: backfill},
					{Op: streams.OpCreateIndex, Index: &streams.IndexSpec{Schema: "public", TableName: "item", Name: "item_pkey", Unique: true, Columns: []string{"id"}}},
				}}}},
				{Parts: []streams.Part{{Watermark: v, Num: 2, Last: true, Changes: []streams.Change{}}}},
			} {
				seq++
				if err := p.handle(ctx, seq, m); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := p.commit(ctx, time.Now()); err != nil {
				b.Fatal(err)
			}
			next := seeded
			var cpu time.Duration
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				prev := streams.Lexi(lsn)
				lsn++
				changes := make([]streams.Change, rows)
				for j := range changes {
					if rows == 1 {
						changes[j] = streams.Change{Op: streams.OpUpdate, New: benchRow(int(lsn)%seeded, "title "+strconv.Itoa(int(lsn)))}
					} else {
						changes[j] = streams.Change{Op: streams.OpInsert, New: benchRow(next, "inserted")}
						next++
					}
				}
				m := &streams.Message{Schema: "public", Table: "item", Parts: []streams.Part{{Watermark: streams.Lexi(lsn), Prev: prev, Num: 0, Last: true, Changes: changes}}}
				b.StartTimer()
				t0 := cpuTime(b)
				apply(m)
				cpu += cpuTime(b) - t0
			}
			b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "rows/s")
			// On a shared machine the wall time mostly measures the others.
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
