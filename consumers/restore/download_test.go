package restore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/consumers/restore"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// TestRestore_R13_RejectsShortSnapshot: a snapshot whose info names more
// chunks than the object store holds is rejected as corrupt (the download
// waited forever for the missing one), and a valid one is then restored.
func TestRestore_R13_RejectsShortSnapshot(t *testing.T) {
	f := newFixture(t, 60000) // a snapshot of a few chunks
	ctx := context.Background()
	s := f.snapshot(t)
	info, err := f.e.Backup.Snapshots.GetInfo(ctx, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Chunks < 2 {
		t.Fatalf("the snapshot has %d chunks; the test needs several", info.Chunks)
	}
	obj, err := f.e.JS.Stream(ctx, "OBJ_"+f.e.Shard.SnapshotBucket())
	if err != nil {
		t.Fatal(err)
	}
	last, err := obj.GetLastMsgForSubject(ctx, f.e.Shard.SnapshotChunks(info.NUID))
	if err != nil {
		t.Fatal(err)
	}
	if err := obj.DeleteMsg(ctx, last.Sequence); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "vs.db")
	lg := &logs{}
	hc, errc := restoreAsync(t, f.restorer(t, file, lg))
	polltest.Until(t, 10*time.Second, "the rejection", func() bool { return strings.Contains(lg.String(), "snapshot rejected") })
	notYet(t, hc, errc)
	if out := lg.String(); !strings.Contains(out, "corrupt") || !strings.Contains(out, "chunks") || !strings.Contains(out, s.Name) {
		t.Errorf("rejection log does not say the snapshot lacks chunks:\n%s", out)
	}
	if _, err := os.Stat(file + ".restore"); !os.IsNotExist(err) {
		t.Errorf("the partial download was left behind: %v", err)
	}
	f.e.Tx(1)
	f.sync(t)
	good, err := f.p.Snapshot(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(good)
	if _, err := f.e.Backup.State.Put(ctx, streams.KeyBackupVerified, b); err != nil {
		t.Fatal(err)
	}
	h := wait(t, hc, errc)
	if r := h.Result(); !r.Restored || r.Snapshot.Name != good.Name {
		t.Fatalf("Result = %+v; want %s restored", r, good.Name)
	}
}

// cancelOn cancels when a log line contains match, from inside the
// goroutine that logs it.
type cancelOn struct {
	logs
	match  string
	cancel context.CancelFunc
}

func (c *cancelOn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(c.match)) {
		c.cancel()
	}
	return c.logs.Write(p)
}

// TestRestore_CancelledMidDownload: a restore cancelled after its first
// chunk is written returns the context's error, removes the partial file
// and leaves none of its pipeline's goroutines behind.
func TestRestore_CancelledMidDownload(t *testing.T) {
	f := newFixture(t, 60000)
	s := f.snapshot(t)
	if s.Size <= 1<<20 {
		t.Fatalf("the snapshot has %d bytes; the test needs several chunks", s.Size)
	}
	file := filepath.Join(t.TempDir(), "vs.db")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The first progress line comes from the writer after its first chunk.
	lg := &cancelOn{match: "restore progress", cancel: cancel}
	reg := prometheus.NewRegistry()
	r, err := restore.New(restore.Config{File: file, Shard: f.e.Shard, TaskID: "vs", ProgressEvery: time.Nanosecond,
		Logger: slog.New(slog.NewTextHandler(lg, nil)), Registerer: reg}, f.e.JS)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		h, err := r.Restore(ctx)
		if h != nil {
			h.Abandon()
		}
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Restore did not return after its cancellation")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Restore = %v; want context.Canceled", err)
	}
	if !strings.Contains(lg.String(), "restore progress") {
		t.Fatalf("cancelled before the download:\n%s", lg.String())
	}
	// The chunks received before the cancellation are not written.
	if n := counter(t, reg, "jetsync_restore_downloaded_bytes_total"); n >= float64(s.Size) {
		t.Errorf("wrote %.0f bytes of %d after the cancellation at the first chunk; want the download stopped", n, s.Size)
	}
	for _, name := range []string{file + ".restore", file} {
		if _, err := os.Stat(name); !os.IsNotExist(err) {
			t.Errorf("%s exists after the cancelled restore: %v", filepath.Base(name), err)
		}
	}
	polltest.Until(t, 5*time.Second, "the restore's goroutines to end", func() bool {
		buf := make([]byte, 1<<20)
		return !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("jetsync/consumers/restore."))
	})
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
