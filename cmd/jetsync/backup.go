package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/backup"
	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/consumers/restore"
	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/streams"
)

// backupFlags are the settings of the backup producer, which runs where the
// change-streamer does (change-streamer and run).
type backupFlags struct {
	mode            string
	intervalMinutes float64
	keep            int
	uploadMBps      float64
	checkInterval   time.Duration
	cleanupDelay    time.Duration
	purgeWait       time.Duration
	wedgedGrace     time.Duration
	initialGrace    time.Duration
	gracePer50GiB   time.Duration
	protectMaxLag   time.Duration
	reservationTTL  time.Duration
	orphanGrace     time.Duration
}

func (b *backupFlags) register(fs *flag.FlagSet, e *env) {
	e.strVar(fs, &b.mode, "JETSYNC_BACKUP", "on")
	e.floatVar(fs, &b.intervalMinutes, "ZERO_LITESTREAM_INCREMENTAL_BACKUP_INTERVAL_MINUTES", backup.DefaultInterval.Minutes())
	e.floatVar(fs, &b.uploadMBps, "JETSYNC_BACKUP_MAX_UPLOAD_RATE", 0)
	e.intVar(fs, &b.keep, "JETSYNC_BACKUP_KEEP", backup.DefaultKeep)
	e.durationVar(fs, &b.checkInterval, "JETSYNC_BACKUP_CHECK_INTERVAL", backup.DefaultCheckInterval)
	e.durationVar(fs, &b.cleanupDelay, "JETSYNC_BACKUP_CLEANUP_DELAY", backup.DefaultCleanupDelay)
	e.durationVar(fs, &b.purgeWait, "JETSYNC_BACKUP_PURGE_WAIT", backup.DefaultPurgeWait)
	e.durationVar(fs, &b.wedgedGrace, "JETSYNC_BACKUP_WEDGED_GRACE", backup.DefaultWedgedGrace)
	e.durationVar(fs, &b.initialGrace, "JETSYNC_BACKUP_INITIAL_GRACE", 0)
	e.durationVar(fs, &b.gracePer50GiB, "JETSYNC_BACKUP_INITIAL_GRACE_PER_50GIB", backup.DefaultInitialGracePerUnit)
	e.durationVar(fs, &b.protectMaxLag, "JETSYNC_PROTECT_MAX_LAG", backup.DefaultProtectMaxLag)
	e.durationVar(fs, &b.reservationTTL, "JETSYNC_RESERVATION_TTL", streams.DefaultReservationTTL)
	e.durationVar(fs, &b.orphanGrace, "JETSYNC_BACKUP_ORPHAN_GRACE", backup.DefaultOrphanGrace)
}

func (b *backupFlags) off() bool { return strings.EqualFold(b.mode, "off") }

func (b *backupFlags) validate() error {
	switch strings.ToLower(b.mode) {
	case "on", "off":
	default:
		return usageError("backup %q: want on or off", b.mode)
	}
	if b.intervalMinutes <= 0 || math.IsNaN(b.intervalMinutes) || math.IsInf(b.intervalMinutes, 0) {
		return usageError("backup interval %v minutes: must be positive", b.intervalMinutes)
	}
	if b.uploadMBps < 0 || math.IsNaN(b.uploadMBps) {
		return usageError("backup max upload rate %v: must not be negative", b.uploadMBps)
	}
	if b.keep < 1 {
		return usageError("backup keep %d: want at least 1", b.keep)
	}
	for _, d := range []time.Duration{b.checkInterval, b.cleanupDelay, b.wedgedGrace, b.gracePer50GiB, b.protectMaxLag, b.reservationTTL, b.orphanGrace} {
		if d <= 0 {
			return usageError("backup intervals and graces must be positive")
		}
	}
	if b.initialGrace < 0 || b.purgeWait < 0 {
		return usageError("backup initial grace and purge wait must not be negative")
	}
	return nil
}

// producer makes the backup producer over the role's replica file.
func (b *backupFlags) producer(rl role, js jetstream.JetStream, file string, replicas int) (*backup.Producer, error) {
	return backup.New(backup.Config{
		File:                file,
		Shard:               rl.shard,
		TaskID:              rl.id,
		Replicas:            replicas,
		Off:                 b.off(),
		Interval:            time.Duration(b.intervalMinutes * float64(time.Minute)),
		Keep:                b.keep,
		UploadRate:          int64(b.uploadMBps * 1e6),
		CheckInterval:       b.checkInterval,
		CleanupDelay:        b.cleanupDelay,
		PurgeWait:           purgeWait(b.purgeWait),
		WedgedGrace:         b.wedgedGrace,
		InitialGrace:        b.initialGrace,
		InitialGracePerUnit: b.gracePer50GiB,
		ProtectMaxLag:       b.protectMaxLag,
		ReservationTTL:      b.reservationTTL,
		OrphanGrace:         b.orphanGrace,
		Logger:              rl.log,
		Registerer:          rl.metrics.For("backup"),
	}, js)
}

// purgeWait maps the setting's 0 (purge at once) to the producer's -1.
func purgeWait(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// restoreFlags are the settings of a replica's restore from a snapshot.
type restoreFlags struct {
	mode           string
	integrity      bool
	pollInterval   time.Duration
	heartbeat      time.Duration
	reservationTTL time.Duration
}

func (r *restoreFlags) register(fs *flag.FlagSet, e *env, producer bool) {
	e.strVar(fs, &r.mode, "JETSYNC_RESTORE", "on")
	e.boolVar(fs, &r.integrity, "JETSYNC_RESTORE_INTEGRITY_CHECK", false)
	e.durationVar(fs, &r.pollInterval, "JETSYNC_RESTORE_POLL_INTERVAL", restore.DefaultPollInterval)
	e.durationVar(fs, &r.heartbeat, "JETSYNC_RESERVATION_HEARTBEAT", restore.DefaultHeartbeat)
	if !producer {
		// The producer roles share -reservation-ttl with the backup flags.
		e.durationVar(fs, &r.reservationTTL, "JETSYNC_RESERVATION_TTL", streams.DefaultReservationTTL)
	}
}

func (r *restoreFlags) off() bool { return strings.EqualFold(r.mode, "off") }

func (r *restoreFlags) validate() error {
	switch strings.ToLower(r.mode) {
	case "on", "off":
	default:
		return usageError("restore %q: want on or off", r.mode)
	}
	if r.pollInterval <= 0 || r.heartbeat <= 0 {
		return usageError("restore intervals must be positive")
	}
	return nil
}

// restoreReplica gives file its starting point before its consumer opens
// it: it keeps a valid local replica the stream still covers, and otherwise
// restores the newest verified snapshot. A producer (purgeLock) does so under
// the purge lock. The hold it returns (nil when restores are off) is ended by
// endHold once the consumer has caught up.
func (r *restoreFlags) restoreReplica(ctx context.Context, rl role, js jetstream.JetStream, file string, ttl time.Duration, purgeLock bool) (*restore.Hold, error) {
	if r.off() {
		rl.log.Info("restores are off: the replica is built from the change stream")
		return nil, nil
	}
	if ttl == 0 {
		ttl = r.reservationTTL
	}
	if ttl < 2*r.heartbeat {
		return nil, usageError("reservation ttl %s: want at least twice the heartbeat %s", ttl, r.heartbeat)
	}
	rs, err := restore.New(restore.Config{
		File:            file,
		Shard:           rl.shard,
		TaskID:          rl.id,
		IntegrityCheck:  r.integrity,
		PurgeLock:       purgeLock,
		BuildFromStream: true,
		PollInterval:    r.pollInterval,
		Heartbeat:       r.heartbeat,
		ProgressEvery:   rl.progressEvery,
		ReservationTTL:  ttl,
		Logger:          rl.log,
		Registerer:      rl.metrics.For("restore"),
	}, js)
	if err != nil {
		return nil, err
	}
	return restoreWithRetries(ctx, rl, rs, purgeLock)
}

// backedReplica is the replica a producing role keeps beside its
// change-streamer, as components: restored under the purge lock (R-15,
// R-17), followed, snapshotted by the backup producer, and its restore hold
// ended once caught up. cons is what a sync server reads.
func backedReplica(ctx context.Context, rl role, js jetstream.JetStream, file, name, logName string, b *backupFlags, r *restoreFlags, replicas int) (cons *replicator.Consumer, comps []component, err error) {
	hold, err := r.restoreReplica(ctx, rl, js, file, b.reservationTTL, true)
	if err != nil {
		return nil, nil, err
	}
	cons, err = rl.replica(js, file, name, logName)
	if err != nil {
		return nil, nil, err
	}
	bp, err := b.producer(rl, js, file, replicas)
	if err != nil {
		return nil, nil, err
	}
	comps = append([]component{{logName, cons.Run}, {"backup", bp.Run}}, endHold(rl, hold, cons)...)
	return cons, comps, nil
}

// endHold is the component that ends a restore's reservation (or releases
// its purge lock) once cons has caught up with the stream as it stood when
// the restore finished.
func endHold(rl role, hold *restore.Hold, cons *replicator.Consumer) []component {
	if hold == nil {
		return nil
	}
	return []component{{"restore", func(ctx context.Context) error {
		if err := hold.EndWhenCaughtUp(ctx, cons); err != nil {
			// The key expires by itself; only the cleanup delay misses
			// this restore's duration.
			rl.log.Warn("could not end the restore reservation", "err", err)
		}
		<-ctx.Done()
		return nil
	}}}
}

// Producer restore retries: three attempts, five seconds apart.
const (
	producerRestoreAttempts = 3
	producerRestoreDelay    = 5 * time.Second
)

// restoreWithRetries runs the restore. A producer's restore that fails falls
// back to a new initial sync: the backup replica's consumer asks for
// one when it finds the stream no longer holds what it needs.
func restoreWithRetries(ctx context.Context, rl role, rs *restore.Restorer, purgeLock bool) (*restore.Hold, error) {
	if !purgeLock {
		return rs.Restore(ctx)
	}
	for attempt := 1; ; attempt++ {
		hold, err := rs.Restore(ctx)
		switch {
		case err == nil:
			return hold, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, restore.ErrNoSnapshot):
			rl.log.Error("cannot restore the backup replica; falling back to a new initial sync", "err", err)
			return nil, nil
		case attempt >= producerRestoreAttempts:
			rl.log.Error("restoring the backup replica failed; falling back to a new initial sync", "attempts", attempt, "err", err)
			return nil, nil
		}
		rl.log.Warn("restoring the backup replica failed; retrying", "attempt", attempt, "in", producerRestoreDelay, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(producerRestoreDelay):
		}
	}
}

const backupSummary = `Ask the change-streamer holding the producer role for a snapshot now, and
print it as JSON. Usage: jetsync backup now [flags]. It is a NATS request on
jetsync.<app>_<shard>.control.backup.`

func cmdBackup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "now" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			args = []string{"now", "-h"}
		} else {
			return usageError("backup: want \"jetsync backup now\"")
		}
	}
	var c struct {
		common
		natsFlags
		timeout time.Duration
	}
	e := newEnv()
	fs := flag.NewFlagSet("jetsync backup now", flag.ContinueOnError)
	c.common.register(fs, e)
	c.natsFlags.register(fs, e)
	e.durationVar(fs, &c.timeout, "JETSYNC_BACKUP_NOW_TIMEOUT", 10*time.Minute)
	if err := parseFlags(fs, e, stdout, backupSummary, args[1:]); err != nil {
		return err
	}
	shard, err := c.shard()
	if err != nil {
		return err
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	nc, err := c.dial("jetsync backup now", log, false)
	if err != nil {
		return err
	}
	defer nc.Close()
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	subj := shard.BackupNowSubject()
	msg, err := nc.RequestWithContext(rctx, subj, nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("backup now: no change-streamer answers on %s", subj)
	}
	if err != nil {
		return fmt.Errorf("backup now: %w", err)
	}
	var reply streams.BackupNowReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return fmt.Errorf("backup now: reply %q: %w", msg.Data, err)
	}
	if reply.Error != "" {
		return fmt.Errorf("backup now: %s", reply.Error)
	}
	out, _ := json.MarshalIndent(reply.Snapshot, "", "  ")
	fmt.Fprintln(stdout, string(out))
	log.Debug("backup now", logkey.Snapshot, reply.Snapshot.Name)
	return nil
}

func (e *env) float(name string, def float64) float64 {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not a number", name, v))
		return def
	}
	return f
}

func (e *env) bool(name string, def bool) bool {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not a boolean", name, v))
		return def
	}
	return b
}
