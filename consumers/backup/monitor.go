package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/streams"
)

// listTimeout bounds one listing or verification of the object store.
const listTimeout = 30 * time.Second

// Check runs the backup monitor once: it verifies the snapshots in the
// object store, applies the fatal rules, and purges the change stream as far
// as is safe. It returns a *FatalError when the backup pipeline is broken.
func (p *Producer) Check(ctx context.Context) error {
	if err := p.ensure(ctx); err != nil {
		return err
	}
	p.start()
	p.metrics.checks.Inc()
	now := p.cfg.Now()
	verifyErr := error(nil)
	if !p.cfg.Off {
		verifyErr = p.verify(ctx)
		if verifyErr != nil {
			p.metrics.purgeBlocked.WithLabelValues("verification-failed").Inc()
		}
		if err := p.fatal(ctx, now, verifyErr); err != nil {
			return err
		}
	}
	reason, err := p.purge(ctx, now)
	if err != nil {
		return err
	}
	if verifyErr != nil {
		return fmt.Errorf("verify snapshots: %w", verifyErr)
	}
	if reason != "" {
		p.log.Debug("no purge", "reason", reason)
	}
	return nil
}

// verify lists the object store and checks the digest of every snapshot not
// checked before, then records the newest verified one in the backup bucket,
// where restorers look for it.
func (p *Producer) verify(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	snaps, err := p.list(lctx)
	cancel()
	if err != nil {
		return err
	}
	var newest *streams.Snapshot
	present := map[string]bool{}
	for _, s := range snaps {
		present[s.Name] = true
		if p.bad[s.Name] {
			continue
		}
		if v, ok := p.verified[s.Name]; ok {
			newest = &v
			continue
		}
		if err := p.check(ctx, s); err != nil {
			if errors.Is(err, errCorrupt) {
				p.bad[s.Name] = true
				p.log.Error("snapshot in the object store is corrupt; not using it", logkey.Snapshot, s.Name, "err", err)
				continue
			}
			return err
		}
		if c, ok, _ := streams.ReadSnapshot(ctx, p.res.State, streams.KeyBackupClaimed); ok && c.Name == s.Name {
			s.ClaimedAt = c.ClaimedAt
		}
		if s.ClaimedAt.IsZero() {
			s.ClaimedAt = s.TakenAt
		}
		p.verified[s.Name] = s
		newest = &s
	}
	for name := range p.verified {
		if !present[name] {
			delete(p.verified, name)
		}
	}
	if newest == nil {
		p.newest = nil
		return nil
	}
	if p.newest == nil || p.newest.Name != newest.Name {
		if _, err := p.res.State.Put(ctx, streams.KeyBackupVerified, mustJSON(*newest)); err != nil {
			return fmt.Errorf("record verified snapshot: %w", err)
		}
		p.log.Info("snapshot verified", logkey.Snapshot, newest.Name, logkey.Seq, newest.StreamSeq)
	}
	if !p.confirmed {
		p.log.Info("a restorable snapshot exists", logkey.Snapshot, newest.Name)
	}
	p.newest, p.confirmed = newest, true
	p.metrics.verifiedSeq.Set(float64(newest.StreamSeq))
	return nil
}

var errCorrupt = errors.New("digest mismatch")

// verifyRate is the least read rate a verification is given time for.
const verifyRate = 10 << 20

// check reads a snapshot object through and compares its digest with the
// one the producer recorded before uploading. It reads the chunks with a
// pull consumer of its own, as a restore does: ObjectStore.Get's push
// consumer overflows on large objects (a "slow consumer" and a reset).
func (p *Producer) check(ctx context.Context, s streams.Snapshot) error {
	ctx, cancel := context.WithTimeout(ctx, listTimeout+time.Duration(s.Size/verifyRate)*time.Second)
	defer cancel()
	info, err := p.res.Snapshots.GetInfo(ctx, s.Name)
	if err != nil {
		return fmt.Errorf("get %s: %w", s.Name, err)
	}
	h := sha256.New()
	n, err := p.readChunks(ctx, info, h)
	if err != nil {
		return fmt.Errorf("read %s: %w", s.Name, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != s.SHA256 || n != s.Size {
		return fmt.Errorf("%s: %w: sha256 %s (%d bytes), want %s (%d bytes)", s.Name, errCorrupt, sum, n, s.SHA256, s.Size)
	}
	return nil
}

// readChunks writes an object's chunks to w in order.
func (p *Producer) readChunks(ctx context.Context, info *jetstream.ObjectInfo, w io.Writer) (int64, error) {
	if info.Chunks == 0 {
		return 0, nil
	}
	bucket := p.cfg.Shard.SnapshotBucket()
	oc, err := p.js.OrderedConsumer(ctx, "OBJ_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{p.cfg.Shard.SnapshotChunks(info.NUID)},
	})
	if err != nil {
		return 0, err
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(32))
	if err != nil {
		return 0, err
	}
	defer it.Stop()
	var n int64
	for i := uint32(0); i < info.Chunks; i++ {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return n, fmt.Errorf("chunk %d of %d: %w", i+1, info.Chunks, err)
		}
		m, _ := w.Write(msg.Data())
		n += int64(m)
	}
	return n, nil
}

// initialGrace is how long the producer waits for its first restorable
// snapshot: InitialGracePerUnit per 50 GiB of replica, at least one unit.
func (p *Producer) initialGrace() time.Duration {
	if p.cfg.InitialGrace > 0 {
		return p.cfg.InitialGrace
	}
	var size int64
	for _, suffix := range []string{"", "-wal"} {
		if fi, err := os.Stat(p.cfg.File + suffix); err == nil {
			size += fi.Size()
		}
	}
	units := max(1, math.Ceil(float64(size)/InitialGraceUnit))
	return time.Duration(units) * p.cfg.InitialGracePerUnit
}

// fatal applies the wedged-backup and initial-backup-grace rules, after a
// verification whose error is verifyErr.
func (p *Producer) fatal(ctx context.Context, now time.Time, verifyErr error) error {
	if !p.confirmed {
		if g := p.initialGrace(); now.Sub(p.started) >= g {
			// This check's verification was the last one.
			return &FatalError{Reason: ReasonInitialGrace, Msg: fmt.Sprintf(
				"no restorable backup has appeared in object store %s within %s of startup (grace period %s): "+
					"the backup pipeline appears to be broken; shutting down so that the change-streamer is flagged "+
					"as the cause rather than the view-syncers waiting on it",
				p.cfg.Shard.SnapshotBucket(), now.Sub(p.started).Round(time.Second), g)}
		}
	}
	if verifyErr != nil {
		return nil
	}
	claim, ok, err := streams.ReadSnapshot(ctx, p.res.State, streams.KeyBackupClaimed)
	if err != nil {
		return nil
	}
	if ok {
		if p.last == nil || p.last.Name == claim.Name {
			if lag := p.replicaWriteTimeMs() - claim.WriteTimeMs; claim.WriteTimeMs > 0 && lag >= 0 {
				p.metrics.backupLag.Set(float64(lag) / 1000)
			}
		}
	}
	if !ok || p.covers(claim) {
		p.staleSince = time.Time{}
		return nil
	}
	p.metrics.purgeBlocked.WithLabelValues("backup-stale").Inc()
	if p.staleSince.IsZero() {
		p.staleSince = now
		p.log.Warn("the verified backup is behind the claimed one; blocking purges", "claimed", claim.Name)
		return nil
	}
	stale := now.Sub(p.staleSince)
	if stale < p.cfg.WedgedGrace {
		return nil
	}
	if !p.wedgedCount {
		p.wedgedCount = true
		p.metrics.purgeBlocked.WithLabelValues(ReasonWedged).Inc()
	}
	verified := "nothing"
	if p.newest != nil {
		verified = p.newest.Name
	}
	return &FatalError{Reason: ReasonWedged, Msg: fmt.Sprintf(
		"backup in object store %s is wedged: snapshot %s was claimed at %s, but the newest verified snapshot is %s, "+
			"and it has not advanced for %s (grace period %s); shutting down rather than risk a corrupt backup",
		p.cfg.Shard.SnapshotBucket(), claim.Name, claim.ClaimedAt.Format(time.RFC3339), verified,
		stale.Round(time.Second), p.cfg.WedgedGrace)}
}

// covers reports whether the verified snapshots include claim, or something
// newer.
func (p *Producer) covers(claim streams.Snapshot) bool {
	if _, ok := p.verified[claim.Name]; ok {
		return true
	}
	return p.newest != nil && p.newest.ReplicaVersion == claim.ReplicaVersion && p.newest.StreamSeq >= claim.StreamSeq
}

// replicaWriteTimeMs is the backup replica's write time per the last
// snapshot; the backup lag compares claims against it.
func (p *Producer) replicaWriteTimeMs() int64 {
	if p.last == nil {
		return 0
	}
	return p.last.WriteTimeMs
}

// liveReservations reads the reservation bucket and returns the keys held
// live. A key is live while it changes: one unchanged for ReservationTTL by
// this monitor's clock is a crashed holder's, even if the server's TTL has
// not removed it yet. An ended reservation raises the cleanup delay.
func (p *Producer) liveReservations(ctx context.Context) ([]string, error) {
	now := p.cfg.Now()
	keys, err := p.res.Reservations.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list reservations: %w", err)
	}
	present := map[string]bool{}
	var live []string
	for k := range keys.Keys() {
		present[k] = true
		e, err := p.res.Reservations.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read reservation %s: %w", k, err)
		}
		s, ok := p.seen[k]
		if !ok || s.rev != e.Revision() {
			s = keySeen{rev: e.Revision(), at: now}
		}
		if strings.HasPrefix(k, streams.ReservationPrefix) {
			var r streams.Reservation
			if json.Unmarshal(e.Value(), &r) == nil && r.Ended {
				s.ended = true
				if !s.handed {
					s.handed = true
					p.metrics.reservationDur.WithLabelValues("success").Observe(r.Duration.Seconds())
					if r.Duration > p.cleanupDelay {
						p.cleanupDelay = r.Duration
						p.metrics.cleanupDelay.Set(r.Duration.Seconds())
						p.log.Info("cleanup delay raised to the longest restore", "delay", r.Duration, logkey.TaskID, r.TaskID)
					}
				}
			}
		}
		if k == streams.KeyPurgeLock {
			var l streams.PurgeLock
			if json.Unmarshal(e.Value(), &l) == nil && l.Holder == p.cfg.TaskID {
				s.ended = true
			}
		}
		p.seen[k] = s
		if !s.ended && now.Sub(s.at) < p.cfg.ReservationTTL {
			live = append(live, k)
		}
	}
	for k, s := range p.seen {
		if !present[k] {
			if !s.ended && !s.handed && strings.HasPrefix(k, streams.ReservationPrefix) {
				p.metrics.reservationDur.WithLabelValues("cancelled").Observe(0)
			}
			delete(p.seen, k)
		}
	}
	return live, nil
}

// purge purges the change stream below the purge point, or returns why not.
func (p *Producer) purge(ctx context.Context, now time.Time) (string, error) {
	live, err := p.liveReservations(ctx)
	if err != nil {
		p.metrics.purgeBlocked.WithLabelValues("reservations-unknown").Inc()
		return "reservations-unknown", nil
	}
	if len(live) > 0 {
		reason := "reservation"
		if len(live) == 1 && live[0] == streams.KeyPurgeLock {
			reason = "purge-lock"
		}
		p.metrics.purgeBlocked.WithLabelValues(reason).Inc()
		return reason, nil
	}
	var bound uint64 = math.MaxUint64
	if !p.cfg.Off {
		if !p.staleSince.IsZero() {
			return "backup-stale", nil
		}
		s := p.restorable(ctx, now)
		if s == nil {
			return "no-old-enough-snapshot", nil
		}
		bound = s.StreamSeq + 1
	}
	if p.cfg.PurgeWait > 0 {
		if p.pendingAt.IsZero() {
			p.pending, p.pendingAt = bound, now
			p.log.Debug("purge scheduled", "below_seq", bound, "in", p.cfg.PurgeWait)
			return "purge-scheduled", nil
		}
		if now.Sub(p.pendingAt) < p.cfg.PurgeWait {
			return "purge-scheduled", nil
		}
		// The purge goes no further than what was scheduled, nor than
		// what is safe now.
		bound = min(bound, p.pending)
		p.pendingAt = time.Time{}
	}
	stream, err := p.js.Stream(ctx, p.cfg.Shard.ChangesStream())
	if err != nil {
		return "", fmt.Errorf("stream: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return "", fmt.Errorf("stream info: %w", err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	cb, connected, err := p.consumerBound(ctx, stream, now, last)
	if err != nil {
		return "", err
	}
	if connected == 0 {
		// Without a connected replica there is no evidence that anyone
		// has what would be purged.
		return "no-connected-replica", nil
	}
	bound = min(bound, cb)
	if bound <= first || last == 0 {
		return "nothing-to-purge", nil
	}
	keep, err := newestTxStart(ctx, stream, first, last)
	if err != nil {
		return "", err
	}
	if keep == 0 {
		return "newest-transaction-unknown", nil
	}
	bound = min(bound, keep)
	if bound <= first {
		return "nothing-to-purge", nil
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(bound)); err != nil {
		return "", fmt.Errorf("purge %s below seq %d: %w", p.cfg.Shard.ChangesStream(), bound, err)
	}
	p.metrics.purgedMsgs.Add(float64(bound - first))
	p.metrics.purgeSeq.Set(float64(bound))
	p.log.Info("purged the change stream", "below_seq", bound, "messages", bound-first)
	return "", nil
}

// restorable returns the newest verified snapshot of the current replica
// version old enough (by the cleanup delay) to purge below.
func (p *Producer) restorable(ctx context.Context, now time.Time) *streams.Snapshot {
	version := ""
	if kv, err := p.js.KeyValue(ctx, p.cfg.Shard.StateBucket()); err == nil {
		if e, err := kv.Get(ctx, streams.KeyUpstream); err == nil {
			var up streams.Upstream
			if json.Unmarshal(e.Value(), &up) == nil {
				version = up.ReplicaVersion
			}
		}
	}
	cutoff := now.Add(-p.cleanupDelay)
	var best *streams.Snapshot
	for _, s := range p.verified {
		if s.ReplicaVersion != version || s.ClaimedAt.After(cutoff) {
			continue
		}
		if best == nil || s.StreamSeq > best.StreamSeq {
			best = &s
		}
	}
	return best
}

// consumerBound is the lowest first-unacked sequence over the connected
// replica consumers and the protected ones.
func (p *Producer) consumerBound(ctx context.Context, stream jetstream.Stream, now time.Time, last uint64) (uint64, int, error) {
	var bound uint64 = math.MaxUint64
	connected := 0
	lister := stream.ListConsumers(ctx)
	for ci := range lister.Info() {
		next := ci.AckFloor.Stream + 1
		if ci.Config.Metadata[streams.MetaReplica] == "true" && ci.NumWaiting > 0 {
			connected++
			bound = min(bound, next)
		}
		if ci.Config.Metadata[streams.MetaProtect] != "true" || p.noProtect[ci.Name] {
			continue
		}
		if next <= last {
			if m, err := stream.GetMsg(ctx, next); err == nil && now.Sub(m.Time) > p.cfg.ProtectMaxLag {
				p.noProtect[ci.Name] = true
				p.log.Error("protected consumer lags too far behind; it no longer holds back purges",
					logkey.Consumer, ci.Name, "ack_floor", ci.AckFloor.Stream, "max_lag", p.cfg.ProtectMaxLag)
				continue
			}
		}
		bound = min(bound, next)
	}
	if err := lister.Err(); err != nil {
		return 0, 0, fmt.Errorf("list consumers: %w", err)
	}
	return bound, connected, nil
}

// newestTxStart returns the sequence where the stream's newest transaction
// starts, which a purge always keeps; 0 if it lies further back than
// NewestTxWalk messages.
func newestTxStart(ctx context.Context, stream jetstream.Stream, first, last uint64) (uint64, error) {
	for seq, n := last-1, 0; seq >= first && seq > 0 && n < NewestTxWalk; seq, n = seq-1, n+1 {
		m, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read seq %d: %w", seq, err)
		}
		if m.Header.Get(streams.HeaderCommit) != "" {
			return seq + 1, nil
		}
	}
	if last-first < NewestTxWalk {
		return first, nil
	}
	return 0, nil
}
