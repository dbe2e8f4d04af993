package restore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	r.log.Info("downloading snapshot", "snapshot", snap.Name, "bytes", snap.Size, "seq", snap.StreamSeq)
	pw := &progress{log: r.log, m: r.metrics, total: snap.Size, every: r.cfg.ProgressEvery, start: t0, last: t0, h: sha256.New()}
	n, err := r.fetch(ctx, oinfo, io.MultiWriter(f, pw))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, jetstream.ErrDigestMismatch) {
		return Result{}, &InvalidError{snap.Name, ErrCorrupt, "the object store's digest does not match its content"}
	}
	if err != nil {
		return Result{}, fmt.Errorf("download snapshot %s: %w", snap.Name, err)
	}
	if sum := hex.EncodeToString(pw.h.Sum(nil)); sum != snap.SHA256 || n != snap.Size {
		return Result{}, &InvalidError{snap.Name, ErrCorrupt,
			fmt.Sprintf("sha256 %s over %d bytes, but the snapshot was taken with sha256 %s over %d bytes", sum, n, snap.SHA256, snap.Size)}
	}
	took := time.Since(t0)
	r.log.Info("snapshot downloaded", "snapshot", snap.Name, "bytes", n, "took", took.Round(time.Millisecond),
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
	r.log.Info("snapshot restored; catching up from the change stream", "snapshot", snap.Name, "seq", st.StreamSeq,
		"watermark", st.Watermark, "stream_last_seq", info.State.LastSeq)
	return Result{Restored: true, Snapshot: snap, State: st, CatchUpSeq: info.State.LastSeq, Bytes: n}, nil
}

// fetchPull is how many 1 MiB chunks a download keeps in flight.
const fetchPull = 32

// fetch reads an object's chunks from the object store's stream with a pull
// consumer of its own, and hashes them once, in w. ObjectStore.Get pushes
// the chunks through an unbuffered pipe and hashes them again; its push
// consumer overflows (slow consumer, dropped chunks, a reset) whenever the
// disk is slower than the server, which held downloads near 100 MB/s.
func (r *Restorer) fetch(ctx context.Context, info *jetstream.ObjectInfo, w io.Writer) (int64, error) {
	if info.Size == 0 {
		return 0, nil
	}
	bucket := r.cfg.Shard.SnapshotBucket()
	oc, err := r.js.OrderedConsumer(ctx, "OBJ_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"$O." + bucket + ".C." + info.NUID},
	})
	if err != nil {
		return 0, fmt.Errorf("read chunks: %w", err)
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(fetchPull))
	if err != nil {
		return 0, fmt.Errorf("read chunks: %w", err)
	}
	defer it.Stop()
	var n int64
	for i := uint32(0); i < info.Chunks; i++ {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return n, fmt.Errorf("read chunk %d of %d: %w", i+1, info.Chunks, err)
		}
		m, err := w.Write(msg.Data())
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
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

// progress hashes what passes through it and reports bytes, rate and ETA.
type progress struct {
	log   *slog.Logger
	m     *metrics
	h     hash.Hash
	total int64
	n     int64
	every time.Duration
	start time.Time
	last  time.Time
}

func (p *progress) Write(b []byte) (int, error) {
	p.h.Write(b)
	p.n += int64(len(b))
	p.m.downloaded.Add(float64(len(b)))
	if now := time.Now(); now.Sub(p.last) >= p.every {
		p.last = now
		el := now.Sub(p.start).Seconds()
		rate := float64(p.n) / max(el, 1e-9)
		eta := time.Duration(float64(p.total-p.n) / max(rate, 1) * float64(time.Second))
		p.m.eta.Set(eta.Seconds())
		p.log.Info("restore progress", "bytes", p.n, "total", p.total,
			"mb_per_s", fmt.Sprintf("%.1f", rate/1e6), "eta", eta.Round(time.Second))
	}
	return len(b), nil
}
