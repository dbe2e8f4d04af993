package cvr

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jetsync/jetsync/streams"
)

// BenchmarkApply_Hydration applies what a whole-table hydration and its
// query's removal publish: 100,000 rows put in one put-rows event, then
// the same rows as tombstones. Each op is one such pair.
func BenchmarkApply_Hydration(b *testing.B) {
	const rows = 100000
	keys := make([]json.RawMessage, rows)
	versions := make([]string, rows)
	for i := range keys {
		keys[i] = json.RawMessage(fmt.Sprintf(`{"id":"i%07d"}`, i))
		versions[i] = "1a2b3c"
	}
	db := openDB(b)
	seq := uint64(0)
	for b.Loop() {
		for _, refs := range []map[string]int{{"q": 1}, nil} {
			seq++
			pv := fmt.Sprintf("%08x", seq)
			m := &streams.CVRMessage{Group: "g", Version: pv, Prev: seq - 1, Last: true, Events: []streams.CVREvent{{
				Op: streams.CVROpPutRows, Rows: &streams.CVRRows{Table: "issue", Keys: keys, RowVersions: versions, PatchVersion: pv, Refs: refs},
			}}}
			mustApply(b, db, seq, m)
		}
	}
}

// BenchmarkApply_Advance applies what one replica advance publishes for
// each of 200 groups (advance: the instance record, a got and two rows):
// each group's message in a transaction of its own (tx=group) or all in
// one (tx=all), its statements prepared per message (stmts=none) or once
// (stmts=prepared).
func BenchmarkApply_Advance(b *testing.B) {
	const groups = 200
	for _, prepared := range []bool{false, true} {
		for _, oneTx := range []bool{false, true} {
			name := fmt.Sprintf("stmts=%s/tx=%s", map[bool]string{false: "none", true: "prepared"}[prepared], map[bool]string{false: "group", true: "all"}[oneTx])
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				db := openDB(b)
				var s *Stmts
				if prepared {
					s = prepare(b, db)
				}
				seq := uint64(0)
				for b.Loop() {
					seq++
					var tx *sql.Tx
					for g := range groups {
						if tx == nil {
							var err error
							if tx, err = db.BeginTx(ctx, nil); err != nil {
								b.Fatal(err)
							}
						}
						if _, err := s.Apply(ctx, tx, seq, advance(fmt.Sprint("g", g), seq)); err != nil {
							b.Fatal(err)
						}
						if !oneTx || g == groups-1 {
							if err := tx.Commit(); err != nil {
								b.Fatal(err)
							}
							tx = nil
						}
					}
				}
			})
		}
	}
}
