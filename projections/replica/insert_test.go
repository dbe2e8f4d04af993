package replica_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// readThing reads row id of thing as the replica holds it, or nil.
func readThing(t *testing.T, db *sql.DB, id string) map[string]any {
	t.Helper()
	names := []string{}
	for _, c := range imageSpec.Columns {
		names = append(names, `"`+c.Name+`"`)
	}
	names = append(names, `"`+replica.VersionColumn+`"`)
	vals := make([]any, len(names))
	ptrs := make([]any, len(names))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	err := db.QueryRow(`SELECT `+strings.Join(names, ", ")+` FROM "thing" WHERE id = ?`, id).Scan(ptrs...)
	if err == sql.ErrNoRows {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	for i, c := range imageSpec.Columns {
		m[c.Name] = vals[i]
	}
	m[replica.VersionColumn] = vals[len(vals)-1]
	return m
}

func newThingReplica(t *testing.T) (*sql.DB, *replica.Applier) {
	t.Helper()
	ctx := context.Background()
	db := openDB(t)
	a := replica.NewApplier(db)
	spec := imageSpec
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []streams.Part{
		{Watermark: "0a", Num: 0, Changes: []streams.Change{{Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: "0a", Publications: []string{"p"}, SystemID: "1", Slot: "s"}}}},
		{Watermark: "0a", Num: 1, Last: true, Changes: []streams.Change{{Op: streams.OpCreateTable, Spec: &spec}}},
	} {
		if err := a.Apply(ctx, tx, "public", "thing", &p); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Commit(tx); err != nil {
		t.Fatal(err)
	}
	return db, a
}

func applyPart(t *testing.T, db *sql.DB, a *replica.Applier, p *streams.Part) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Apply(ctx, tx, "public", "thing", p); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(tx); err != nil {
		t.Fatal(err)
	}
}

// TestApplier_InsertRuns applies parts of many inserts, which the applier
// writes many rows per statement, and checks what a collector is told
// against reads of the replica: each key's first old row is the row before
// the part, each later one the new row reported before it, and the last
// new row the row after; a row is read only where its key was taken. Keys
// are new, taken before the part, or taken earlier in the same part;
// values include those whose stored form is uncertain. A replica applying
// the same parts without a collector ends the same.
func TestApplier_InsertRuns(t *testing.T) {
	for _, vs := range []struct {
		name   string
		values map[string][]string
	}{{"plain", plainValues}, {"tricky", imageValues}} {
		t.Run(vs.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(len(vs.name))))
			db, a := newThingReplica(t)
			plainDB, plain := newThingReplica(t)
			log := &changeLog{}
			a.Collector = log
			var keys []string
			next, taken, batched := 0, 0, 0
			for part := range 30 {
				size := 1 + r.IntN(600)
				if part%5 == 0 {
					size = 1 + r.IntN(4)
				}
				var changes []streams.Change
				inPart := map[string]bool{}
				var order []string
				for range size {
					var k string
					switch x := r.IntN(10); {
					case x < 7 || len(keys) == 0:
						k = "k" + strconv.Itoa(next)
						next++
						keys = append(keys, k)
					default:
						k = keys[r.IntN(len(keys))]
					}
					if !inPart[k] {
						order = append(order, k)
					}
					inPart[k] = true
					row := streams.Row{"id": raw(k)}
					for _, c := range imageSpec.Columns[1:] {
						vv := vs.values[c.Name]
						row[c.Name] = json.RawMessage(vv[r.IntN(len(vv))])
					}
					changes = append(changes, streams.Change{Op: streams.OpInsert, New: row})
				}
				before := map[string]map[string]any{}
				for _, k := range order {
					before[k] = readThing(t, db, k)
				}
				seen := map[string]bool{}
				for _, c := range changes {
					k := jsonString(string(c.New["id"]))
					if before[k] != nil || seen[k] {
						taken++
					}
					seen[k] = true
				}
				p := streams.Part{Watermark: streams.Lexi(uint64(100 + part)), Num: 0, Last: true, Changes: changes}
				reads := a.OldRowReads
				log.rows = nil
				applyPart(t, db, a, &p)
				applyPart(t, plainDB, plain, &p)
				if len(log.rows) != len(changes) {
					t.Fatalf("part %d: %d changes reported for %d inserts", part, len(log.rows), len(changes))
				}
				last := map[string]map[string]any{}
				for i, rc := range log.rows {
					k := jsonString(string(changes[i].New["id"]))
					if diff := cmp.Diff(map[string]any{"id": k}, rc.Key); diff != "" {
						t.Fatalf("part %d insert %d: key (-want +got):\n%s", part, i, diff)
					}
					want, ok := last[k]
					if !ok {
						want = before[k]
					}
					if diff := cmp.Diff(want, rc.Old); diff != "" {
						t.Fatalf("part %d insert %d: old row (-want +got):\n%s", part, i, diff)
					}
					last[k] = rc.New
				}
				for _, k := range order {
					if diff := cmp.Diff(readThing(t, db, k), last[k]); diff != "" {
						t.Fatalf("part %d key %s: last new row reported differs from the replica's (-read +reported):\n%s", part, k, diff)
					}
				}
				if size > 16 {
					batched++
				}
				if got := a.OldRowReads - reads; vs.name == "plain" && got != taken {
					t.Errorf("part %d: %d rows read; want one per insert on a taken key, %d", part, got, taken)
				}
				taken = 0
			}
			if batched == 0 {
				t.Fatal("no part was big enough to batch")
			}
			for _, k := range keys {
				if diff := cmp.Diff(readThing(t, db, k), readThing(t, plainDB, k)); diff != "" {
					t.Fatalf("key %s: collecting and plain replicas differ (-collecting +plain):\n%s", k, diff)
				}
			}
			t.Logf("%d keys", len(keys))
		})
	}
}
