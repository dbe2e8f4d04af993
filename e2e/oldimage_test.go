package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/jetsync/jetsync/projections/replica"
)

// TestSpine_OldImagesFull runs the random workload against tables whose
// replica identity goes from FULL to DEFAULT and back, and checks the
// changed-rows subscription against a model it alone feeds: every reported
// old row is what the model held. Under FULL, updates and deletes report
// the whole old row that pgoutput sent (TOASTed values included), without the replica's
// _0_version, which only a read yields; the test requires such images, so
// it fails if the replica went back to reading every old row.
func TestSpine_OldImagesFull(t *testing.T) {
	s := startSpine(t, spineSchema+`
		ALTER TABLE every REPLICA IDENTITY FULL;
		ALTER TABLE pair REPLICA IDENTITY FULL;
		INSERT INTO every (id, t, j, ai) SELECT g, 'seed ' || g, '{"seed": true}', '{1,2}' FROM generate_series(1, 100) g;`)
	ctx := context.Background()
	s.waitCaughtUp(time.Minute)
	w := newWorkload(0, 1000)
	for id := int64(1); id <= 100; id++ {
		w.ids = append(w.ids, id)
	}
	for _, phase := range []struct {
		identity string
		images   bool // updates report old rows from the change's image
	}{{"FULL", true}, {"DEFAULT", false}, {"FULL", true}} {
		if _, err := s.pg.Exec(ctx, `ALTER TABLE every REPLICA IDENTITY `+phase.identity+`; ALTER TABLE pair REPLICA IDENTITY `+phase.identity); err != nil {
			t.Fatal(err)
		}
		s.waitCaughtUp(time.Minute)
		images, versioned := s.checkOldRows(w, 300)
		t.Logf("REPLICA IDENTITY %s: %d old rows from images, %d read", phase.identity, images, versioned)
		if phase.images && images == 0 {
			t.Errorf("REPLICA IDENTITY %s: no update reported its old row from the change", phase.identity)
		}
		if !phase.images && images > 0 {
			t.Errorf("REPLICA IDENTITY %s: %d old rows without a version; DEFAULT carries no whole old row", phase.identity, images)
		}
	}
	s.checkReplicaEqualsPostgres()
}

// checkOldRows runs n workload transactions and checks what the
// subscription reports against a model of the replica taken before. It
// returns how many reported old rows came from a change's image (no
// version) and how many from a read of the replica.
func (s *spine) checkOldRows(w *workload, n int) (images, versioned int) {
	t := s.t
	t.Helper()
	ctx := context.Background()
	sub := s.rep.Subscribe()
	defer sub.Close()
	db := s.openReplica()
	m := model{}
	for table, pk := range spinePKs {
		m[table] = replicaRows(t, db, table, pk)
	}
	db.Close()
	start := s.rep.State().Watermark
	for range n {
		if err := w.tx(ctx, s.pg, false); err != nil {
			t.Fatalf("workload: %v", err)
		}
	}
	s.waitCaughtUp(2 * time.Minute)
	for to := start; to < s.rep.State().Watermark; {
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		u, err := sub.Next(uctx)
		cancel()
		if err != nil {
			t.Fatalf("subscription: %v", err)
		}
		if u.Reset {
			t.Fatalf("subscription reset between %s and %s; the workload made no table-wide change", u.From, u.To)
		}
		to = u.To
		for _, rc := range u.Changes {
			tbl := m[rc.Table]
			k := rowKey(rc.Key)
			if rc.Old != nil {
				want := tbl[k]
				if _, ok := rc.Old[replica.VersionColumn]; !ok {
					images++
					want = withoutVersion(want)
				} else {
					versioned++
				}
				if !sameRow(want, rc.Old) {
					t.Fatalf("%s %s: reported old row %v; the model holds %v", rc.Table, k, rc.Old, tbl[k])
				}
			} else if tbl[k] != nil {
				t.Fatalf("%s %s: reported as new, but the model holds %v", rc.Table, k, tbl[k])
			}
			if rc.New == nil {
				delete(tbl, k)
			} else {
				tbl[k] = normRow(rc.New)
			}
		}
	}
	db = s.openReplica()
	defer db.Close()
	for table, pk := range spinePKs {
		got := replicaRows(t, db, table, pk)
		if len(got) != len(m[table]) {
			t.Errorf("%s: the subscription's model has %d rows; the replica %d", table, len(m[table]), len(got))
		}
		for k, row := range got {
			if !sameRow(row, m[table][k]) {
				t.Errorf("%s %s: replica %v; subscription model %v", table, k, row, m[table][k])
				break
			}
		}
	}
	return images, versioned
}

func withoutVersion(row map[string]any) map[string]any {
	if row == nil {
		return nil
	}
	out := make(map[string]any, len(row))
	for k, v := range row {
		if k != replica.VersionColumn {
			out[k] = v
		}
	}
	return out
}
