package cvr

import (
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
