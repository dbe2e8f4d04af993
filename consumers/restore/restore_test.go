package restore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/consumers/backup"
	"github.com/jetsync/jetsync/consumers/backup/backuptest"
	"github.com/jetsync/jetsync/consumers/restore"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// fixture is a stream with its backup replica and backup producer, driven
// by hand (Snapshot, Check) on a fake clock.
type fixture struct {
	e     *backuptest.Env
	clock *backuptest.Clock
	cs    *backuptest.Running
	p     *backup.Producer
}

func newFixture(t *testing.T, rows int) *fixture {
	t.Helper()
	e := backuptest.New(t)
	f := &fixture{e: e, clock: backuptest.NewClock()}
	if rows >= 0 {
		e.InitialSync(rows)
	}
	f.cs = e.StartReplica(filepath.Join(t.TempDir(), "backup-replica.db"), "cs")
	p, err := backup.New(backup.Config{File: f.cs.File, Shard: e.Shard, TaskID: "cs", Now: f.clock.Now, Logger: backuptest.Logger(),
		InitialGrace: 100 * time.Hour, PurgeWait: -1}, e.JS)
	if err != nil {
		t.Fatal(err)
	}
	f.p = p
	return f
}

func (f *fixture) sync(t *testing.T) {
	t.Helper()
	_, last := f.e.StreamState()
	f.cs.WaitSeq(t, last)
}

// snapshot takes a snapshot and verifies it.
func (f *fixture) snapshot(t *testing.T) streams.Snapshot {
	t.Helper()
	f.sync(t)
	s, err := f.p.Snapshot(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.p.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// logs collects log output.
type logs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (f *fixture) restorer(t *testing.T, file string, lg *logs) *restore.Restorer {
	t.Helper()
	var h slog.Handler = slog.DiscardHandler
	if lg != nil {
		h = slog.NewTextHandler(lg, nil)
	}
	r, err := restore.New(restore.Config{File: file, Shard: f.e.Shard, TaskID: "vs", PollInterval: 20 * time.Millisecond,
		Heartbeat: 50 * time.Millisecond, ReservationTTL: time.Second, Logger: slog.New(h), Registerer: prometheus.NewRegistry()}, f.e.JS)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// restoreAsync runs Restore in the background.
func restoreAsync(t *testing.T, r *restore.Restorer) (<-chan *restore.Hold, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	hc, errc := make(chan *restore.Hold, 1), make(chan error, 1)
	go func() {
		h, err := r.Restore(ctx)
		if err != nil {
			errc <- err
			return
		}
		hc <- h
	}()
	return hc, errc
}

func wait(t *testing.T, hc <-chan *restore.Hold, errc <-chan error) *restore.Hold {
	t.Helper()
	select {
	case h := <-hc:
		t.Cleanup(h.Abandon)
		return h
	case err := <-errc:
		t.Fatalf("Restore: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Restore did not return")
	}
	return nil
}

func restoreNow(t *testing.T, r *restore.Restorer) *restore.Hold {
	t.Helper()
	hc, errc := restoreAsync(t, r)
	return wait(t, hc, errc)
}

func notYet(t *testing.T, hc <-chan *restore.Hold, errc <-chan error) {
	t.Helper()
	select {
	case h := <-hc:
		t.Fatalf("Restore returned %+v; want it still waiting", h.Result())
	case err := <-errc:
		t.Fatalf("Restore failed: %v; want it still waiting", err)
	default:
	}
}

func rows(t *testing.T, file string) []string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+file+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rs, err := db.Query(`SELECT id || '|' || v || '|' || _0_version FROM item ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func reservation(t *testing.T, f *fixture) (streams.Reservation, bool) {
	t.Helper()
	e, err := f.e.Backup.Reservations.Get(context.Background(), streams.KeyReservation("vs"))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return streams.Reservation{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var r streams.Reservation
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		t.Fatal(err)
	}
	return r, true
}

// TestRestore_R5_R8_R9_R12_R13_R16_ColdStartAfterPurge: a view-syncer whose
// stream was purged past its start restores the newest snapshot, catches up
// and ends up equal to the backup replica; its reservation blocked purges
// until then.
func TestRestore_R5_R8_R9_R12_R13_R16_ColdStartAfterPurge(t *testing.T) {
	f := newFixture(t, 2000)
	ctx := context.Background()
	resetSeq, _ := f.e.StreamState()
	for i := range 50 {
		f.e.Tx(i)
	}
	s := f.snapshot(t)
	for i := range 20 {
		f.e.Tx(i * 3)
	}
	f.sync(t)
	f.clock.Advance(time.Minute) // past the cleanup delay
	if err := f.p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	first, _ := f.e.StreamState()
	if first != s.StreamSeq+1 || first <= resetSeq {
		t.Fatalf("after the purge the stream starts at %d; want %d, past the initial sync at %d", first, s.StreamSeq+1, resetSeq)
	}

	file := filepath.Join(t.TempDir(), "vs.db")
	lg := &logs{}
	h := restoreNow(t, f.restorer(t, file, lg))
	res := h.Result()
	if !res.Restored || res.Snapshot.Name != s.Name || res.State.StreamSeq != s.StreamSeq {
		t.Fatalf("Result = %+v; want snapshot %s restored", res, s.Name)
	}
	if _, err := os.Stat(file + ".restore"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
	// The reservation is live: the monitor purges nothing.
	for i := range 5 {
		f.e.Tx(100 + i)
	}
	s2 := f.snapshot(t)
	f.clock.Advance(time.Minute)
	if err := f.p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.e.StreamState(); got != first {
		t.Fatalf("purged to %d while a reservation was live (R-6)", got)
	}
	vs := f.e.StartReplica(file, "vs")
	if err := h.EndWhenCaughtUp(ctx, vs.C); err != nil {
		t.Fatal(err)
	}
	if r, ok := reservation(t, f); !ok || !r.Ended {
		t.Fatalf("reservation = %+v, %v; want ended", r, ok)
	}
	_, last := f.e.StreamState()
	vs.WaitSeq(t, last)
	f.sync(t)
	if diff := cmp.Diff(rows(t, f.cs.File), rows(t, file)); diff != "" {
		t.Errorf("restored replica differs from the backup replica (-want +got):\n%s", diff)
	}
	// With the reservation over, purges resume up to the newer snapshot.
	if err := f.p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	// The newest transaction is always kept.
	if got, last := f.e.StreamState(); got != min(s2.StreamSeq+1, last) {
		t.Errorf("after the reservation ended the stream starts at %d; want %d", got, min(s2.StreamSeq+1, last))
	}
	// Progress is reported in rows too: the snapshot recorded its 2,000.
	for _, want := range []string{"downloading snapshot", "rows=2000", "snapshot restored", "caught up after the restore", "reservation ended"} {
		if !strings.Contains(lg.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, lg)
		}
	}
}

// TestRestore_R13_R14_RejectsCorruptSnapshot: a snapshot with flipped
// bytes is rejected with a clear error and deleted locally; the restore
// keeps waiting and then uses a valid one.
func TestRestore_R13_R14_RejectsCorruptSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fixDigest re-records the digest of the flipped bytes, so that
		// only SQLite's own check can tell.
		fixDigest bool
		want      string
	}{
		{"DigestMismatch", false, "sha256"},
		{"QuickCheck", true, "quick_check"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, 3000)
			ctx := context.Background()
			s := f.snapshot(t)
			data, err := f.e.Backup.Snapshots.GetBytes(ctx, s.Name)
			if err != nil {
				t.Fatal(err)
			}
			// Flip bytes inside the table's pages, past the header.
			for i := len(data) / 2; i < len(data)/2+64; i++ {
				data[i] ^= 0xff
			}
			bad := s
			bad.Name = s.ReplicaVersion + "/corrupt"
			if tc.fixDigest {
				bad.SHA256 = sha(data)
			}
			if _, err := f.e.Backup.Snapshots.Put(ctx, jetstream.ObjectMeta{Name: bad.Name, Metadata: bad.Metadata()}, bytes.NewReader(data)); err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(bad)
			if _, err := f.e.Backup.State.Put(ctx, streams.KeyBackupVerified, b); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "vs.db")
			lg := &logs{}
			hc, errc := restoreAsync(t, f.restorer(t, file, lg))
			polltest.Until(t, 10*time.Second, "the rejection", func() bool { return strings.Contains(lg.String(), "snapshot rejected") })
			notYet(t, hc, errc)
			if out := lg.String(); !strings.Contains(out, "corrupt") || !strings.Contains(out, tc.want) {
				t.Errorf("rejection log lacks %q:\n%s", tc.want, out)
			}
			if _, err := os.Stat(file + ".restore"); !os.IsNotExist(err) {
				t.Errorf("the corrupt download was left behind: %v", err)
			}
			if _, err := os.Stat(file); !os.IsNotExist(err) {
				t.Errorf("a replica file exists after a rejected snapshot: %v", err)
			}
			// A new valid snapshot lands.
			f.e.Tx(1)
			f.sync(t)
			good, err := f.p.Snapshot(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			b, _ = json.Marshal(good)
			if _, err := f.e.Backup.State.Put(ctx, streams.KeyBackupVerified, b); err != nil {
				t.Fatal(err)
			}
			h := wait(t, hc, errc)
			if r := h.Result(); !r.Restored || r.Snapshot.Name != good.Name {
				t.Fatalf("Result = %+v; want %s restored", r, good.Name)
			}
			if diff := cmp.Diff(rows(t, f.cs.File), rows(t, file)); diff != "" {
				t.Errorf("restored replica (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRestore_R16_RejectsWrongReplicaVersion: the only snapshot is of an
// older initial sync; the restore rejects it (WrongReplicaVersion), waits,
// and restores the first snapshot of the current one.
func TestRestore_R16_RejectsWrongReplicaVersion(t *testing.T) {
	f := newFixture(t, 100)
	old := f.snapshot(t)
	f.e.InitialSync(50) // a resync: new replica version
	file := filepath.Join(t.TempDir(), "vs.db")
	lg := &logs{}
	hc, errc := restoreAsync(t, f.restorer(t, file, lg))
	polltest.Until(t, 10*time.Second, "the rejection", func() bool { return strings.Contains(lg.String(), "rejected: WrongReplicaVersion") })
	notYet(t, hc, errc)
	if !strings.Contains(lg.String(), old.Name) {
		t.Errorf("the rejection does not name the snapshot:\n%s", lg)
	}
	s := f.snapshot(t)
	if s.ReplicaVersion != f.e.Version {
		t.Fatalf("new snapshot of version %s; want %s", s.ReplicaVersion, f.e.Version)
	}
	h := wait(t, hc, errc)
	if r := h.Result(); r.Snapshot.Name != s.Name || r.State.ReplicaVersion != f.e.Version {
		t.Fatalf("Result = %+v; want %s", r, s.Name)
	}
}

// TestRestore_R16_RejectsWatermarkTooOld: a snapshot whose history the
// stream no longer holds is rejected, never used.
func TestRestore_R16_RejectsWatermarkTooOld(t *testing.T) {
	f := newFixture(t, 100)
	ctx := context.Background()
	s := f.snapshot(t)
	for i := range 5 {
		f.e.Tx(i)
	}
	// History purged behind the backup's back.
	if err := f.e.Stream.Purge(ctx, jetstream.WithPurgeSequence(s.StreamSeq+3)); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "vs.db")
	lg := &logs{}
	hc, errc := restoreAsync(t, f.restorer(t, file, lg))
	polltest.Until(t, 10*time.Second, "the rejection", func() bool { return strings.Contains(lg.String(), "rejected: WatermarkTooOld") })
	notYet(t, hc, errc)
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("a replica file exists: %v", err)
	}
}

// TestRestore_R8_R14_HoldsReservationOnFreshStack: with no backup yet, the
// restore holds its reservation open (refreshing it) until the first
// snapshot lands, then restores it.
func TestRestore_R8_R14_HoldsReservationOnFreshStack(t *testing.T) {
	f := newFixture(t, -1)
	file := filepath.Join(t.TempDir(), "vs.db")
	lg := &logs{}
	hc, errc := restoreAsync(t, f.restorer(t, file, lg))
	var beats uint64
	polltest.Until(t, 10*time.Second, "heartbeats", func() bool {
		r, ok := reservation(t, f)
		beats = r.Beat
		return ok && r.Beat >= 3
	})
	notYet(t, hc, errc)
	if !strings.Contains(lg.String(), "no restorable snapshot yet; holding the reservation open until one lands") {
		t.Errorf("log lacks the holding message:\n%s", lg)
	}
	f.e.InitialSync(10)
	s := f.snapshot(t)
	h := wait(t, hc, errc)
	if r := h.Result(); r.Snapshot.Name != s.Name {
		t.Fatalf("Result = %+v; want %s", r, s.Name)
	}
	t.Logf("held through %d heartbeats", beats)
}

// TestRestore_R12_KeepsValidLocalReplica: a valid local replica whose
// history the stream still holds is kept, not downloaded again; an invalid
// one is deleted and restored.
func TestRestore_R12_KeepsValidLocalReplica(t *testing.T) {
	f := newFixture(t, 100)
	f.snapshot(t)
	file := filepath.Join(t.TempDir(), "vs.db")
	h := restoreNow(t, f.restorer(t, file, nil))
	if !h.Result().Restored {
		t.Fatalf("first Result = %+v; want restored", h.Result())
	}
	h.Abandon()
	h = restoreNow(t, f.restorer(t, file, nil))
	if r := h.Result(); !r.Kept || r.Restored {
		t.Fatalf("second Result = %+v; want kept", r)
	}
	h.Abandon()
	// Garbage in place of the replica: deleted, restored.
	if err := os.WriteFile(file, bytes.Repeat([]byte("x"), 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	h = restoreNow(t, f.restorer(t, file, nil))
	if r := h.Result(); !r.Restored {
		t.Fatalf("third Result = %+v; want restored", r)
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
