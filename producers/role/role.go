// Package role is the producer role: which change-streamer may publish to a
// shard's change stream. The role is a lease under streams.KeyProducer in
// the shard's state bucket, written with revision checks and renewed by a
// heartbeat.
//
// As with zero-cache's replication owner, the newest change-streamer wins: a
// change-streamer that starts takes the role from whoever holds it, live or
// not, and the one that lost it sees so (it watches the key, and its next
// renewal fails on the revision) and stops. A rolling deploy therefore needs
// no coordination: start the new one, and the old one steps down. Between
// the takeover and the old holder noticing it, a publish of the old holder's
// may still land; the change stream's expected last sequence, which every
// publish carries, keeps the two from interleaving, and the new holder reads
// the stream's tail again when its publish fails on it.
package role

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/streams"
)

// Defaults of Config.
const (
	// DefaultTTL is how long the record says its holder is alive without a
	// renewal.
	DefaultTTL = 30 * time.Second
	// DefaultHeartbeat is how often the holder renews the record, and so
	// the longest it takes to notice a takeover if the watch misses it.
	DefaultHeartbeat = 5 * time.Second
)

// settleTime bounds how long Acquire waits for a new bucket to answer.
const settleTime = 10 * time.Second

func noResponders(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

func pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(50 * time.Millisecond):
		return nil
	}
}

// maxAttempts bounds the read-then-write rounds of a takeover that keeps
// losing races to other starters.
const maxAttempts = 10

// Config configures a Lease.
type Config struct {
	// TaskID names the holder in the record and the logs.
	TaskID string
	// TTL is how far ahead each renewal sets the record's Expires; zero
	// means DefaultTTL.
	TTL time.Duration
	// Heartbeat is the renewal interval; zero means DefaultHeartbeat. It
	// must be below TTL.
	Heartbeat time.Duration
	Logger    *slog.Logger
}

// Validate checks c, with defaults applied.
func (c Config) Validate() error {
	if c.TaskID == "" {
		return errors.New("role: task id is required")
	}
	c = c.withDefaults()
	if c.TTL <= 0 || c.Heartbeat <= 0 {
		return errors.New("role: ttl and heartbeat must be positive")
	}
	if c.Heartbeat >= c.TTL {
		return fmt.Errorf("role: heartbeat %s must be shorter than the ttl %s", c.Heartbeat, c.TTL)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// LostError reports that another change-streamer took the role.
type LostError struct {
	// By is the new holder's record.
	By streams.Producer
}

func (e *LostError) Error() string {
	return fmt.Sprintf("producer role taken over by task %s (instance %s)", e.By.TaskID, e.By.Instance)
}

// Lease is a held producer role. Run keeps it; Release gives it up.
type Lease struct {
	cfg  Config
	kv   jetstream.KeyValue
	log  *slog.Logger
	prev *streams.Producer
	lost atomic.Pointer[LostError]

	// mu guards rec and rev, which Run writes and Record reads.
	mu  sync.Mutex
	rec streams.Producer
	rev uint64
}

// Acquire takes the producer role in kv, the shard's state bucket, from
// whoever holds it.
func Acquire(ctx context.Context, kv jetstream.KeyValue, cfg Config) (*Lease, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("role: instance id: %w", err)
	}
	l := &Lease{
		cfg: cfg,
		kv:  kv,
		log: cfg.Logger.With(logkey.Component, "producer-role"),
		rec: streams.Producer{TaskID: cfg.TaskID, Instance: hex.EncodeToString(nonce[:]), Started: time.Now()},
	}
	settle := time.Now().Add(settleTime)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		prev, rev, err := l.take(ctx)
		if noResponders(err) && time.Now().Before(settle) {
			// A bucket just created on a cluster answers direct gets
			// and writes only once its replicas are up.
			attempt--
			if err := pause(ctx); err != nil {
				return nil, err
			}
			continue
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // another starter wrote first: take it from that one
		}
		if err != nil {
			return nil, err
		}
		l.rev, l.prev = rev, prev
		l.logTaken(prev)
		return l, nil
	}
	return nil, fmt.Errorf("role: take %s: lost %d races to other change-streamers", streams.KeyProducer, maxAttempts)
}

// take reads the record and writes the lease's over it, revision-checked.
func (l *Lease) take(ctx context.Context) (*streams.Producer, uint64, error) {
	prev, rev, err := read(ctx, l.kv)
	if err != nil {
		return nil, 0, err
	}
	l.rec.Expires = time.Now().Add(l.cfg.TTL)
	b, _ := json.Marshal(l.rec)
	if rev == 0 {
		rev, err = l.kv.Create(ctx, streams.KeyProducer, b)
	} else {
		rev, err = l.kv.Update(ctx, streams.KeyProducer, b, rev)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("role: take %s: %w", streams.KeyProducer, err)
	}
	return prev, rev, nil
}

func (l *Lease) logTaken(prev *streams.Producer) {
	switch {
	case prev == nil:
		l.log.Info("took the producer role", logkey.Instance, l.rec.Instance)
	case prev.Expires.After(time.Now()):
		l.log.Info("took the producer role over from a live change-streamer; it will stop",
			logkey.Instance, l.rec.Instance, "previous_task_id", prev.TaskID, "previous_instance", prev.Instance)
	default:
		l.log.Info("took the producer role over from a stale holder",
			logkey.Instance, l.rec.Instance, "previous_task_id", prev.TaskID, "previous_expired", prev.Expires)
	}
}

// read returns the current record and its revision; revision 0 when there
// is none (never written, or deleted). An unreadable record counts as one
// held by nobody known.
func read(ctx context.Context, kv jetstream.KeyValue) (*streams.Producer, uint64, error) {
	e, err := kv.Get(ctx, streams.KeyProducer)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("role: read %s: %w", streams.KeyProducer, err)
	}
	if e.Operation() != jetstream.KeyValuePut {
		return nil, 0, nil
	}
	var p streams.Producer
	if json.Unmarshal(e.Value(), &p) != nil {
		return &streams.Producer{}, e.Revision(), nil
	}
	return &p, e.Revision(), nil
}

// Record is the holder's record as last written.
func (l *Lease) Record() streams.Producer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec
}

func (l *Lease) set(rec streams.Producer, rev uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rec, l.rev = rec, rev
}

// Previous is the record this lease replaced, if any.
func (l *Lease) Previous() (streams.Producer, bool) {
	if l.prev == nil {
		return streams.Producer{}, false
	}
	return *l.prev, true
}

// Check returns the *LostError once the role is known to be lost, else nil.
// It reads no state from the server, so it can fence every publish batch;
// the stream's expected last sequence fences the rest.
func (l *Lease) Check() error {
	if e := l.lost.Load(); e != nil {
		return e
	}
	return nil
}

// Run keeps the role: it renews the record every heartbeat and watches the
// key. It returns a *LostError as soon as another change-streamer holds the
// role, and nil when ctx ends; nothing else ends it. A renewal or watch that
// fails for another reason (a NATS outage) is retried at the next heartbeat:
// a record that expires meanwhile is still this holder's until someone takes
// it.
func (l *Lease) Run(ctx context.Context) error {
	var w jetstream.KeyWatcher
	defer func() {
		if w != nil {
			w.Stop()
		}
	}()
	var updates <-chan jetstream.KeyValueEntry
	t := time.NewTicker(l.cfg.Heartbeat)
	defer t.Stop()
	for {
		if w == nil {
			// Watch before renewing, so that a takeover between the
			// renewal and the watch's start is not missed.
			var err error
			if w, err = l.kv.Watch(ctx, streams.KeyProducer, jetstream.UpdatesOnly()); err != nil {
				w = nil
				if ctx.Err() == nil {
					l.log.Warn("could not watch the producer role; retrying", "in", l.cfg.Heartbeat, "err", err)
				}
			} else {
				updates = w.Updates()
			}
		}
		err := l.renew(ctx)
		var lost *LostError
		switch {
		case errors.As(err, &lost):
			return l.lose(lost)
		case err != nil && ctx.Err() == nil:
			l.log.Warn("could not renew the producer role; retrying", "in", l.cfg.Heartbeat, "err", err)
		}
		if lost := l.await(ctx, t.C, updates); lost != nil {
			return l.lose(lost)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// await returns at the next heartbeat, when ctx ends, or with the new
// holder when the watch shows one. A watch that ends early is left to the
// renewals.
func (l *Lease) await(ctx context.Context, tick <-chan time.Time, updates <-chan jetstream.KeyValueEntry) *LostError {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			return nil
		case e, ok := <-updates:
			switch {
			case !ok:
				updates = nil
			case e == nil:
			case e.Operation() != jetstream.KeyValuePut:
				return nil // deleted: the renewal writes it back unless someone else does
			default:
				var p streams.Producer
				if json.Unmarshal(e.Value(), &p) == nil && p.Instance == l.rec.Instance {
					continue
				}
				return &LostError{By: p}
			}
		}
	}
}

func (l *Lease) lose(e *LostError) error {
	l.lost.Store(e)
	l.log.Info("lost the producer role: another change-streamer took over",
		"by_task_id", e.By.TaskID, "by_instance", e.By.Instance, "by_started", e.By.Started)
	return e
}

// renew moves the record's expiry on, revision-checked. It returns a
// *LostError when the record is another holder's.
func (l *Lease) renew(ctx context.Context) error {
	next := l.rec
	next.Beat++
	next.Expires = time.Now().Add(l.cfg.TTL)
	b, _ := json.Marshal(next)
	rev, err := l.kv.Update(ctx, streams.KeyProducer, b, l.rev)
	if err == nil {
		l.set(next, rev)
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("role: renew: %w", err)
	}
	cur, rev, err := read(ctx, l.kv)
	if err != nil {
		return err
	}
	switch {
	case cur == nil:
		// Deleted by hand: take it back unless someone else does first.
		rev, err := l.kv.Create(ctx, streams.KeyProducer, b)
		if errors.Is(err, jetstream.ErrKeyExists) {
			cur, _, err := read(ctx, l.kv)
			if err != nil {
				return err
			}
			if cur == nil {
				return errors.New("role: renew: the record keeps changing")
			}
			return &LostError{By: *cur}
		}
		if err != nil {
			return fmt.Errorf("role: renew: %w", err)
		}
		l.set(next, rev)
		return nil
	case cur.Instance == l.rec.Instance:
		// A renewal whose reply was lost did land.
		l.set(*cur, rev)
		return nil
	default:
		return &LostError{By: *cur}
	}
}

// Release gives the role up, if this lease still holds it, so that the
// next change-streamer finds no live holder. Call it after Run returns.
func (l *Lease) Release(ctx context.Context) error {
	if l.lost.Load() != nil {
		return nil
	}
	err := l.kv.Delete(ctx, streams.KeyProducer, jetstream.LastRevision(l.rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil // someone else holds it now
	}
	if err != nil {
		return fmt.Errorf("role: release: %w", err)
	}
	l.log.Info("released the producer role")
	return nil
}
