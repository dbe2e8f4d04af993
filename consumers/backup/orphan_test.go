package backup_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/backup"
	"github.com/jetsync/jetsync/internal/polltest"
)

// TestProducer_R12_RemovesOrphanChunks: the chunks a killed upload left, which
// no object names, are purged when a producer starts, once older than the
// grace; chunks within the grace (an upload under way elsewhere) and those of
// complete snapshots stay.
func TestProducer_R12_RemovesOrphanChunks(t *testing.T) {
	f := newFixture(t, 200)
	f.sync(t)
	ctx := context.Background()
	const grace = 500 * time.Millisecond
	p := f.producer(t, backup.Config{OrphanGrace: grace, CheckInterval: time.Hour, Interval: time.Hour, InitialGrace: time.Hour})
	snap, err := p.Snapshot(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	bucket := f.e.Shard.SnapshotBucket()
	prefix := "$O." + bucket + ".C."
	chunk := make([]byte, 64<<10)
	publish := func(nuid string, n int) time.Time {
		t.Helper()
		var last time.Time
		for range n {
			if _, err := f.e.JS.Publish(ctx, prefix+nuid, chunk); err != nil {
				t.Fatal(err)
			}
			last = time.Now()
		}
		return last
	}
	old := publish("killedupload0000000000000", 3)
	polltest.Until(t, 10*time.Second, "the killed upload's chunks to age past the grace", func() bool {
		return time.Since(old) > 2*grace
	})
	publish("uploadunderway00000000000", 2)
	// The producer's clock stands at the real time from here on: the first
	// chunks are over the grace, the others within it.
	f.clock.Advance(time.Since(f.clock.Now()))

	st, err := f.e.JS.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	subjects := func() map[string]uint64 {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects
	}
	if got := subjects(); got[prefix+"killedupload0000000000000"] != 3 || got[prefix+"uploadunderway00000000000"] != 2 {
		t.Fatalf("chunk subjects before the start: %v", got)
	}
	errc := run(t, p)
	polltest.Until(t, 20*time.Second, "the killed upload's chunks purged", func() bool {
		_, ok := subjects()[prefix+"killedupload0000000000000"]
		return !ok
	})
	if err := running(errc); err != nil {
		t.Fatalf("the producer stopped: %v", err)
	}
	got := subjects()
	if got[prefix+"uploadunderway00000000000"] != 2 {
		t.Errorf("the chunks within the grace were touched: %v", got)
	}
	info, err := f.e.Backup.Snapshots.GetInfo(ctx, snap.Name)
	if err != nil {
		t.Fatal(err)
	}
	if n := got[prefix+info.NUID]; n != uint64(info.Chunks) || n == 0 {
		t.Errorf("snapshot %s has %d chunks in the store; its info says %d", snap.Name, n, info.Chunks)
	}
}
