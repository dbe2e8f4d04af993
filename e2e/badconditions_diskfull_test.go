package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of size bytes on dir until the test ends, and
// returns a func that resizes it. It skips the test where mounting is not
// allowed (non-root CI): consumers/replicator's TestConsumer_DiskFull then
// covers the same path with SQLite's max_page_count.
func mountTmpfs(t *testing.T, dir string, size int) (resize func(size int)) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (%v: %s); consumers/replicator TestConsumer_DiskFull covers a full disk with max_page_count", err, strings.TrimSpace(string(out)))
	}
	t.Logf("the replica is on a %d KiB tmpfs at %s", size>>10, dir)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v %s; detaching it", dir, err, out)
			_ = exec.Command("umount", "-l", dir).Run()
		}
	})
	return func(size int) {
		t.Helper()
		if out, err := exec.Command("mount", "-o", fmt.Sprintf("remount,size=%d", size), dir).CombinedOutput(); err != nil {
			t.Fatalf("resize the tmpfs: %v %s", err, out)
		}
	}
}

// metric reads one sample from a /metrics page: the first line of the
// metric whose labels contain label.
func metric(t *testing.T, port int, name, label string) (float64, bool) {
	t.Helper()
	body, code := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if code != 200 {
		t.Fatalf("GET /metrics = %d", code)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		return f, err == nil
	}
	return 0, false
}

// TestBadConditions_ReplicaDiskFull runs a replicator whose data directory
// is a small tmpfs while a workload with large values fills it. The
// replicator must stay up, say so in its log and metrics, retry with a
// growing backoff, and once the tmpfs grows catch up to equal Postgres.
func TestBadConditions_ReplicaDiskFull(t *testing.T) {
	s := newSpine(t, spineSchema+`INSERT INTO every (id, t) SELECT g, 'seed' FROM generate_series(1, 50) g;`)
	root := dataRoot(t)
	dir := filepath.Join(root, "rep")
	resize := mountTmpfs(t, dir, 1<<20)
	s.startProducer()
	s.file = filepath.Join(dir, "replicator-replica.db")
	rep := start(t, []string{
		"JETSYNC_NATS_URL=" + s.nats,
		"JETSYNC_DATA_DIR=" + dir,
		"ZERO_TASK_ID=diskfull",
		"ZERO_PORT=0",
		"ZERO_LOG_FORMAT=json",
	}, "replicator")
	port := int(rep.logRecord(t, "http listening", 30*time.Second)["port"].(float64))
	s.waitCaughtUp(time.Minute)

	ctx := context.Background()
	w := newWorkload(0, 1000)
	for id := int64(1); id <= 50; id++ {
		w.ids = append(w.ids, id)
	}
	// Until the replica's disk is full; about one transaction in twenty
	// carries 200 KiB.
	for i := 0; findRecord(rep, "replica disk full: the batch is rolled back and not acked; retrying until there is space") == nil; i++ {
		if i == 2000 {
			t.Fatalf("2,000 transactions did not fill a 1 MiB disk:\n%s", rep.stderr.String())
		}
		if err := w.tx(ctx, s.pg, false); err != nil {
			t.Fatalf("workload: %v", err)
		}
	}
	full := time.Now()
	t.Logf("the disk filled after %d transactions", w.seq)
	for range 50 {
		if err := w.tx(ctx, s.pg, false); err != nil {
			t.Fatalf("workload: %v", err)
		}
	}
	rep.logRecord(t, "replica disk still full; retrying", time.Minute)
	if v, ok := metric(t, port, "jetsync_replica_disk_full", `consumer="replicator"`); !ok || v != 1 {
		t.Errorf("jetsync_replica_disk_full = %v (found %v) while full; want 1", v, ok)
	}
	if s.hasMarkerRows() {
		t.Fatal("the replica caught up on a full disk")
	}

	resize(256 << 20)
	s.waitCaughtUp(2 * time.Minute)
	elapsed := time.Since(full)
	s.checkReplicaEqualsPostgres()
	rep.logRecord(t, "replica disk has space again; writing resumed", 10*time.Second)
	if v, ok := metric(t, port, "jetsync_replica_disk_full", `consumer="replicator"`); !ok || v != 0 {
		t.Errorf("jetsync_replica_disk_full = %v (found %v) after recovery; want 0", v, ok)
	}
	attempts, _ := metric(t, port, "jetsync_replica_disk_full_retries_total", `consumer="replicator"`)
	// The backoff starts at 500 ms with ±50% jitter and only grows.
	if limit := 2 + int(elapsed/(250*time.Millisecond)); int(attempts) > limit || attempts < 2 {
		t.Errorf("%v attempts in %s; want 2 to %d", attempts, elapsed.Round(time.Millisecond), limit)
	}
	t.Logf("full for %s, %v attempts", elapsed.Round(time.Millisecond), attempts)
	if strings.Contains(rep.stderr.String(), "panic") {
		t.Errorf("the replicator panicked:\n%s", rep.stderr.String())
	}
	if code := rep.stop(t, 30*time.Second); code != 0 {
		t.Errorf("replicator exit code %d after SIGTERM; want 0", code)
	}
}
