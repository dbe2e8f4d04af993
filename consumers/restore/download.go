package restore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// download fetches snap into the temporary file, validates it and renames
// it into place. An *InvalidError rejects the snapshot; the temporary file
// is gone either way.
func (r *Restorer) download(ctx context.Context, res streams.Backup, stream jetstream.Stream, up streams.Upstream, snap streams.Snapshot) (Result, error) {
	tmp := tempFile(r.cfg.File)
	removeTemp(r.cfg.File)
	defer removeTemp(r.cfg.File)
	if err := r.coveredNow(ctx, stream, snap.Name, snap.StreamSeq); err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	oinfo, err := res.Snapshots.GetInfo(ctx, snap.Name)
	if err != nil {
		return Result{}, fmt.Errorf("get snapshot %s: %w", snap.Name, err)
	}
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return Result{}, fmt.Errorf("restore: %w", err)
	}
	if err := preallocate(f, int64(oinfo.Size)); err != nil {
		f.Close()
		return Result{}, fmt.Errorf("restore: reserve %d bytes for snapshot %s: %w", oinfo.Size, snap.Name, err)
	}
	rows := snapshotRows(oinfo)
	r.log.Info("downloading snapshot", logkey.Snapshot, snap.Name, "bytes", snap.Size, "rows", rows, logkey.Seq, snap.StreamSeq)
	r.metrics.snapshotRows.Set(float64(rows))
	pw := &progress{log: r.log, m: r.metrics, total: snap.Size, rows: rows, every: r.cfg.ProgressEvery, start: t0, last: t0}
	n, digest, err := r.fetch(ctx, oinfo, f, pw)
	if err == nil {
		t := time.Now()
		err = f.Sync()
		r.log.Debug("snapshot synced", "took", time.Since(t).Round(time.Millisecond))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var ie *InvalidError
		if errors.As(err, &ie) {
			ie.Snapshot = snap.Name
			return Result{}, err
		}
		return Result{}, fmt.Errorf("download snapshot %s: %w", snap.Name, err)
	}
	if sum := hex.EncodeToString(digest); sum != snap.SHA256 || n != snap.Size {
		return Result{}, &InvalidError{snap.Name, ErrCorrupt,
			fmt.Sprintf("sha256 %s over %d bytes, but the snapshot was taken with sha256 %s over %d bytes", sum, n, snap.SHA256, snap.Size)}
	}
	took := time.Since(t0)
	r.log.Info("snapshot downloaded", logkey.Snapshot, snap.Name, "bytes", n, "took", took.Round(time.Millisecond),
		"mb_per_s", fmt.Sprintf("%.1f", float64(n)/1e6/max(took.Seconds(), 1e-9)))
	t1 := time.Now()
	st, err := r.validate(ctx, tmp, up)
	r.metrics.validation.Observe(time.Since(t1).Seconds())
	if err != nil {
		var ie *InvalidError
		if errors.As(err, &ie) {
			ie.Snapshot = snap.Name
		}
		return Result{}, err
	}
	if st.StreamSeq != snap.StreamSeq || st.Watermark != snap.Watermark {
		return Result{}, &InvalidError{snap.Name, ErrCorrupt, fmt.Sprintf("it holds seq %d watermark %s, but its metadata says seq %d watermark %s",
			st.StreamSeq, st.Watermark, snap.StreamSeq, snap.Watermark)}
	}
	// The history may have been purged while downloading only if the
	// reservation failed; check again rather than trust it.
	if err := r.coveredNow(ctx, stream, snap.Name, st.StreamSeq); err != nil {
		return Result{}, err
	}
	removeReplica(r.cfg.File)
	if err := os.Rename(tmp, r.cfg.File); err != nil {
		return Result{}, fmt.Errorf("restore: %w", err)
	}
	if err := syncDir(filepath.Dir(r.cfg.File)); err != nil {
		return Result{}, fmt.Errorf("restore: sync dir: %w", err)
	}
	r.metrics.dbBytes.Set(float64(n))
	info, err := stream.Info(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("stream info: %w", err)
	}
	r.log.Info("snapshot restored; catching up from the change stream", logkey.Snapshot, snap.Name, logkey.Seq, st.StreamSeq,
		logkey.Watermark, st.Watermark, "stream_last_seq", info.State.LastSeq)
	return Result{Restored: true, Snapshot: snap, State: st, CatchUpSeq: info.State.LastSeq, Bytes: n}, nil
}

// The download pipeline's sizes.
const (
	// fetchPull is how many chunks (1 MiB each) the pull consumer keeps
	// in flight. Reading a snapshot alone (bench/restore's NATS ceiling),
	// 8 and 32 were as fast; 128 was 1.5 to 3 times slower.
	fetchPull = 32
	// stageDepth is how many received chunks may wait for the hasher and
	// for the writer: with fetchPull it bounds a download's memory to
	// about 64 MiB.
	stageDepth = 32
	// writebackWindow is how much the writer writes before it starts that
	// window's writeback; it waits for the window writebackLag behind.
	writebackWindow = 16 << 20
	writebackLag    = 4
)

// fetch downloads an object's chunks into f and returns their SHA-256, in
// three stages that overlap: receiving (a pull consumer of its own),
// hashing, and writing, each chunk shared read-only by the last two. The
// writer starts the disk's writeback as it goes, so the final fsync has
// little left to do.
//
// ObjectStore.Get would push the chunks through an unbuffered pipe and
// hash them twice; its push consumer overflows (slow consumer, dropped
// chunks, a reset) whenever the disk is slower than the server.
func (r *Restorer) fetch(ctx context.Context, info *jetstream.ObjectInfo, f *os.File, p *progress) (int64, []byte, error) {
	h := sha256.New()
	if info.Size == 0 {
		return 0, h.Sum(nil), nil
	}
	stream, subj := "OBJ_"+r.cfg.Shard.SnapshotBucket(), r.cfg.Shard.SnapshotChunks(info.NUID)
	if err := r.countChunks(ctx, stream, subj, info); err != nil {
		return 0, nil, err
	}
	oc, err := r.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj},
	})
	if err != nil {
		return 0, nil, fmt.Errorf("read chunks: %w", err)
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(fetchPull))
	if err != nil {
		return 0, nil, fmt.Errorf("read chunks: %w", err)
	}
	defer it.Stop()
	// Where each stage spent its time, for the debug log: a download is
	// bound by the server's reads, the hash, or the disk.
	var recvWait, hashBusy, writeBusy, wbWait time.Duration
	t0 := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	toHash, toWrite := make(chan []byte, stageDepth), make(chan []byte, stageDepth)
	g.Go(func() error {
		defer close(toHash)
		defer close(toWrite)
		for i := uint32(0); i < info.Chunks; i++ {
			t := time.Now()
			msg, err := it.Next(jetstream.NextContext(gctx))
			recvWait += time.Since(t)
			if err != nil {
				return fmt.Errorf("read chunk %d of %d: %w", i+1, info.Chunks, err)
			}
			for _, c := range []chan<- []byte{toHash, toWrite} {
				select {
				case c <- msg.Data():
				case <-gctx.Done():
					return gctx.Err()
				}
			}
		}
		return nil
	})
	// The hasher and the writer stop at a cancellation rather than work
	// through the chunks already received.
	g.Go(func() error {
		for b := range toHash {
			if err := gctx.Err(); err != nil {
				return err
			}
			t := time.Now()
			h.Write(b)
			hashBusy += time.Since(t)
		}
		return nil
	})
	var n int64
	g.Go(func() error {
		wb := writeback{f: f, log: r.log}
		for b := range toWrite {
			if err := gctx.Err(); err != nil {
				return err
			}
			t := time.Now()
			m, err := f.Write(b)
			n += int64(m)
			if err != nil {
				return err
			}
			t1 := time.Now()
			writeBusy += t1.Sub(t)
			p.add(m)
			wb.advance(n)
			wbWait += time.Since(t1)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return n, nil, err
	}
	r.log.Debug("download stages", "took", time.Since(t0).Round(time.Millisecond), "receive_wait", recvWait.Round(time.Millisecond),
		"hash", hashBusy.Round(time.Millisecond), "write", writeBusy.Round(time.Millisecond), "writeback_wait", wbWait.Round(time.Millisecond))
	return n, h.Sum(nil), nil
}

// countChunks checks that the object store holds as many chunks of the
// object as its info names. The receiver waits for each chunk in turn, so
// with some missing (a file store that lost a block, a snapshot deleted
// whose info survived) it would wait forever instead of failing.
func (r *Restorer) countChunks(ctx context.Context, stream, subj string, info *jetstream.ObjectInfo) error {
	s, err := r.js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("read chunks: %w", err)
	}
	si, err := s.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return fmt.Errorf("read chunks: %w", err)
	}
	if have := si.State.Subjects[subj]; have != uint64(info.Chunks) {
		return &InvalidError{"", ErrCorrupt, fmt.Sprintf("the object store holds %d chunks of it, but its info names %d", have, info.Chunks)}
	}
	return nil
}

// writeback starts the writeback of each window a download writes and waits
// for older ones. It is an optimisation only: where the kernel refuses it,
// the final fsync does all the work.
type writeback struct {
	f       *os.File
	log     *slog.Logger
	next    int64   // start of the window not yet started
	windows []int64 // started and not yet waited for
	off     bool
}

func (w *writeback) advance(n int64) {
	for !w.off && n-w.next >= writebackWindow {
		err := startWriteback(w.f, w.next, writebackWindow)
		w.windows = append(w.windows, w.next)
		w.next += writebackWindow
		if err == nil && len(w.windows) > writebackLag {
			err = awaitWriteback(w.f, w.windows[0], writebackWindow)
			w.windows = w.windows[1:]
		}
		if err != nil {
			w.log.Debug("writeback during the download is unavailable; the final fsync does it", "err", err)
			w.off = true
		}
	}
}

func (r *Restorer) coveredNow(ctx context.Context, stream jetstream.Stream, name string, seq uint64) error {
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream info: %w", err)
	}
	if err := covered(info, seq); err != nil {
		return &InvalidError{name, ErrWatermarkTooOld, err.Error()}
	}
	return nil
}

// validate opens a replica file and checks it: not corrupt (quick_check, or
// integrity_check when configured), of the stream's replica version.
func (r *Restorer) validate(ctx context.Context, file string, up streams.Upstream) (replica.State, error) {
	db, err := sql.Open("sqlite", "file:"+file+"?_pragma=busy_timeout(10000)")
	if err != nil {
		return replica.State{}, &InvalidError{"", ErrCorrupt, err.Error()}
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	check := "quick_check"
	if r.cfg.IntegrityCheck {
		check = "integrity_check"
	}
	rows, err := db.QueryContext(ctx, "PRAGMA "+check)
	if err != nil {
		if ctx.Err() != nil {
			return replica.State{}, ctx.Err()
		}
		return replica.State{}, &InvalidError{"", ErrCorrupt, check + ": " + err.Error()}
	}
	var problems []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return replica.State{}, &InvalidError{"", ErrCorrupt, check + ": " + err.Error()}
		}
		if s != "ok" {
			problems = append(problems, s)
		}
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return replica.State{}, &InvalidError{"", ErrCorrupt, check + ": " + err.Error()}
	}
	if len(problems) > 0 {
		if len(problems) > 5 {
			problems = append(problems[:5], "...")
		}
		return replica.State{}, &InvalidError{"", ErrCorrupt, check + ": " + strings.Join(problems, "; ")}
	}
	st, err := replica.LoadState(ctx, db)
	if err != nil {
		return replica.State{}, &InvalidError{"", ErrCorrupt, err.Error()}
	}
	if st.ReplicaVersion != up.ReplicaVersion {
		return st, &InvalidError{"", ErrWrongReplicaVersion,
			fmt.Sprintf("it has replica version %q; the stream's is %q", st.ReplicaVersion, up.ReplicaVersion)}
	}
	return st, nil
}

// checkLocal validates an existing local replica. One that is invalid is
// deleted; one that is valid and still covered is kept.
func (r *Restorer) checkLocal(ctx context.Context, up streams.Upstream, info *jetstream.StreamInfo) (replica.State, bool) {
	if _, err := os.Stat(r.cfg.File); err != nil {
		return replica.State{}, false
	}
	st, err := r.validate(ctx, r.cfg.File, up)
	if err == nil {
		if cerr := covered(info, st.StreamSeq); cerr != nil {
			err = &InvalidError{"", ErrWatermarkTooOld, cerr.Error()}
		}
	}
	if err == nil {
		return st, true
	}
	if ctx.Err() != nil {
		return replica.State{}, false
	}
	r.log.Warn("deleting the local replica", "err", err)
	removeReplica(r.cfg.File)
	return replica.State{}, false
}

// snapshotRows is the row count in a snapshot's metadata, or 0 when it has
// none (a snapshot taken before it was recorded).
func snapshotRows(info *jetstream.ObjectInfo) int64 {
	s, _ := streams.SnapshotFromInfo(info)
	return max(s.Rows, 0)
}

// progress reports a download's bytes, rows (estimated from the bytes, as
// a snapshot's rows fill its pages about evenly), rate and ETA. Only the
// writer calls add.
type progress struct {
	log   *slog.Logger
	m     *metrics
	total int64
	rows  int64
	n     int64
	every time.Duration
	start time.Time
	last  time.Time
}

func (p *progress) add(n int) {
	p.n += int64(n)
	p.m.downloaded.Add(float64(n))
	if now := time.Now(); now.Sub(p.last) >= p.every {
		p.last = now
		rate, eta := rateETA(float64(p.n), float64(p.total-p.n), now.Sub(p.start))
		rows := p.rowsDone()
		p.m.eta.Set(eta.Seconds())
		p.m.rows.Set(float64(rows))
		p.log.Info("restore progress", "bytes", p.n, "total", p.total, "rows", rows, "total_rows", p.rows,
			"mb_per_s", fmt.Sprintf("%.1f", rate/1e6), "eta", eta.Round(time.Second))
	}
}

// rateETA is the rate of done units over el, and the time left at that
// rate for left more.
func rateETA(done, left float64, el time.Duration) (rate float64, eta time.Duration) {
	rate = done / max(el.Seconds(), 1e-9)
	return rate, time.Duration(left / max(rate, 1) * float64(time.Second))
}

func (p *progress) rowsDone() int64 {
	if p.total <= 0 {
		return p.rows
	}
	return int64(float64(p.rows) * float64(p.n) / float64(p.total))
}
