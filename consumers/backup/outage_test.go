package backup_test

import (
	"context"
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/backup"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// TestProducer_R14_NATSRestartDuringSnapshot restarts the NATS server in
// the middle of a (throttled) snapshot upload: whether that upload fails or
// rides the reconnect out, no partial object is listed, the producer keeps
// running, and a later snapshot is claimed, verified and holds the newest
// transaction.
func TestProducer_R14_NATSRestartDuringSnapshot(t *testing.T) {
	// The first chunk is published once its 1 MiB has been read: the
	// replica must be several chunks long for the upload to be seen under
	// way, with chunks stored and no object yet.
	f := newFixture(t, 60000)
	f.sync(t)
	ctx := context.Background()
	p := f.producer(t, backup.Config{CheckInterval: 50 * time.Millisecond, Interval: time.Millisecond,
		UploadRate: 512 << 10, InitialGrace: time.Hour})
	errc := run(t, p)
	// Chunks are stored but no object is listed: an upload is under way.
	st, err := f.e.JS.Stream(ctx, "OBJ_"+f.e.Shard.SnapshotBucket())
	if err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, 20*time.Second, "an upload under way", func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs > 0
	})
	if _, ok, _ := streams.ReadSnapshot(ctx, f.e.Backup.State, streams.KeyBackupClaimed); ok {
		t.Fatal("the upload ended before the restart")
	}
	f.e.Restart()
	f.e.Tx(3)
	f.sync(t)
	want := f.e.WM
	polltest.Until(t, 60*time.Second, "a verified snapshot of the newest transaction", func() bool {
		f.clock.Advance(time.Millisecond) // the snapshot interval
		v, ok, _ := streams.ReadSnapshot(ctx, f.e.Backup.State, streams.KeyBackupVerified)
		return ok && v.Watermark == want
	})
	if err := running(errc); err != nil {
		t.Fatalf("the producer stopped: %v", err)
	}
	t.Logf("snapshots: %v failed, %v succeeded", counter(t, f.reg, "jetsync_backup_snapshots_total", "error"),
		counter(t, f.reg, "jetsync_backup_snapshots_total", "success"))
}
