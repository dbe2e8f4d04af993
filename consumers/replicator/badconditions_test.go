package replicator_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/polltest"
)

// smallDisk puts dir on a disk that fills up: a tmpfs of size bytes when
// this process may mount one (root), else a cap on the pages SQLite may
// use (PRAGMA max_page_count), which fails writes with the same
// SQLITE_FULL. grow gives the disk room again. mode says which one runs.
func smallDisk(t *testing.T, dir string, size int) (mode string, grow func()) {
	t.Helper()
	// JETSYNC_TEST_NO_TMPFS=1 tries the fallback where mounting works.
	if os.Getenv("JETSYNC_TEST_NO_TMPFS") != "" {
		t.Log("JETSYNC_TEST_NO_TMPFS is set: not mounting a tmpfs")
	} else if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err == nil {
		t.Cleanup(func() {
			if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
				t.Logf("umount %s: %v %s; detaching it", dir, err, out)
				_ = exec.Command("umount", "-l", dir).Run()
			}
		})
		return "tmpfs", func() {
			t.Helper()
			if out, err := exec.Command("mount", "-o", "remount,size=64m", dir).CombinedOutput(); err != nil {
				t.Fatalf("grow the tmpfs: %v %s", err, out)
			}
		}
	} else {
		t.Logf("cannot mount a tmpfs (%v: %s); capping the replica with PRAGMA max_page_count instead", err, strings.TrimSpace(string(out)))
	}
	dbs := make(chan *sql.DB, 1)
	t.Cleanup(replicator.SetOpenHook(func(db *sql.DB) {
		var pages, pageSize int
		if err := db.QueryRow("PRAGMA page_count").Scan(&pages); err != nil {
			t.Errorf("page_count: %v", err)
		}
		if err := db.QueryRow("PRAGMA page_size").Scan(&pageSize); err != nil {
			t.Errorf("page_size: %v", err)
		}
		if _, err := db.Exec(fmt.Sprintf("PRAGMA max_page_count = %d", max(pages, 1)+size/pageSize)); err != nil {
			t.Errorf("max_page_count: %v", err)
		}
		dbs <- db
	}))
	return "max_page_count", func() {
		t.Helper()
		select {
		case db := <-dbs:
			if _, err := db.Exec("PRAGMA max_page_count = 1073741823"); err != nil {
				t.Fatalf("lift max_page_count: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the consumer never opened its replica")
		}
	}
}

// TestConsumer_DiskFull fills the disk under the replica while transactions
// keep coming. The consumer must neither ack nor lose the batch that failed,
// nor stop, nor retry in a tight loop; once there is room it catches up.
func TestConsumer_DiskFull(t *testing.T) {
	e := newEnv(t)
	e.initialSync(3)
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mode, grow := smallDisk(t, dir, 256<<10)
	t.Logf("disk full by %s", mode)
	file := filepath.Join(dir, "replica.db")
	r := e.start(e.config(file))
	r.waitWM(t, e.WM)

	// 64 transactions of 16 KiB each: four times the disk.
	title := strings.Repeat("x", 16<<10)
	const n = 64
	for i := range n {
		e.tx(ins(issue(fmt.Sprintf("big%02d", i), title, i)))
	}
	polltest.Until(t, 30*time.Second, "the disk to fill", func() bool { return r.c.Health() != nil })
	full := time.Now()
	if !strings.Contains(r.logs.String(), "replica disk full") {
		t.Errorf("no disk-full log line:\n%s", r.logs)
	}
	// More changes while it is full, and a couple of retries.
	for i := range 5 {
		e.tx(ins(issue(fmt.Sprintf("late%d", i), "late", i)))
	}
	polltest.Until(t, 30*time.Second, "a retry", func() bool { return strings.Contains(r.logs.String(), "replica disk still full") })
	if r.c.State().Watermark == e.WM {
		t.Fatal("the replica caught up on a full disk")
	}
	grow()
	polltest.Until(t, 60*time.Second, "the replica to catch up", func() bool { return r.c.State().Watermark == e.WM })
	elapsed := time.Since(full)
	select {
	case <-r.done:
		t.Fatal("the consumer stopped")
	default:
	}
	if err := r.c.Health(); err != nil {
		t.Errorf("Health() = %v after catching up", err)
	}
	got := query(t, file, "SELECT count(*), sum(length(title)) FROM issue WHERE id LIKE 'big%'")
	if want := fmt.Sprintf("%d|%d", n, n*len(title)); len(got) != 1 || got[0] != want {
		t.Errorf("big rows = %v; want %s", got, want)
	}
	if got := query(t, file, "SELECT count(*) FROM issue WHERE id LIKE 'late%'"); len(got) != 1 || got[0] != "5" {
		t.Errorf("late rows = %v; want 5", got)
	}
	logs := r.logs.String()
	retries := strings.Count(logs, "replica disk full") + strings.Count(logs, "replica disk still full")
	// The backoff starts at 500 ms with ±50% jitter and only grows.
	if limit := 2 + int(elapsed/(250*time.Millisecond)); retries > limit {
		t.Errorf("%d attempts in %s: a tight loop (want at most %d)", retries, elapsed, limit)
	}
	if !strings.Contains(logs, "writing resumed") {
		t.Errorf("no log line for the recovery:\n%s", logs)
	}
	t.Logf("%s: full for %s, %d attempts", mode, elapsed.Round(time.Millisecond), retries)
	if err := r.stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
}

// TestConsumer_CorruptReplica damages a stopped consumer's replica file.
// On restart the consumer must say why it is corrupt, move it aside intact,
// and rebuild the replica from the stream; when the stream no longer holds
// the reset it was built from, it asks the producer for a new one.
func TestConsumer_CorruptReplica(t *testing.T) {
	overwrite := func(off func(size int64) int64, n func(size int64) int64, b byte) func(t *testing.T, file string) {
		return func(t *testing.T, file string) {
			f, err := os.OpenFile(file, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(bytes.Repeat([]byte{b}, int(n(fi.Size()))), off(fi.Size())); err != nil {
				t.Fatal(err)
			}
		}
	}
	truncate := func(to func(size int64) int64) func(t *testing.T, file string) {
		return func(t *testing.T, file string) {
			fi, err := os.Stat(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(file, to(fi.Size())); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, file string)
		reason  string // in the log line
		purge   bool   // the stream no longer holds the reset
	}{
		{"GarbageHeader", overwrite(func(int64) int64 { return 0 }, func(int64) int64 { return 100 }, 0x5a), "not a SQLite database", false},
		{"MiddleOverwritten", overwrite(func(s int64) int64 { return s / 3 }, func(s int64) int64 { return s / 3 }, 0xa5), "", false},
		{"TruncatedToHalf", truncate(func(s int64) int64 { return s / 2 }), "", false},
		{"TruncatedHeader", truncate(func(int64) int64 { return 40 }), "truncated", false},
		{"NoStreamPosition", func(t *testing.T, file string) {
			db, err := sql.Open("sqlite", "file:"+file)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec(`DELETE FROM "_jetsync.state"`); err != nil {
				t.Fatal(err)
			}
		}, "no stream position", false},
		{"HistoryPurged", overwrite(func(s int64) int64 { return s / 3 }, func(s int64) int64 { return s / 3 }, 0xa5), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.initialSync(300)
			dir := t.TempDir()
			file := filepath.Join(dir, "replica.db")
			r := e.start(e.config(file))
			e.tx(ins(issue("a", "A", 1)))
			r.waitWM(t, e.WM)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(file + "-wal"); err == nil {
				t.Fatal("the stopped replica left a WAL: the corruption would miss what it holds")
			}
			tc.corrupt(t, file)
			damaged, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			e.tx(ins(issue("b", "B", 2)))
			var requests chan *nats.Msg
			if tc.purge {
				if err := e.Stream.Purge(context.Background(), jetstream.WithPurgeKeep(1)); err != nil {
					t.Fatal(err)
				}
				requests = make(chan *nats.Msg, 10)
				sub, err := e.nc.ChanSubscribe(e.Shard.ResyncSubject(), requests)
				if err != nil {
					t.Fatal(err)
				}
				defer sub.Unsubscribe()
				e.nc.Flush()
			}

			r2 := e.start(e.config(file))
			want := 302
			if tc.purge {
				select {
				case m := <-requests:
					m.Respond(nil)
				case <-time.After(10 * time.Second):
					t.Fatalf("no resync request:\n%s", r2.logs)
				}
				e.initialSync(2)
				e.tx(ins(issue("c", "C", 3)))
				want = 3
			}
			r2.waitWM(t, e.WM)
			if got := query(t, file, "SELECT count(*) FROM issue"); len(got) != 1 || got[0] != strconv.Itoa(want) {
				t.Errorf("issue rows = %v; want %d", got, want)
			}
			logs := r2.logs.String()
			if !strings.Contains(logs, "replica file is corrupt") || !strings.Contains(logs, tc.reason) {
				t.Errorf("no log line saying the replica is corrupt (%q):\n%s", tc.reason, logs)
			}
			if tc.purge && !strings.Contains(logs, "is no longer in the stream") {
				t.Errorf("no log line saying the stream no longer holds the replica's history:\n%s", logs)
			}
			moved, _ := filepath.Glob(file + ".corrupt-*")
			if len(moved) != 1 {
				t.Fatalf("moved aside: %v; want one file", moved)
			}
			if b, err := os.ReadFile(moved[0]); err != nil || !bytes.Equal(b, damaged) {
				t.Errorf("the file moved aside is not the damaged replica (err %v)", err)
			}
			select {
			case <-r2.done:
				t.Fatal("the consumer stopped")
			default:
			}
		})
	}
}
