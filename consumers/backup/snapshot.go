package backup

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// ErrNoReplica reports a backup replica with no initial sync yet: there is
// nothing to snapshot.
var ErrNoReplica = errors.New("the backup replica has no initial sync yet")

// snapshotPrefix starts the temporary snapshot files beside the replica.
const snapshotPrefix = ".jetsync-snapshot-"

// Snapshot takes a consistent snapshot of the backup replica, uploads it and
// claims it. Unless force is set, a replica that has not moved since the last
// snapshot is not snapshotted again, and that snapshot is returned.
func (p *Producer) Snapshot(ctx context.Context, force bool) (streams.Snapshot, error) {
	if err := p.ensure(ctx); err != nil {
		return streams.Snapshot{}, err
	}
	p.start()
	t0 := time.Now()
	tmp, st, err := p.copyReplica(ctx)
	if tmp != "" {
		defer os.Remove(tmp)
	}
	if err != nil {
		if !errors.Is(err, ErrNoReplica) {
			p.metrics.snapshots.WithLabelValues("error").Inc()
		}
		return streams.Snapshot{}, err
	}
	name := streams.SnapshotName(st.ReplicaVersion, st.Watermark)
	if p.last != nil && p.last.Name == name && !force {
		p.lastAt = p.cfg.Now()
		return *p.last, nil
	}
	sum, size, err := digest(tmp)
	if err != nil {
		p.metrics.snapshots.WithLabelValues("error").Inc()
		return streams.Snapshot{}, err
	}
	// Counted only for a snapshot that is uploaded: a replica that has
	// not moved is copied at each tick, and counting reads every table.
	rows, err := countRows(ctx, tmp)
	if err != nil {
		p.metrics.snapshots.WithLabelValues("error").Inc()
		return streams.Snapshot{}, fmt.Errorf("snapshot: copy: %w", err)
	}
	s := streams.Snapshot{
		Name: name, ReplicaVersion: st.ReplicaVersion, Watermark: st.Watermark, StreamSeq: st.StreamSeq,
		WriteTimeMs: st.WriteTimeMs, SHA256: sum, Size: size, TakenAt: p.cfg.Now().UTC(), Rows: rows,
	}
	if err := p.upload(ctx, tmp, s); err != nil {
		p.metrics.snapshots.WithLabelValues("error").Inc()
		return streams.Snapshot{}, err
	}
	s.ClaimedAt = p.cfg.Now().UTC()
	// The claim comes only after the upload completed: it is what the
	// producer believes, which the monitor then verifies.
	if _, err := p.res.State.Put(ctx, streams.KeyBackupClaimed, mustJSON(s)); err != nil {
		p.metrics.snapshots.WithLabelValues("error").Inc()
		return streams.Snapshot{}, fmt.Errorf("claim snapshot %s: %w", name, err)
	}
	p.last, p.lastAt = &s, s.ClaimedAt
	p.metrics.snapshots.WithLabelValues("success").Inc()
	p.metrics.snapshotBytes.Set(float64(size))
	p.metrics.snapshotTime.Observe(time.Since(t0).Seconds())
	p.log.Info("snapshot uploaded", logkey.Snapshot, name, logkey.Seq, s.StreamSeq, logkey.Watermark, s.Watermark,
		"bytes", size, "rows", rows, "took", time.Since(t0).Round(time.Millisecond))
	if err := p.prune(ctx); err != nil {
		p.log.Warn("prune old snapshots", "err", err)
	}
	return s, nil
}

// copyReplica copies the replica with VACUUM INTO from a connection of its
// own. In WAL mode that is one read transaction: the copy is a committed
// state, which is always a transaction boundary since the replica consumer
// commits whole transactions only, and the consumer's writer goes on
// committing meanwhile.
func (p *Producer) copyReplica(ctx context.Context) (string, replica.State, error) {
	var st replica.State
	if _, err := os.Stat(p.cfg.File); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", st, ErrNoReplica
		}
		return "", st, fmt.Errorf("snapshot: %w", err)
	}
	db, err := sql.Open("sqlite", "file:"+p.cfg.File+"?_pragma=busy_timeout(30000)")
	if err != nil {
		return "", st, fmt.Errorf("snapshot: open %s: %w", p.cfg.File, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	pre, err := replica.LoadState(ctx, db)
	if err != nil && !strings.Contains(err.Error(), "no such table") {
		return "", st, fmt.Errorf("snapshot: %w", err)
	}
	if pre.ReplicaVersion == "" {
		return "", st, ErrNoReplica
	}
	var r [8]byte
	rand.Read(r[:])
	tmp := filepath.Join(filepath.Dir(p.cfg.File), snapshotPrefix+hex.EncodeToString(r[:])+".db")
	if _, err := db.ExecContext(ctx, "VACUUM INTO '"+strings.ReplaceAll(tmp, "'", "''")+"'"); err != nil {
		return tmp, st, fmt.Errorf("snapshot: vacuum into: %w", err)
	}
	// The state is read from the copy itself, so it describes exactly
	// what the copy holds.
	cp, err := sql.Open("sqlite", "file:"+tmp+"?mode=ro")
	if err != nil {
		return tmp, st, fmt.Errorf("snapshot: open copy: %w", err)
	}
	defer cp.Close()
	if st, err = replica.LoadState(ctx, cp); err != nil {
		return tmp, st, fmt.Errorf("snapshot: copy: %w", err)
	}
	if st.ReplicaVersion == "" {
		return tmp, st, ErrNoReplica
	}
	return tmp, st, nil
}

// countRows counts the rows of the replicated tables in a snapshot copy.
func countRows(ctx context.Context, file string) (int64, error) {
	db, err := sql.Open("sqlite", "file:"+file+"?mode=ro")
	if err != nil {
		return 0, fmt.Errorf("count rows: %w", err)
	}
	defer db.Close()
	return replica.CountRows(ctx, db)
}

func digest(file string) (string, int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", 0, fmt.Errorf("digest: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("digest %s: %w", file, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// uploadInFlight bounds the chunks an upload has unacknowledged. The
// object store's own Put allows 4,000, which a large snapshot reaches:
// nats-server then refuses chunks (429 "too many requests").
const uploadInFlight = 64

// chunkSize is the size of a snapshot's object store chunks.
const chunkSize = 1 << 20

// upload puts the snapshot file in the object store, in its format (chunks
// on $O.<bucket>.C.<nuid>, then the info on $O.<bucket>.M.<name>, rolled
// up), with at most uploadInFlight chunks unacknowledged. The object
// becomes visible only once its info is stored, after every chunk was
// acknowledged; a failed upload's chunks are purged.
func (p *Producer) upload(ctx context.Context, file string, s streams.Snapshot) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if p.cfg.UploadRate > 0 {
		r = &throttled{ctx: ctx, r: f, rate: p.cfg.UploadRate, start: time.Now()}
	}
	bucket := p.cfg.Shard.SnapshotBucket()
	old, err := p.res.Snapshots.GetInfo(ctx, s.Name)
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("upload %s: %w", s.Name, err)
	}
	var pubErr error
	var mu sync.Mutex
	pub, err := jetstream.New(p.js.Conn(), jetstream.WithPublishAsyncMaxPending(uploadInFlight),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
			mu.Lock()
			pubErr = cmp.Or(pubErr, err)
			mu.Unlock()
		}))
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	var id [12]byte
	rand.Read(id[:])
	nuid := hex.EncodeToString(id[:])
	chunkSubj := p.cfg.Shard.SnapshotChunks(nuid)
	purge := func() {
		if st, err := p.js.Stream(context.WithoutCancel(ctx), "OBJ_"+bucket); err == nil {
			_ = st.Purge(context.WithoutCancel(ctx), jetstream.WithPurgeSubject(chunkSubj))
		}
	}
	fail := func(err error) error {
		purge()
		return fmt.Errorf("upload %s: %w", s.Name, err)
	}
	h := sha256.New()
	buf := make([]byte, chunkSize)
	var size uint64
	var chunks uint32
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			h.Write(buf[:n])
			// The stall wait is how long a chunk may wait for room among
			// the unacknowledged ones: as long as the server's disk needs.
			if _, err := pub.PublishMsgAsync(&nats.Msg{Subject: chunkSubj, Data: buf[:n]}, jetstream.WithStallWait(time.Minute)); err != nil {
				return fail(err)
			}
			size += uint64(n)
			chunks++
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return fail(rerr)
		}
		mu.Lock()
		err := pubErr
		mu.Unlock()
		if err != nil {
			return fail(err)
		}
	}
	select {
	case <-pub.PublishAsyncComplete():
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	if pubErr != nil {
		return fail(pubErr)
	}
	info := jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{
			Name:        s.Name,
			Description: "jetsync replica snapshot at watermark " + s.Watermark,
			Metadata:    s.Metadata(),
			Opts:        &jetstream.ObjectMetaOptions{ChunkSize: chunkSize},
		},
		Bucket: bucket, NUID: nuid, Size: size, Chunks: chunks,
		Digest: "SHA-256=" + base64.URLEncoding.EncodeToString(h.Sum(nil)),
	}
	meta := nats.NewMsg("$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(s.Name)))
	meta.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	meta.Data = mustJSON(info)
	if _, err := p.js.PublishMsg(ctx, meta); err != nil {
		return fail(err)
	}
	if old != nil && !old.Deleted {
		if st, err := p.js.Stream(ctx, "OBJ_"+bucket); err == nil {
			_ = st.Purge(ctx, jetstream.WithPurgeSubject(p.cfg.Shard.SnapshotChunks(old.NUID)))
		}
	}
	return nil
}

// throttled reads no faster than rate bytes a second on average, so that a
// snapshot upload leaves the NATS server's bandwidth to the change stream.
type throttled struct {
	ctx   context.Context // the upload's: a read waits no longer than it
	r     io.Reader
	rate  int64
	start time.Time
	n     int64
}

func (t *throttled) Read(b []byte) (int, error) {
	n, err := t.r.Read(b[:min(len(b), 256<<10)])
	t.n += int64(n)
	due := time.Duration(float64(t.n) / float64(t.rate) * float64(time.Second))
	if wait := due - time.Since(t.start); wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-t.ctx.Done():
			return n, t.ctx.Err()
		case <-timer.C:
		}
	}
	return n, err
}

// prune deletes snapshots beyond the newest Keep, but never while a restore
// reservation is live (a restorer may be reading one), and never the newest
// verified one.
func (p *Producer) prune(ctx context.Context) error {
	live, err := p.liveReservations(ctx)
	if err != nil || len(live) > 0 {
		return err
	}
	snaps, err := p.list(ctx)
	if err != nil {
		return err
	}
	if len(snaps) <= p.cfg.Keep {
		return nil
	}
	for _, s := range snaps[:len(snaps)-p.cfg.Keep] {
		if p.newest != nil && s.Name == p.newest.Name {
			continue
		}
		if err := p.res.Snapshots.Delete(ctx, s.Name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("delete snapshot %s: %w", s.Name, err)
		}
		delete(p.verified, s.Name)
		p.log.Info("deleted old snapshot", logkey.Snapshot, s.Name)
	}
	return nil
}

// list returns the snapshots in the object store, oldest first.
func (p *Producer) list(ctx context.Context) ([]streams.Snapshot, error) {
	infos, err := p.res.Snapshots.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	var out []streams.Snapshot
	for _, info := range infos {
		if info.Deleted {
			continue
		}
		s, err := streams.SnapshotFromInfo(info)
		if err != nil {
			p.log.Warn("ignoring object in the snapshot store", "err", err)
			continue
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b streams.Snapshot) int { return a.TakenAt.Compare(b.TakenAt) })
	return out, nil
}

// removeOrphanChunks purges the chunks of uploads that never finished: a
// producer killed mid-upload leaves chunks in the object store's stream
// that no object's info names, and nothing else would ever delete them.
// Chunks written within OrphanGrace are left alone, as they may belong to
// an upload under way elsewhere (a producer handing over).
func (p *Producer) removeOrphanChunks(ctx context.Context) (int, error) {
	bucket := p.cfg.Shard.SnapshotBucket()
	st, err := p.js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return 0, fmt.Errorf("orphan chunks: %w", err)
	}
	prefix := p.cfg.Shard.SnapshotChunks("")
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return 0, fmt.Errorf("orphan chunks: %w", err)
	}
	if len(info.State.Subjects) == 0 {
		return 0, nil
	}
	// Deleted objects are listed too: their chunks are purged with them,
	// and a subject of theirs left behind is an orphan all the same.
	live := map[string]bool{}
	infos, err := p.res.Snapshots.List(ctx, jetstream.ListObjectsShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, fmt.Errorf("orphan chunks: %w", err)
	}
	for _, o := range infos {
		if !o.Deleted {
			live[o.NUID] = true
		}
	}
	removed := 0
	for subj, n := range info.State.Subjects {
		if live[strings.TrimPrefix(subj, prefix)] {
			continue
		}
		last, err := st.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return removed, fmt.Errorf("orphan chunks: %w", err)
		}
		if age := p.cfg.Now().Sub(last.Time); age < p.cfg.OrphanGrace {
			continue
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
			return removed, fmt.Errorf("orphan chunks: purge %s: %w", subj, err)
		}
		removed++
		p.log.Info("purged the chunks of an unfinished upload", logkey.Subject, subj, "chunks", n, "written", last.Time)
	}
	return removed, nil
}

// removeStaleSnapshots deletes temporary snapshot files a crash left.
func removeStaleSnapshots(file string, log *slog.Logger) {
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(file), snapshotPrefix+"*"))
	for _, m := range matches {
		if err := os.Remove(m); err == nil {
			log.Info("removed a stale snapshot file", "file", m)
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are marshalled
	}
	return b
}
