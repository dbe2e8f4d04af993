package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// backupEnv are the change-streamer's backup settings in these tests: the
// production rules at test speed.
func backupEnv() []string {
	return []string{
		"JETSYNC_BACKUP_CHECK_INTERVAL=300ms",
		"ZERO_LITESTREAM_INCREMENTAL_BACKUP_INTERVAL_MINUTES=0.05", // 3 s
		"JETSYNC_BACKUP_CLEANUP_DELAY=1s",
		"JETSYNC_BACKUP_PURGE_WAIT=0",
		"JETSYNC_RESERVATION_TTL=3s",
		"JETSYNC_RESERVATION_HEARTBEAT=1s",
		"JETSYNC_RESTORE_POLL_INTERVAL=200ms",
		// A snapshot (about 45 MB) takes about 2 s to upload, so that
		// a kill lands inside an upload.
		"JETSYNC_BACKUP_MAX_UPLOAD_RATE=20",
	}
}

// backupRig is a crash rig whose seed rows are large enough that a
// snapshot's upload and download take a while (about 50 MB).
func newBackupRig(t *testing.T, seed uint64) *crashRig {
	t.Helper()
	s := newSpine(t, spineSchema+`
		INSERT INTO every (id, t, j, ai) SELECT g, 'seed ' || g || repeat(' padding', 90), '{"seed": true}', '{1,2}'
			FROM generate_series(1, 60000) g;
		INSERT INTO pair SELECT 'seed-' || g, g % 5, 'v' FROM generate_series(1, 100) g;`)
	s.file = ""
	return &crashRig{spine: s, root: dataRoot(t), r: rand.New(rand.NewPCG(seed, 7))}
}

func (c *crashRig) startBackupStreamer() *proc {
	return start(c.t, append([]string{
		"JETSYNC_NATS_URL=" + c.nats,
		"ZERO_UPSTREAM_DB=" + c.url,
		"JETSYNC_DATA_DIR=" + filepath.Join(c.root, "cs"),
		"ZERO_TASK_ID=backup-cs",
		"ZERO_PORT=0",
		"ZERO_LOG_FORMAT=json",
	}, backupEnv()...), "change-streamer")
}

func (c *crashRig) startRestorer(role string) *proc {
	return start(c.t, append([]string{
		"JETSYNC_NATS_URL=" + c.nats,
		"JETSYNC_DATA_DIR=" + filepath.Join(c.root, "rep"),
		"ZERO_TASK_ID=backup-rep",
		"ZERO_PORT=0",
		"ZERO_LOG_FORMAT=json",
	}, backupEnv()...), role)
}

func (c *crashRig) backupKV(name string) jetstream.KeyValue {
	c.t.Helper()
	kv, err := c.js.KeyValue(context.Background(), name)
	if err != nil {
		return nil
	}
	return kv
}

// verified is the newest verified snapshot, if any.
func (c *crashRig) verified() (streams.Snapshot, bool) {
	kv := c.backupKV(c.shard.BackupBucket())
	if kv == nil {
		return streams.Snapshot{}, false
	}
	s, ok, _ := streams.ReadSnapshot(context.Background(), kv, streams.KeyBackupVerified)
	return s, ok
}

// objectChunks is the number of messages in the snapshot store's stream,
// and the number of complete snapshots it lists.
func (c *crashRig) objectChunks() (msgs uint64, objects int) {
	ctx := context.Background()
	st, err := c.js.Stream(ctx, "OBJ_"+c.shard.SnapshotBucket())
	if err != nil {
		return 0, 0
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, 0
	}
	os, err := c.js.ObjectStore(ctx, c.shard.SnapshotBucket())
	if err != nil {
		return info.State.Msgs, 0
	}
	list, err := os.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return info.State.Msgs, 0
	}
	return info.State.Msgs, len(list)
}

// hasLog reports whether p has logged a JSON record with msg.
func hasLog(p *proc, msg string) bool {
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r map[string]any
		if json.Unmarshal(sc.Bytes(), &r) == nil && r["msg"] == msg {
			return true
		}
	}
	return false
}

// killWhen SIGKILLs p's process group as soon as cond holds, polling
// tightly; it fails the test if p exits first or timeout passes.
func killWhen(t *testing.T, p *proc, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if p.exited() {
			t.Fatalf("%v exited (%v) before %s:\n%s", p.cmd.Args, p.err, what, p.stderr.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill: %v", err)
	}
	<-p.done
	t.Logf("killed %s %s", p.cmd.Args[1], what)
}

// checkSnapshotsComplete reads every listed snapshot through: each one
// matches its digest, so a killed upload left no visible partial object.
func (c *crashRig) checkSnapshotsComplete() int {
	c.t.Helper()
	// Without a deadline, each read of the object store waits only 5 s
	// for the next chunk, which a loaded machine can exceed while the
	// ordered consumer recovers from a dropped message.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	os, err := c.js.ObjectStore(ctx, c.shard.SnapshotBucket())
	if err != nil {
		c.t.Fatal(err)
	}
	list, err := os.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0
	}
	if err != nil {
		c.t.Fatal(err)
	}
	for _, info := range list {
		s, err := streams.SnapshotFromInfo(info)
		if err != nil {
			c.t.Fatalf("listed object %s is not a complete snapshot: %v", info.Name, err)
		}
		b, err := os.GetBytes(ctx, info.Name)
		if err != nil {
			c.t.Fatalf("read snapshot %s: %v", info.Name, err)
		}
		if int64(len(b)) != s.Size {
			c.t.Fatalf("snapshot %s has %d bytes; its metadata says %d", info.Name, len(b), s.Size)
		}
	}
	return len(list)
}

// waitReplicaCaughtUp waits until file has applied the whole stream.
func (c *crashRig) waitReplicaCaughtUp(file string, timeout time.Duration) {
	c.t.Helper()
	polltest.Until(c.t, timeout, "the replica to catch up", func() bool {
		info, err := c.stream().Info(context.Background())
		if err != nil {
			return false
		}
		return replicaState(c.t, file).StreamSeq >= info.State.LastSeq
	})
}

// TestBackup_R12_R14_KillPoints SIGKILLs the change-streamer during a
// snapshot upload, and a replicator during its snapshot download and during
// its catch-up, while writes go on. No partial snapshot is ever listed or
// restored, no half-written file is used as a replica, and the final
// restore ends equal to Postgres.
func TestBackup_R12_R14_KillPoints(t *testing.T) {
	seed := crashSeed(t)
	c := newBackupRig(t, seed)
	cw := startWriter(t, c.url, seed)
	cs := c.startBackupStreamer()

	// 1. Kill during an upload: chunks are in the store's stream, but no
	// new object is listed yet.
	var base uint64
	var baseObjs int
	killWhen(t, cs, 3*time.Minute, "during a snapshot upload", func() bool {
		msgs, objs := c.objectChunks()
		if objs != baseObjs {
			base, baseObjs = msgs, objs
			return false
		}
		return msgs > base
	})
	csDir := filepath.Join(c.root, "cs")
	if n := c.checkSnapshotsComplete(); n != baseObjs {
		t.Fatalf("%d snapshots listed after the kill; want the %d complete before it", n, baseObjs)
	}
	if msgs, _ := c.objectChunks(); msgs <= base {
		t.Fatalf("no chunk of the killed upload is in the store (%d messages, %d before): the kill missed the upload", msgs, base)
	}
	leftovers, _ := filepath.Glob(filepath.Join(csDir, ".jetsync-snapshot-*"))
	t.Logf("upload killed with %d complete snapshots; %d temporary snapshot files left", baseObjs, len(leftovers))

	// The restarted change-streamer keeps its valid backup replica under
	// the purge lock, removes the leftovers and snapshots again.
	cs = c.startBackupStreamer()
	cs.logRecord(t, "keeping the local replica: the stream still covers it", 60*time.Second)
	polltest.Until(t, 2*time.Minute, "a verified snapshot", func() bool { _, ok := c.verified(); return ok })
	if left, _ := filepath.Glob(filepath.Join(csDir, ".jetsync-snapshot-*")); len(left) > 0 {
		// Only the snapshot in hand may exist: wait for it to go.
		polltest.Until(t, 30*time.Second, "stale snapshot files removed", func() bool {
			for _, l := range leftovers {
				if _, err := os.Stat(l); err == nil {
					return false
				}
			}
			return true
		})
	}
	// Purges go past the initial sync, so that a new replica must restore.
	polltest.Until(t, 2*time.Minute, "a purge past the initial sync", func() bool {
		u := c.upstreamRecord()
		info, err := c.stream().Info(context.Background())
		return u != nil && err == nil && info.State.FirstSeq > u.ResetSeq
	})

	// 2. Kill the replicator during its download.
	file := filepath.Join(c.root, "rep", "replicator-replica.db")
	rep := c.startRestorer("replicator")
	killWhen(t, rep, 2*time.Minute, "during the snapshot download", func() bool {
		fi, err := os.Stat(file + ".restore")
		return err == nil && fi.Size() > 1<<20
	})
	if _, err := os.Stat(file); err == nil {
		t.Fatalf("a replica file exists after a download was killed")
	}
	if fi, err := os.Stat(file + ".restore"); err == nil {
		t.Logf("the killed download left %d bytes in %s", fi.Size(), filepath.Base(file)+".restore")
	}

	// 3. The next run removes the partial download, restores, and is
	// killed while it catches up.
	rep = c.startRestorer("replicator")
	killWhen(t, rep, 2*time.Minute, "during the catch-up", func() bool {
		return hasLog(rep, "snapshot restored; catching up from the change stream")
	})
	if _, err := os.Stat(file + ".restore"); err == nil {
		t.Fatalf("a temporary download is left after a completed restore")
	}

	// 4. The last run keeps the restored replica or restores again, and
	// catches up.
	rep = c.startRestorer("replicator")
	rep.logRecord(t, "caught up after the restore", 3*time.Minute)
	if err := cw.stop(); err != nil {
		t.Fatal(err)
	}
	c.file = file
	c.waitReplicaCaughtUp(file, 2*time.Minute)
	c.checkReplicaEqualsPostgres()
	if left, _ := filepath.Glob(file + ".restore*"); len(left) > 0 {
		t.Errorf("temporary download files left: %v", left)
	}
	if n := c.checkSnapshotsComplete(); n == 0 {
		t.Error("no snapshot listed at the end")
	}
	if cs.exited() {
		t.Fatalf("the change-streamer exited: %v", cs.err)
	}
}
