package replicator_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jetsync/jetsync/streams"
)

// BenchmarkConsumerInitialSync measures an initial sync through NATS into
// SQLite: b.N rows of six columns, in messages of 5000 rows.
func BenchmarkConsumerInitialSync(b *testing.B) {
	e := newEnv(b)
	v := e.NextWM()
	e.Version = v
	spec := streams.TableSpec{Schema: "public", Name: "item", PrimaryKey: []string{"id"}, Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "text", Kind: streams.KindString, NotNull: true},
		{Name: "title", Pos: 2, DataType: "text", Kind: streams.KindString},
		{Name: "n", Pos: 3, DataType: "int8", Kind: streams.KindNumber},
		{Name: "open", Pos: 4, DataType: "bool", Kind: streams.KindBoolean},
		{Name: "score", Pos: 5, DataType: "float8", Kind: streams.KindNumber},
		{Name: "created", Pos: 6, DataType: "timestamptz", Kind: streams.KindNumber},
	}}
	resetSeq := e.Publish(&streams.Message{Parts: []streams.Part{{Watermark: v, Num: 0, Changes: []streams.Change{{
		Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: v, Publications: []string{"p"}, SystemID: "1", Slot: "s"},
	}}}}})
	num := 1
	e.Publish(&streams.Message{Schema: "public", Table: "item", Parts: []streams.Part{{Watermark: v, Num: num, Changes: []streams.Change{{Op: streams.OpCreateTable, Spec: &spec}}}}})
	num++
	for lo := 0; lo < b.N; lo += 5000 {
		var rows [][]json.RawMessage
		for i := lo; i < min(b.N, lo+5000); i++ {
			rows = append(rows, []json.RawMessage{raw(fmt.Sprintf("i%07d", i)), raw(fmt.Sprintf("title of item %d", i)), raw(i), raw(i%2 == 0), raw(float64(i) / 7), raw(1764504000123.5 + float64(i))})
		}
		e.Publish(&streams.Message{Schema: "public", Table: "item", Parts: []streams.Part{{Watermark: v, Num: num, Changes: []streams.Change{{Op: streams.OpBackfill, Columns: []string{"id", "title", "n", "open", "score", "created"}, Rows: rows}}}}})
		num++
	}
	e.Publish(&streams.Message{Parts: []streams.Part{{Watermark: v, Num: num, Last: true, Changes: []streams.Change{}}}})
	e.PutUpstream(resetSeq)
	b.ResetTimer()
	start := time.Now()
	r := e.start(e.config(b.TempDir() + "/replica.db"))
	for r.c.State().Watermark != v {
		select {
		case <-r.done:
			b.Fatalf("Run: %v", r.stop())
		case <-time.After(5 * time.Millisecond):
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "ns/row")
}
