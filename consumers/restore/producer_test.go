package restore_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/consumers/restore"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// producerRestorer is a change-streamer's restore of its backup replica
// under the purge lock, as task.
func (f *fixture) producerRestorer(t *testing.T, file, task string, lg *logs) *restore.Restorer {
	t.Helper()
	var h slog.Handler = slog.DiscardHandler
	if lg != nil {
		h = slog.NewTextHandler(lg, nil)
	}
	r, err := restore.New(restore.Config{File: file, Shard: f.e.Shard, TaskID: task, PurgeLock: true, PollInterval: 20 * time.Millisecond,
		Heartbeat: 50 * time.Millisecond, ReservationTTL: time.Second, Logger: slog.New(h), Registerer: prometheus.NewRegistry()}, f.e.JS)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *fixture) purgeLock(t *testing.T) (streams.PurgeLock, bool) {
	t.Helper()
	e, err := f.e.Backup.Reservations.Get(context.Background(), streams.KeyPurgeLock)
	if err != nil {
		return streams.PurgeLock{}, false
	}
	var l streams.PurgeLock
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		t.Fatal(err)
	}
	return l, true
}

// purgedPastInitialSync writes, snapshots and purges until the stream no
// longer holds the initial sync; it returns the snapshot.
func (f *fixture) purgedPastInitialSync(t *testing.T) streams.Snapshot {
	t.Helper()
	resetSeq, _ := f.e.StreamState()
	for i := range 30 {
		f.e.Tx(i)
	}
	s := f.snapshot(t)
	f.e.Tx(1)
	f.sync(t)
	f.clock.Advance(time.Minute)
	if err := f.p.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if first, _ := f.e.StreamState(); first <= resetSeq {
		t.Fatalf("stream starts at %d; want it purged past the initial sync at %d", first, resetSeq)
	}
	return s
}

// TestRestore_R15_R17_ProducerRestoresUnderPurgeLock: a change-streamer
// taking over restores its backup replica from the newest snapshot while
// holding the purge lock, and no purge runs until it releases it.
func TestRestore_R15_R17_ProducerRestoresUnderPurgeLock(t *testing.T) {
	f := newFixture(t, 500)
	ctx := context.Background()
	s := f.purgedPastInitialSync(t)
	first, _ := f.e.StreamState()

	file := filepath.Join(t.TempDir(), "new-backup-replica.db")
	h := restoreNow(t, f.producerRestorer(t, file, "cs-new", nil))
	if r := h.Result(); !r.Restored || r.Snapshot.Name != s.Name {
		t.Fatalf("Result = %+v; want %s restored", r, s.Name)
	}
	if l, ok := f.purgeLock(t); !ok || l.Holder != "cs-new" {
		t.Fatalf("purge lock = %+v, %v; want held by cs-new", l, ok)
	}
	// The old producer's monitor ("cs") sees another holder's live lock:
	// however far its verified backup goes, it purges nothing.
	for i := range 5 {
		f.e.Tx(200 + i)
	}
	f.snapshot(t)
	f.clock.Advance(time.Hour)
	// The monitor judges liveness by its own clock: let a heartbeat land
	// after the jump, as one would in real time.
	l0, _ := f.purgeLock(t)
	polltest.Until(t, 10*time.Second, "a heartbeat", func() bool { l, _ := f.purgeLock(t); return l.Beat > l0.Beat })
	if err := f.p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.e.StreamState(); got != first {
		t.Fatalf("purged to %d under another holder's purge lock (R-17)", got)
	}
	// Caught up, the new producer releases the lock; purges resume.
	cs2 := f.e.StartReplica(file, "cs-new")
	if err := h.EndWhenCaughtUp(ctx, cs2.C); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.purgeLock(t); ok {
		t.Fatal("purge lock still held after the catch-up")
	}
	_, last := f.e.StreamState()
	cs2.WaitSeq(t, last)
	f.sync(t)
	if diff := cmp.Diff(rows(t, f.cs.File), rows(t, file)); diff != "" {
		t.Errorf("restored backup replica differs (-want +got):\n%s", diff)
	}
	f.clock.Advance(time.Minute)
	if err := f.p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.e.StreamState(); got == first {
		t.Error("no purge after the purge lock was released")
	}
}

// TestRestore_R15_NoSnapshotFailsClearly: with no snapshot and a stream
// that no longer holds the initial sync, a producer's restore fails at once
// with ErrNoSnapshot (the caller falls back to a new initial sync), and
// releases the lock; a view-syncer's keeps waiting instead.
func TestRestore_R15_NoSnapshotFailsClearly(t *testing.T) {
	f := newFixture(t, 100)
	ctx := context.Background()
	s := f.purgedPastInitialSync(t)
	if err := f.e.Backup.Snapshots.Delete(ctx, s.Name); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Backup.State.Delete(ctx, streams.KeyBackupVerified); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "b.db")
	_, errc := restoreAsync(t, f.producerRestorer(t, file, "cs-new", nil))
	select {
	case err := <-errc:
		if !errors.Is(err, restore.ErrNoSnapshot) || !strings.Contains(err.Error(), "no snapshot exists and the change stream no longer holds the history") {
			t.Fatalf("Restore = %v; want ErrNoSnapshot", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a producer's restore with no snapshot did not fail")
	}
	if _, ok := f.purgeLock(t); ok {
		t.Error("the purge lock is still held after the restore failed")
	}
	hc, errc := restoreAsync(t, f.restorer(t, filepath.Join(t.TempDir(), "vs.db"), nil))
	polltest.Until(t, 10*time.Second, "the view-syncer's reservation", func() bool { _, ok := reservation(t, f); return ok })
	notYet(t, hc, errc)
}

// TestRestore_R17_WaitsForAnotherHoldersLock: a producer's restore waits
// while another task's purge lock is live, and takes over its own (left by
// a crash of the same task) at once.
func TestRestore_R17_WaitsForAnotherHoldersLock(t *testing.T) {
	f := newFixture(t, 100)
	f.snapshot(t)
	ctx := context.Background()
	lock := func(holder string) {
		t.Helper()
		b, _ := json.Marshal(streams.PurgeLock{Holder: holder, Since: time.Now()})
		if _, err := streams.PutWithTTL(ctx, f.e.JS, f.e.Shard.ReservationBucket(), streams.KeyPurgeLock, b, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	lock("other")
	lg := &logs{}
	hc, errc := restoreAsync(t, f.producerRestorer(t, filepath.Join(t.TempDir(), "a.db"), "cs-new", lg))
	polltest.Until(t, 10*time.Second, "the waiting log", func() bool {
		return strings.Contains(lg.String(), "waiting for another holder's purge lock")
	})
	notYet(t, hc, errc)
	if err := f.e.Backup.Reservations.Delete(ctx, streams.KeyPurgeLock); err != nil {
		t.Fatal(err)
	}
	h := wait(t, hc, errc)
	if l, ok := f.purgeLock(t); !ok || l.Holder != "cs-new" {
		t.Fatalf("purge lock = %+v, %v; want held by cs-new", l, ok)
	}
	h.Abandon() // a crash: the lock stays

	lg = &logs{}
	h = restoreNow(t, f.producerRestorer(t, filepath.Join(t.TempDir(), "b.db"), "cs-new", lg))
	if !strings.Contains(lg.String(), "took over the purge lock") {
		t.Errorf("log lacks the take-over:\n%s", lg)
	}
	if err := h.End(ctx); err != nil {
		t.Fatal(err)
	}
}
