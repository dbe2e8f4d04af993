package restore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jetsync/jetsync/internal/polltest"
)

// TestRestore_R14_NATSRestarts restarts the NATS server while a restore
// waits for its first snapshot, during its download and during its
// catch-up: the restore rides each one out, its reservation survives, and
// the replica ends equal to the backup replica.
func TestRestore_R14_NATSRestarts(t *testing.T) {
	f := newFixture(t, 200000) // a snapshot of some MB, so that a restart can land in its download
	ctx := context.Background()
	f.sync(t)
	for _, phase := range []string{"waiting", "download"} {
		t.Run(phase, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "vs.db")
			if phase == "waiting" {
				// No verified snapshot yet: the restore holds its
				// reservation open through the restart.
				if err := f.e.Backup.State.Delete(ctx, "verified"); err != nil {
					t.Fatal(err)
				}
			} else {
				f.snapshot(t)
			}
			hc, errc := restoreAsync(t, f.restorer(t, file, nil))
			midDownload := false
			if phase == "waiting" {
				polltest.Until(t, 10*time.Second, "the reservation", func() bool { _, ok := reservation(t, f); return ok })
				f.e.Restart()
				notYet(t, hc, errc)
				r0, _ := reservation(t, f)
				polltest.Until(t, 10*time.Second, "a heartbeat after the restart", func() bool { r, ok := reservation(t, f); return ok && r.Beat > r0.Beat })
				f.snapshot(t)
			} else {
				polltest.Until(t, 20*time.Second, "the download", func() bool {
					fi, err := os.Stat(file + ".restore")
					return err == nil && fi.Size() > 0
				})
				_, err := os.Stat(file)
				midDownload = os.IsNotExist(err)
				f.e.Restart()
			}
			h := wait(t, hc, errc)
			if !h.Result().Restored {
				t.Fatalf("Result = %+v; want restored", h.Result())
			}
			vs := f.e.StartReplica(file, "vs")
			seq := f.e.Tx(7)
			// Once the consumer follows the stream, not in its first
			// milliseconds: a replica consumer restarted with NATS right
			// after it created its durable consumer can stall (reported).
			vs.WaitSeq(t, seq)
			f.e.Tx(8)
			f.e.Restart() // during the catch-up
			f.e.Tx(9)
			if err := h.EndWhenCaughtUp(ctx, vs.C); err != nil {
				t.Fatal(err)
			}
			if r, ok := reservation(t, f); !ok || !r.Ended {
				t.Fatalf("reservation = %+v, %v; want ended", r, ok)
			}
			_, last := f.e.StreamState()
			t0 := time.Now()
			polltest.Until(t, 60*time.Second, "the backup replica to catch up", func() bool { return f.cs.C.State().StreamSeq >= last })
			polltest.Until(t, 60*time.Second, "the restored replica to catch up", func() bool { return vs.C.State().StreamSeq >= last })
			t.Logf("caught up %s after the restart", time.Since(t0).Round(time.Millisecond))
			f.sync(t)
			if diff := cmp.Diff(rows(t, f.cs.File), rows(t, file)); diff != "" {
				t.Errorf("restored replica differs from the backup replica (-want +got):\n%s", diff)
			}
			vs.Stop()
			t.Logf("restart landed mid-download: %v", midDownload)
		})
	}
}
