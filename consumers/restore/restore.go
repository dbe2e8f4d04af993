// Package restore gives a cold replica its starting point: it reserves the
// change stream's history against purges, waits for a restorable snapshot,
// downloads and validates it, and puts it in place, so that the replica
// consumer catches up from the snapshot's stream sequence.
package restore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// Defaults, zero-cache's where it has them.
const (
	// DefaultPollInterval is how often a restorer with no usable snapshot
	// looks again (zero-cache retries a missing backup every 3 s).
	DefaultPollInterval = 3 * time.Second
	// DefaultHeartbeat is how often a reservation is refreshed.
	DefaultHeartbeat = 30 * time.Second
	// DefaultReservationTTL is how long a reservation lives without one.
	DefaultReservationTTL = streams.DefaultReservationTTL
	// DefaultProgressEvery is how often a download logs its progress.
	DefaultProgressEvery = 5 * time.Second
)

// Config configures a Restorer.
type Config struct {
	// File is the replica's path; the download goes to File+".restore".
	File   string
	Shard  streams.Shard
	TaskID string
	// IntegrityCheck runs PRAGMA integrity_check instead of quick_check.
	IntegrityCheck bool
	// PurgeLock makes this a producer's restore: it takes the
	// purge lock instead of a reservation, and fails with ErrNoSnapshot
	// instead of waiting when there is no snapshot and the stream no
	// longer holds the history since the initial sync.
	PurgeLock bool
	// BuildFromStream lets a restorer that finds no usable snapshot build
	// the replica from the stream instead of waiting, as long as the stream
	// still holds the history since the initial sync (or none was made
	// yet). The reservation is held until the replica has caught up, so
	// that history is not purged under the build.
	BuildFromStream bool
	PollInterval    time.Duration
	Heartbeat       time.Duration
	ReservationTTL  time.Duration
	ProgressEvery   time.Duration
	// Now is the clock; nil means time.Now.
	Now        func() time.Time
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.Heartbeat = cmp.Or(c.Heartbeat, DefaultHeartbeat)
	c.ReservationTTL = cmp.Or(c.ReservationTTL, DefaultReservationTTL)
	c.ProgressEvery = cmp.Or(c.ProgressEvery, DefaultProgressEvery)
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	if c.File == "" {
		return errors.New("replica file is required")
	}
	if c.TaskID == "" {
		return errors.New("task id is required")
	}
	if err := c.Shard.Validate(); err != nil {
		return err
	}
	if c.PollInterval <= 0 || c.Heartbeat <= 0 || c.ProgressEvery <= 0 {
		return errors.New("intervals must be positive")
	}
	if c.ReservationTTL < 2*c.Heartbeat || c.ReservationTTL < time.Second {
		return errors.New("the reservation TTL must be at least twice the heartbeat and at least 1s")
	}
	return nil
}

// Reasons a snapshot or local replica is rejected. They are wrapped in an
// *InvalidError.
var (
	ErrCorrupt             = errors.New("corrupt")
	ErrWrongReplicaVersion = errors.New("WrongReplicaVersion")
	ErrWatermarkTooOld     = errors.New("WatermarkTooOld")
)

// ErrNoSnapshot is a producer's restore finding no snapshot while the stream
// no longer holds the history since the initial sync: only a new initial
// sync can build the replica.
var ErrNoSnapshot = errors.New("no snapshot exists and the change stream no longer holds the history since the initial sync")

// InvalidError rejects a snapshot (or a local replica, Snapshot "").
type InvalidError struct {
	Snapshot string
	Err      error // ErrCorrupt, ErrWrongReplicaVersion or ErrWatermarkTooOld
	Detail   string
}

func (e *InvalidError) Error() string {
	what := "local replica"
	if e.Snapshot != "" {
		what = "snapshot " + e.Snapshot
	}
	return fmt.Sprintf("%s rejected: %v: %s", what, e.Err, e.Detail)
}

func (e *InvalidError) Unwrap() error { return e.Err }

// Result says what Restore did.
type Result struct {
	// Restored is set when a snapshot was downloaded into place.
	Restored bool
	// Kept is set when a valid local replica was kept.
	Kept bool
	// Snapshot is the snapshot restored.
	Snapshot streams.Snapshot
	// State is the replica's state as restored or kept; the zero State
	// when the replica is to be built from the stream.
	State replica.State
	// CatchUpSeq is the stream's last sequence when Restore returned:
	// the replica has caught up once it has applied it.
	CatchUpSeq uint64
	Bytes      int64
}

// Restorer restores one replica.
type Restorer struct {
	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	metrics *metrics
}

// New returns a Restorer.
func New(cfg Config, js jetstream.JetStream) (*Restorer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Restorer{cfg: cfg, js: js, log: cfg.Logger.With(logkey.Component, "restore", "file", cfg.File), metrics: m}, nil
}

// Restore makes cfg.File a replica the consumer can catch up from: a valid
// local replica whose history the stream still holds is kept; otherwise the
// newest verified snapshot is downloaded, validated and renamed into place.
// It waits, holding its reservation, for as long as no usable snapshot
// exists. The returned Hold keeps the reservation until End.
func (r *Restorer) Restore(ctx context.Context) (*Hold, error) {
	t0 := time.Now()
	res, err := streams.EnsureBackup(ctx, r.js, streams.Config{Shard: r.cfg.Shard})
	if err != nil {
		return nil, err
	}
	h, err := r.hold(ctx, res)
	if err != nil {
		return nil, err
	}
	result, err := r.restore(ctx, res)
	if err != nil {
		h.release(context.WithoutCancel(ctx), false)
		r.metrics.runs.WithLabelValues(resultLabel(err)).Inc()
		return nil, err
	}
	h.result = result
	r.metrics.runs.WithLabelValues("success").Inc()
	r.metrics.duration.Observe(time.Since(t0).Seconds())
	return h, nil
}

func resultLabel(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, ErrNoSnapshot):
		return "no_backup"
	default:
		return "error"
	}
}

// restore loops until the replica is usable. A snapshot rejected as invalid
// is remembered and skipped; a transient error is retried once per streak.
func (r *Restorer) restore(ctx context.Context, res streams.Backup) (Result, error) {
	removeTemp(r.cfg.File)
	defer removeTemp(r.cfg.File)
	rejected := map[string]bool{}
	waitLogged := ""
	streak := 0
	for {
		err := func() error {
			up, stream, info, err := r.position(ctx)
			if err != nil {
				return err
			}
			if up != nil && info != nil {
				if st, ok := r.checkLocal(ctx, *up, info); ok {
					r.log.Info("keeping the local replica: the stream still covers it", logkey.Seq, st.StreamSeq, logkey.Watermark, st.Watermark)
					return &done{Result{Kept: true, State: st, CatchUpSeq: info.State.LastSeq}}
				}
			}
			snap, ok, err := streams.ReadSnapshot(ctx, res.State, streams.KeyBackupVerified)
			if err != nil {
				return err
			}
			usable := ok && !rejected[snap.Name] && up != nil
			if usable && snap.ReplicaVersion != up.ReplicaVersion {
				rejected[snap.Name] = true
				r.metrics.attempts.WithLabelValues("invalid_replica").Inc()
				r.log.Error("not restoring the snapshot", "err", &InvalidError{snap.Name, ErrWrongReplicaVersion,
					fmt.Sprintf("it has replica version %s; the stream's is %s", snap.ReplicaVersion, up.ReplicaVersion)})
				usable = false
			}
			if !usable {
				if r.cfg.PurgeLock {
					return r.noSnapshot(up, info)
				}
				if r.cfg.BuildFromStream && fromStream(up, info) {
					var last uint64
					if info != nil {
						last = info.State.LastSeq
					}
					r.log.Info("no restorable snapshot; the replica is built from the change stream, which holds the history since the initial sync",
						"catch_up_seq", last)
					return &done{Result{CatchUpSeq: last}}
				}
				msg := "no restorable snapshot yet; holding the reservation open until one lands"
				if ok && rejected[snap.Name] {
					msg = "the newest snapshot was rejected; holding the reservation open until a new one lands"
				}
				if waitLogged != msg {
					r.log.Info(msg, logkey.TaskID, r.cfg.TaskID, "bucket", r.cfg.Shard.SnapshotBucket())
					waitLogged = msg
				}
				r.metrics.attempts.WithLabelValues("no_backup").Inc()
				return errWait
			}
			result, err := r.download(ctx, res, stream, *up, snap)
			if err != nil {
				var ie *InvalidError
				if errors.As(err, &ie) {
					rejected[snap.Name] = true
					r.metrics.attempts.WithLabelValues("invalid_replica").Inc()
					r.log.Error("snapshot rejected and deleted locally; waiting for another", logkey.Snapshot, snap.Name, "err", err)
					return errWait
				}
				return err
			}
			r.metrics.attempts.WithLabelValues("success").Inc()
			return &done{result}
		}()
		var d *done
		switch {
		case errors.As(err, &d):
			return d.r, nil
		case errors.Is(err, errWait):
			streak = 0
		case ctx.Err() != nil:
			return Result{}, ctx.Err()
		case errors.Is(err, ErrNoSnapshot):
			return Result{}, err
		case !r.js.Conn().IsConnected():
			// A NATS outage is not the restore's error: wait it out.
			r.log.Warn("restore interrupted: NATS is disconnected; waiting for it", "err", err)
			if err := waitConnected(ctx, r.js.Conn()); err != nil {
				return Result{}, err
			}
			continue
		default:
			streak++
			r.metrics.attempts.WithLabelValues("error").Inc()
			if streak > 1 {
				return Result{}, fmt.Errorf("restore: %w", err)
			}
			r.log.Warn("restore failed; retrying once", "err", err)
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(r.cfg.PollInterval):
		}
	}
}

var errWait = errors.New("wait")

// waitConnected waits until nc is connected again.
func waitConnected(ctx context.Context, nc *nats.Conn) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !nc.IsConnected() {
		if nc.IsClosed() {
			return errors.New("the NATS connection is closed")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

type done struct{ r Result }

func (*done) Error() string { return "done" }

// noSnapshot decides a producer's restore without a snapshot: the replica
// can be built from the stream if it still holds the initial sync.
func (r *Restorer) noSnapshot(up *streams.Upstream, info *jetstream.StreamInfo) error {
	if up == nil || info == nil || up.ResetSeq == 0 || up.ResetSeq >= info.State.FirstSeq {
		removeReplica(r.cfg.File)
		r.log.Info("no snapshot to restore; the replica is built from the change stream")
		var last uint64
		if info != nil {
			last = info.State.LastSeq
		}
		return &done{Result{CatchUpSeq: last}}
	}
	return ErrNoSnapshot
}

// fromStream reports whether a replica can be built from the stream: it
// holds the initial sync the upstream record names, or no initial sync was
// recorded yet (the consumer then waits for it).
func fromStream(up *streams.Upstream, info *jetstream.StreamInfo) bool {
	if up == nil || info == nil || up.ResetSeq == 0 {
		return true
	}
	return up.ResetSeq >= info.State.FirstSeq && up.ResetSeq <= info.State.LastSeq
}

// position reads the upstream record and the stream; either is nil while
// the producer has not created it.
func (r *Restorer) position(ctx context.Context) (*streams.Upstream, jetstream.Stream, *jetstream.StreamInfo, error) {
	var up *streams.Upstream
	kv, err := r.js.KeyValue(ctx, r.cfg.Shard.StateBucket())
	switch {
	case err == nil:
		e, err := kv.Get(ctx, streams.KeyUpstream)
		if err == nil {
			up = &streams.Upstream{}
			if err := json.Unmarshal(e.Value(), up); err != nil {
				return nil, nil, nil, fmt.Errorf("read %s: %w", streams.KeyUpstream, err)
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, nil, nil, fmt.Errorf("read %s: %w", streams.KeyUpstream, err)
		}
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, nil, nil, fmt.Errorf("state bucket: %w", err)
	}
	stream, err := r.js.Stream(ctx, r.cfg.Shard.ChangesStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return up, nil, nil, nil
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("stream: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("stream info: %w", err)
	}
	return up, stream, info, nil
}

// covered reports whether the stream holds every message after seq.
func covered(info *jetstream.StreamInfo, seq uint64) error {
	first, last := info.State.FirstSeq, info.State.LastSeq
	switch {
	case last < seq:
		return fmt.Errorf("the stream ends at seq %d, before the replica's %d: it was recreated", last, seq)
	case first > seq+1:
		return fmt.Errorf("the stream starts at seq %d, after the replica's next %d: history was purged", first, seq+1)
	}
	return nil
}

// Hold is a reservation (or the purge lock) held for a restore, refreshed by
// heartbeat until End.
type Hold struct {
	r      *Restorer
	res    streams.Backup
	key    string
	start  time.Time
	result Result

	stop func()
	wg   sync.WaitGroup
	once sync.Once
}

// Result is what the restore did.
func (h *Hold) Result() Result { return h.result }

func (r *Restorer) hold(ctx context.Context, res streams.Backup) (*Hold, error) {
	h := &Hold{r: r, res: res, start: r.cfg.Now()}
	bucket := r.cfg.Shard.ReservationBucket()
	var value func(beat uint64) []byte
	if r.cfg.PurgeLock {
		h.key = streams.KeyPurgeLock
		value = func(beat uint64) []byte {
			b, _ := json.Marshal(streams.PurgeLock{Holder: r.cfg.TaskID, Since: h.start, Beat: beat})
			return b
		}
		logged := false
		for {
			_, err := res.Reservations.Create(ctx, h.key, value(0), jetstream.KeyTTL(r.cfg.ReservationTTL))
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrKeyExists) {
				return nil, fmt.Errorf("take the purge lock: %w", err)
			}
			// A lock this task left when it crashed is taken over at once,
			// revision-checked, rather than waited out.
			if ok, err := r.takeOver(ctx, res, h.key, value(0)); err != nil {
				return nil, err
			} else if ok {
				break
			}
			if !logged {
				r.log.Info("waiting for another holder's purge lock")
				logged = true
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(r.cfg.PollInterval):
			}
		}
	} else {
		h.key = streams.KeyReservation(r.cfg.TaskID)
		value = func(beat uint64) []byte {
			b, _ := json.Marshal(streams.Reservation{TaskID: r.cfg.TaskID, Start: h.start, Beat: beat})
			return b
		}
		// A Put replaces an earlier reservation of the same task.
		if _, err := streams.PutWithTTL(ctx, r.js, bucket, h.key, value(0), r.cfg.ReservationTTL); err != nil {
			return nil, fmt.Errorf("reserve: %w", err)
		}
	}
	r.log.Info("reserved the change stream's history", "key", h.key, "ttl", r.cfg.ReservationTTL)
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.stop = cancel
	h.wg.Go(func() {
		t := time.NewTicker(r.cfg.Heartbeat)
		defer t.Stop()
		for beat := uint64(1); ; beat++ {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
			if _, err := streams.PutWithTTL(hctx, r.js, bucket, h.key, value(beat), r.cfg.ReservationTTL); err != nil && hctx.Err() == nil {
				r.log.Warn("reservation heartbeat failed", "key", h.key, "err", err)
			}
		}
	})
	return h, nil
}

// takeOver replaces the purge lock if this task holds it, with a write
// conditional on the revision read, so that another holder's lock taken
// meanwhile is never overwritten.
func (r *Restorer) takeOver(ctx context.Context, res streams.Backup, key string, value []byte) (bool, error) {
	e, err := res.Reservations.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the purge lock: %w", err)
	}
	var l streams.PurgeLock
	if json.Unmarshal(e.Value(), &l) != nil || l.Holder != r.cfg.TaskID {
		return false, nil
	}
	_, err = r.js.Publish(ctx, "$KV."+r.cfg.Shard.ReservationBucket()+"."+key, value,
		jetstream.WithExpectLastSequencePerSubject(e.Revision()), jetstream.WithMsgTTL(r.cfg.ReservationTTL))
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			return false, nil
		}
		return false, fmt.Errorf("take over the purge lock: %w", err)
	}
	r.log.Info("took over the purge lock this task held before a restart")
	return true, nil
}

// End ends the reservation: the producer learns how long the restore took,
// which raises its cleanup delay, and purges may resume.
func (h *Hold) End(ctx context.Context) error {
	return h.release(ctx, true)
}

// Abandon stops the heartbeat and leaves the reservation to expire, as a
// crashed restorer's would.
func (h *Hold) Abandon() {
	h.once.Do(func() {
		h.stop()
		h.wg.Wait()
	})
}

func (h *Hold) release(ctx context.Context, ended bool) error {
	var err error
	h.once.Do(func() {
		h.stop()
		h.wg.Wait()
		r := h.r
		if h.key == streams.KeyPurgeLock {
			if err = h.res.Reservations.Delete(ctx, h.key); err != nil {
				err = fmt.Errorf("release the purge lock: %w", err)
			}
			return
		}
		d := r.cfg.Now().Sub(h.start)
		b, _ := json.Marshal(streams.Reservation{TaskID: r.cfg.TaskID, Start: h.start, Ended: ended, Duration: d})
		// The ended record lives long enough for the monitor to read it.
		if _, err = streams.PutWithTTL(ctx, r.js, r.cfg.Shard.ReservationBucket(), h.key, b, r.cfg.ReservationTTL); err != nil {
			return
		}
		if ended {
			r.metrics.reservation.Observe(d.Seconds())
			r.log.Info("reservation ended", "held", d.Round(time.Millisecond))
		}
	})
	return err
}

// Follower is the replica consumer, as far as EndWhenCaughtUp needs it.
type Follower interface {
	State() replica.State
}

// EndWhenCaughtUp waits until f has applied the stream as it stood when the
// restore finished, then ends the reservation. Meanwhile it reports the
// catch-up's progress in stream messages (a transaction is one message, or
// one per table and fragment).
func (h *Hold) EndWhenCaughtUp(ctx context.Context, f Follower) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	m := h.r.metrics
	// The consumer may not have opened the replica yet: count from the
	// restored (or kept) state.
	from, target := max(f.State().StreamSeq, h.result.State.StreamSeq), h.result.CatchUpSeq
	t0 := time.Now()
	last := t0
	for seq := from; seq < target; seq = f.State().StreamSeq {
		left := target - seq
		m.catchUpLeft.Set(float64(left))
		if now := time.Now(); now.Sub(last) >= h.r.cfg.ProgressEvery {
			last = now
			rate, eta := rateETA(float64(seq-from), float64(left), now.Sub(t0))
			m.catchUpETA.Set(eta.Seconds())
			h.r.log.Info("catch-up progress", logkey.Seq, seq, "target", target, "messages_left", left,
				"msgs_per_s", fmt.Sprintf("%.0f", rate), "eta", eta.Round(time.Second))
		}
		select {
		case <-ctx.Done():
			h.Abandon()
			return nil
		case <-t.C:
		}
	}
	m.catchUpLeft.Set(0)
	m.catchUpETA.Set(0)
	seq := f.State().StreamSeq
	took := time.Since(t0)
	h.r.log.Info("caught up after the restore", logkey.Seq, seq, "messages", seq-min(from, seq), "took", took.Round(time.Millisecond))
	return h.End(ctx)
}

func tempFile(file string) string { return file + ".restore" }

// removeTemp deletes a download's leftovers.
func removeTemp(file string) {
	for _, s := range []string{"", "-wal", "-shm", "-journal"} {
		os.Remove(tempFile(file) + s)
	}
}

// removeReplica deletes a replica with its WAL, so that a stale WAL can
// never be applied to another database.
func removeReplica(file string) {
	for _, s := range []string{"-wal", "-shm", "-journal", ""} {
		os.Remove(file + s)
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
