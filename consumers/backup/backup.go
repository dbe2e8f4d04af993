// Package backup is the writing side of jetsync's backups (its Producer
// produces snapshots; consumers/restore reads them): it snapshots the
// change-streamer's backup replica into a JetStream object store,
// periodically and on request, and runs the backup monitor, which purges
// the change stream only below what every snapshot restorer, connected
// replica and protected consumer may still need. It sits among the
// consumers because what it reads is a replica, the product of
// projections/replica, not an upstream (ARCHITECTURE.md).
package backup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/streams"
)

// Defaults. Where zero-cache has the parameter, the value is its.
const (
	// DefaultInterval is how often a new snapshot is taken when the replica
	// has moved (zero-cache's incremental backup interval).
	DefaultInterval = 15 * time.Minute
	// DefaultKeep is how many snapshots are kept in the object store.
	DefaultKeep = 3
	// DefaultCheckInterval is how often the backup monitor runs.
	DefaultCheckInterval = 60 * time.Second
	// DefaultCleanupDelay is the least age of a verified snapshot before
	// history below it may be purged; observed restore times raise it.
	DefaultCleanupDelay = 30 * time.Second
	// DefaultPurgeWait is the wait between scheduling a purge and running
	// it: three times the 10 s maximum reconnect backoff, so that lagging
	// replicas reconnect and report their position first.
	DefaultPurgeWait = 30 * time.Second
	// DefaultWedgedGrace is how long the verified backup may stay behind
	// the claimed one before the producer gives up.
	DefaultWedgedGrace = 15 * time.Minute
	// DefaultInitialGracePerUnit is the initial-backup grace per
	// InitialGraceUnit of replica, and its minimum.
	DefaultInitialGracePerUnit = time.Hour
	// InitialGraceUnit is the replica size each DefaultInitialGracePerUnit
	// of grace covers.
	InitialGraceUnit = 50 << 30
	// DefaultProtectMaxLag is how far behind a protected consumer may fall
	// before it loses its protection.
	DefaultProtectMaxLag = 24 * time.Hour
	// DefaultOrphanGrace is how old the newest chunk of an upload no
	// object names must be before a starting producer purges it.
	DefaultOrphanGrace = 10 * time.Minute
	// DefaultReservationTTL is how long a reservation or purge lock counts
	// as live after its last heartbeat.
	DefaultReservationTTL = streams.DefaultReservationTTL
	// NewestTxWalk bounds how far back the monitor reads to find where the
	// newest transaction starts; past it, it does not purge.
	NewestTxWalk = 4096
)

// Config configures a Producer.
type Config struct {
	// File is the backup replica the snapshots are taken from.
	File   string
	Shard  streams.Shard
	TaskID string
	// Replicas is the JetStream replica count of the buckets.
	Replicas int
	// Off turns snapshots off (JETSYNC_BACKUP=off): the monitor then purges
	// to what every connected replica consumer has acked, and the fatal
	// rules do not apply.
	Off      bool
	Interval time.Duration
	// UploadRate caps snapshot uploads, in bytes a second; 0 means none.
	UploadRate    int64
	Keep          int
	CheckInterval time.Duration
	CleanupDelay  time.Duration
	// PurgeWait is the wait between scheduling a purge and running it;
	// zero means DefaultPurgeWait, negative none.
	PurgeWait   time.Duration
	WedgedGrace time.Duration
	// InitialGrace, if set, replaces the size-scaled initial-backup grace.
	InitialGrace        time.Duration
	InitialGracePerUnit time.Duration
	ProtectMaxLag       time.Duration
	ReservationTTL      time.Duration
	// OrphanGrace is how old the chunks of an unfinished upload must be
	// before a starting producer purges them.
	OrphanGrace time.Duration
	// Now is the clock; nil means time.Now. Tests inject a fake one.
	Now        func() time.Time
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.CheckInterval = cmp.Or(c.CheckInterval, DefaultCheckInterval)
	c.CleanupDelay = cmp.Or(c.CleanupDelay, DefaultCleanupDelay)
	c.PurgeWait = cmp.Or(c.PurgeWait, DefaultPurgeWait)
	c.WedgedGrace = cmp.Or(c.WedgedGrace, DefaultWedgedGrace)
	c.InitialGracePerUnit = cmp.Or(c.InitialGracePerUnit, DefaultInitialGracePerUnit)
	c.ProtectMaxLag = cmp.Or(c.ProtectMaxLag, DefaultProtectMaxLag)
	c.ReservationTTL = cmp.Or(c.ReservationTTL, DefaultReservationTTL)
	c.OrphanGrace = cmp.Or(c.OrphanGrace, DefaultOrphanGrace)
	c.Keep = cmp.Or(c.Keep, DefaultKeep)
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	if c.File == "" {
		return errors.New("backup replica file is required")
	}
	if c.TaskID == "" {
		return errors.New("task id is required")
	}
	if err := c.Shard.Validate(); err != nil {
		return err
	}
	if c.Keep < 1 {
		return errors.New("keep must be at least 1")
	}
	for _, d := range []time.Duration{c.Interval, c.CheckInterval, c.CleanupDelay, c.WedgedGrace, c.InitialGracePerUnit, c.ProtectMaxLag, c.ReservationTTL, c.OrphanGrace} {
		if d <= 0 {
			return errors.New("intervals and graces must be positive")
		}
	}
	if c.InitialGrace < 0 || c.UploadRate < 0 {
		return errors.New("initial grace and upload rate must not be negative")
	}
	return nil
}

// ErrBackupBroken is wrapped by every FatalError.
var ErrBackupBroken = errors.New("backup pipeline broken")

// FatalError is what Run returns when the backup pipeline is broken beyond
// waiting: the process should exit non-zero so that the producer, which owns
// the pipeline, is flagged rather than the restorers waiting on it.
type FatalError struct {
	// Reason is "backup-wedged" or "initial-backup-grace".
	Reason string
	Msg    string
}

func (e *FatalError) Error() string { return e.Msg }
func (e *FatalError) Unwrap() error { return ErrBackupBroken }

// Fatal reasons.
const (
	ReasonWedged       = "backup-wedged"
	ReasonInitialGrace = "initial-backup-grace"
)

// Producer takes snapshots and runs the backup monitor.
type Producer struct {
	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	metrics *metrics
	res     streams.Backup

	// Owned by Run (or whoever calls Snapshot and Check, one at a time).
	started      time.Time
	last         *streams.Snapshot // newest snapshot this process uploaded
	lastAt       time.Time
	verified     map[string]streams.Snapshot // objects whose digest was checked
	bad          map[string]bool             // objects that failed it
	newest       *streams.Snapshot           // newest verified
	confirmed    bool                        // a restorable snapshot was seen
	staleSince   time.Time
	wedgedCount  bool
	cleanupDelay time.Duration
	seen         map[string]keySeen // reservation bucket keys
	noProtect    map[string]bool    // protected consumers that lost protection
	// A scheduled purge: below pending, once PurgeWait has passed since
	// pendingAt.
	pending   uint64
	pendingAt time.Time
}

// keySeen is when the monitor, by its own clock, last saw a key change:
// liveness never compares clocks across machines.
type keySeen struct {
	rev    uint64
	at     time.Time
	ended  bool
	handed bool // its duration was counted
}

// New returns a Producer; Run starts it.
func New(cfg Config, js jetstream.JetStream) (*Producer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Producer{
		cfg:          cfg,
		js:           js,
		log:          cfg.Logger.With(logkey.Component, "backup", logkey.Stream, cfg.Shard.ChangesStream()),
		metrics:      m,
		verified:     map[string]streams.Snapshot{},
		bad:          map[string]bool{},
		seen:         map[string]keySeen{},
		noProtect:    map[string]bool{},
		cleanupDelay: cfg.CleanupDelay,
	}, nil
}

// ensure creates the backup resources once.
func (p *Producer) ensure(ctx context.Context) error {
	if p.res.State != nil {
		return nil
	}
	res, err := streams.EnsureBackup(ctx, p.js, streams.Config{Shard: p.cfg.Shard, Replicas: p.cfg.Replicas})
	if err != nil {
		return err
	}
	p.res = res
	return nil
}

func (p *Producer) start() {
	if p.started.IsZero() {
		p.started = p.cfg.Now()
		p.metrics.cleanupDelay.Set(p.cleanupDelay.Seconds())
	}
}

// Run snapshots and monitors until ctx ends (nil) or the backup pipeline is
// found broken (a *FatalError).
func (p *Producer) Run(ctx context.Context) error {
	p.start()
	if err := p.ensure(ctx); err != nil {
		return err
	}
	removeStaleSnapshots(p.cfg.File, p.log)
	if _, err := p.removeOrphanChunks(ctx); err != nil && ctx.Err() == nil {
		p.log.Warn("could not remove the chunks of unfinished uploads", "err", err)
	}
	reqs := make(chan *nats.Msg, 8)
	sub, err := p.js.Conn().ChanQueueSubscribe(p.cfg.Shard.BackupNowSubject(), "jetsync-backup", reqs)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", p.cfg.Shard.BackupNowSubject(), err)
	}
	defer sub.Unsubscribe()
	if p.cfg.Off {
		p.log.Info("backups are off: purging to what connected replicas have acked")
	} else {
		p.log.Info("backup producer starting", "replica", p.cfg.File, "interval", p.cfg.Interval,
			"initial_grace", p.initialGrace(), "wedged_grace", p.cfg.WedgedGrace)
	}
	poll := min(p.cfg.CheckInterval, p.cfg.Interval, 5*time.Second)
	pollT := time.NewTicker(poll)
	defer pollT.Stop()
	checkT := time.NewTicker(p.cfg.CheckInterval)
	defer checkT.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-reqs:
			p.answer(ctx, m)
		case <-pollT.C:
			if p.cfg.Off || !p.due() {
				continue
			}
			s, err := p.Snapshot(ctx, false)
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, ErrNoReplica) {
					p.log.Warn("snapshot failed; will retry", "err", err)
				}
				continue
			}
			// Verifying at once lets a restorer waiting for its first
			// snapshot use it without waiting for the next check.
			if p.newest == nil || p.newest.Name != s.Name {
				if err := p.verify(ctx); err != nil && ctx.Err() == nil {
					p.log.Warn("verify snapshots", "err", err)
				}
			}
		case <-checkT.C:
			if err := p.Check(ctx); err != nil {
				var fe *FatalError
				if errors.As(err, &fe) {
					p.log.Error(fe.Msg, "reason", fe.Reason)
					return err
				}
				if ctx.Err() != nil {
					return nil
				}
				p.log.Warn("backup check failed", "err", err)
			}
		}
	}
}

// due reports whether a snapshot should be taken: the interval has passed
// since the last one, or none of the current replica exists yet.
func (p *Producer) due() bool {
	if p.last == nil {
		return true
	}
	return !p.cfg.Now().Before(p.lastAt.Add(p.cfg.Interval))
}

// answer serves a `jetsync backup now` request.
func (p *Producer) answer(ctx context.Context, m *nats.Msg) {
	var reply streams.BackupNowReply
	if p.cfg.Off {
		reply.Error = "backups are off (JETSYNC_BACKUP=off)"
	} else if s, err := p.Snapshot(ctx, true); err != nil {
		reply.Error = err.Error()
	} else {
		reply.Snapshot = &s
	}
	if reply.Error != "" {
		p.log.Warn("backup now failed", "err", reply.Error)
	} else {
		p.log.Info("backup now", logkey.Snapshot, reply.Snapshot.Name)
	}
	if err := m.Respond(mustJSON(reply)); err != nil {
		p.log.Debug("respond to backup now", "err", err)
	}
}
