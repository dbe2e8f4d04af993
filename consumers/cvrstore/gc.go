package cvrstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/projections/cvr"
	"github.com/jetsync/jetsync/streams"
)

// Garbage-collection defaults: zero-cache's cvr-purger
// (ZERO_CVR_GARBAGE_COLLECTION_*).
const (
	DefaultGCInactivity = 48 * time.Hour
	DefaultGCInterval   = 60 * time.Second
	DefaultGCBatchSize  = 25
	// MaxGCInterval caps the interval, which doubles while there is
	// nothing to purge.
	MaxGCInterval = 16 * time.Minute
	// DefaultTombstoneAge is how long a purged group's tombstone stays (at
	// least the inactivity threshold), as zero-cache keeps its instance row
	// for a 30-day actives metric.
	DefaultTombstoneAge = 31 * 24 * time.Hour
)

// PurgedVersion is a purged group's CVR version, zero-cache's '00'.
const PurgedVersion = "00"

// GCConfig configures a Purger.
type GCConfig struct {
	// Inactivity is how long a group must have gone without a CVR write
	// before it may be purged (ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS).
	Inactivity time.Duration
	// Interval is the first wait between passes
	// (..._INITIAL_INTERVAL_SECONDS); it doubles, up to MaxGCInterval,
	// while a pass leaves nothing purgeable.
	Interval time.Duration
	// BatchSize is how many groups the first pass purges
	// (..._INITIAL_BATCH_SIZE); it grows by itself whenever the backlog
	// grew over a pass. 0 disables garbage collection.
	BatchSize int
	// TombstoneAge defaults to DefaultTombstoneAge.
	TombstoneAge time.Duration
}

// Validate checks c.
func (c GCConfig) Validate() error {
	if c.Inactivity <= 0 || c.Interval <= 0 {
		return errors.New("cvr gc: inactivity threshold and interval must be positive")
	}
	if c.BatchSize < 0 || c.TombstoneAge < 0 {
		return errors.New("cvr gc: negative batch size or tombstone age")
	}
	return nil
}

// Purger is the CVR garbage collector: every view-syncer runs one, and a
// lock in the owners bucket lets one pass run at a time. A pass lists the
// groups whose last CVR write is older than the inactivity threshold, and
// purges the oldest: it takes the group's lease (so no view-syncer serves
// it meanwhile), appends a tombstone (a snapshot of a Deleted instance,
// expecting the subject's last sequence, so that a write it raced with
// wins), purges the history before it and drops the local projection's
// rows. A client of a purged group gets ClientNotFound.
type Purger struct {
	s   *Store
	cfg GCConfig
	log *slog.Logger
}

// NewPurger returns a Purger of s's groups; Run runs it.
func (s *Store) NewPurger(cfg GCConfig) (*Purger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.TombstoneAge == 0 {
		cfg.TombstoneAge = DefaultTombstoneAge
	}
	cfg.TombstoneAge = max(cfg.TombstoneAge, cfg.Inactivity)
	return &Purger{s: s, cfg: cfg, log: s.log.With(logkey.Component, "cvr-gc")}, nil
}

// Run purges inactive groups until ctx ends, pacing passes as zero-cache's
// purger does: the interval resets while work remains and doubles (to
// MaxGCInterval) while none does, and the batch grows by BatchSize each
// time the backlog grew over a pass. It returns nil when ctx ends.
func (p *Purger) Run(ctx context.Context) error {
	if p.cfg.BatchSize == 0 {
		p.log.Warn("cvr garbage collection is disabled (batch size 0)")
		<-ctx.Done()
		return nil
	}
	p.log.Info("cvr garbage collection running", "inactivity", p.cfg.Inactivity, "interval", p.cfg.Interval, "batch", p.cfg.BatchSize)
	batch, interval := p.cfg.BatchSize, p.cfg.Interval
	purgeable := -1
	for {
		start := time.Now()
		purged, remaining, err := p.PurgeInactive(ctx, batch)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			p.log.Warn("cvr garbage collection pass failed", "err", err)
			interval = p.cfg.Interval
		default:
			if purgeable >= 0 && remaining > purgeable {
				batch += p.cfg.BatchSize
				p.log.Info("increased cvr purges per pass", "batch", batch)
			}
			purgeable = remaining
			if remaining > 0 {
				interval = p.cfg.Interval
			} else {
				interval = min(interval*2, MaxGCInterval)
			}
			lvl := slog.LevelDebug
			if purged > 0 {
				lvl = slog.LevelInfo
			}
			p.log.Log(ctx, lvl, "purged inactive cvrs", "purged", purged, "remaining", remaining,
				"elapsed", time.Since(start).Round(time.Millisecond), "next", interval)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// groupHead is the last message of a group's subject, as the listing sees
// it.
type groupHead struct {
	subject string
	at      time.Time
	deleted bool
}

// PurgeInactive runs one pass: unless another view-syncer's pass holds the
// lock, it purges up to maxGroups of the longest-inactive groups and
// deletes expired tombstones. remaining counts the groups still purgeable
// after it.
func (p *Purger) PurgeInactive(ctx context.Context, maxGroups int) (purged, remaining int, err error) {
	lock, err := p.s.lockGC(ctx)
	if err != nil || lock == nil {
		return 0, 0, err
	}
	defer func() {
		if err := lock.unlock(context.WithoutCancel(ctx)); err != nil {
			p.log.Warn("release the cvr gc lock", "err", err)
		}
	}()
	heads, err := p.list(ctx)
	if err != nil {
		return 0, 0, err
	}
	now := time.Now()
	threshold, tombThreshold := now.Add(-p.cfg.Inactivity), now.Add(-p.cfg.TombstoneAge)
	var candidates []groupHead
	for _, h := range heads {
		switch {
		case h.deleted && h.at.Before(tombThreshold):
			if err := lock.renew(ctx); err != nil {
				return purged, 0, err
			}
			if err := p.s.stream.Purge(ctx, jetstream.WithPurgeSubject(h.subject)); err != nil {
				return purged, 0, fmt.Errorf("purge tombstone %s: %w", h.subject, err)
			}
		case !h.deleted && h.at.Before(threshold):
			candidates = append(candidates, h)
		}
	}
	sort.Slice(candidates, func(i, j int) bool { return candidates[i].at.Before(candidates[j].at) })
	remaining = len(candidates)
	for _, h := range candidates {
		if purged == maxGroups {
			break
		}
		if err := lock.renew(ctx); err != nil {
			return purged, remaining, err
		}
		ok, err := p.purge(ctx, h.subject, threshold)
		if err != nil {
			return purged, remaining, err
		}
		if ok {
			purged++
			remaining--
		}
	}
	return purged, remaining, nil
}

// list reads the last message of every group's subject, headers only.
func (p *Purger) list(ctx context.Context) ([]groupHead, error) {
	info, err := p.s.stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("cvr gc: %w", err)
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	cons, err := p.s.cfg.JS.OrderedConsumer(ctx, p.s.cfg.Shard.CVRStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{p.s.cfg.Shard.CVRFilter()},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly:    true,
	})
	if err != nil {
		return nil, fmt.Errorf("cvr gc: list groups: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return nil, fmt.Errorf("cvr gc: list groups: %w", err)
	}
	defer it.Stop()
	var out []groupHead
	for {
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		msg, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return out, nil // a stream emptied by purges meanwhile
			}
			return nil, fmt.Errorf("cvr gc: list groups: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return nil, fmt.Errorf("cvr gc: list groups: %w", err)
		}
		out = append(out, groupHead{subject: msg.Subject(), at: md.Timestamp, deleted: msg.Headers().Get(streams.CVRHeaderDeleted) != ""})
		if md.NumPending == 0 {
			return out, nil
		}
	}
}

// purge tombstones one group, if it is still inactive and nobody serves
// it; ok reports that it did.
func (p *Purger) purge(ctx context.Context, subject string, threshold time.Time) (ok bool, err error) {
	raw, err := p.s.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cvr gc: %s: %w", subject, err)
	}
	if !raw.Time.Before(threshold) || raw.Header.Get(streams.CVRHeaderDeleted) != "" {
		return false, nil // written since the listing
	}
	m, err := streams.DecodeCVR(raw.Data)
	if err != nil {
		return false, fmt.Errorf("cvr gc: %s seq %d: %w", subject, raw.Sequence, err)
	}
	id := m.Group
	// A group loaded here holds a lease; one loaded elsewhere, a live
	// peer's lease, which Acquire refuses. Neither is inactive.
	if !p.s.startPurge(id) {
		return false, nil
	}
	defer p.s.endPurge(id)
	lease, err := p.s.acquire(ctx, id, false)
	var owned *OwnedError
	if errors.As(err, &owned) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer func() {
		if err := p.s.Release(context.WithoutCancel(ctx), lease); err != nil {
			p.log.Warn("release a purged group's lease", logkey.ClientGroup, id, "err", err)
		}
	}()
	hdr := streams.CVRMessage{Group: id, Owner: p.s.cfg.OwnerID, Version: PurgedVersion, Prev: raw.Sequence, Last: true,
		Events: []streams.CVREvent{
			{Op: streams.CVROpSnapshot, Snapshot: &streams.CVRSnapshot{Version: PurgedVersion}},
			{Op: streams.CVROpInstance, Instance: &streams.CVRInstance{Version: PurgedVersion, LastActiveMs: raw.Time.UnixMilli(), Deleted: true}},
		}}
	b, err := streams.EncodeCVR(&hdr)
	if err != nil {
		return false, err
	}
	msg := nats.NewMsg(subject)
	msg.Data = b
	msg.Header.Set(streams.CVRHeaderDeleted, "1")
	ack, err := p.s.cfg.JS.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(raw.Sequence))
	if err != nil {
		if conflict(err) {
			return false, nil // written meanwhile: active after all
		}
		return false, fmt.Errorf("cvr gc: tombstone %q: %w", id, err)
	}
	if err := p.s.stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(ack.Sequence)); err != nil {
		return true, fmt.Errorf("cvr gc: purge %q: %w", id, err)
	}
	// A projection write still queued for the group would re-add rows
	// after the drop.
	if err := p.s.applies.wait(ctx, id); err != nil {
		return true, fmt.Errorf("cvr gc: drop %q: %w", id, err)
	}
	if err := cvr.Drop(ctx, p.s.w, id); err != nil {
		return true, fmt.Errorf("cvr gc: drop %q: %w", id, err)
	}
	p.log.Debug("purged inactive cvr", logkey.ClientGroup, id, "last_active", raw.Time, logkey.Seq, ack.Sequence)
	return true, nil
}

// startPurge marks a group being purged, unless a lease of this store
// holds it; Acquire refuses a marked group.
func (s *Store) startPurge(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases[id] != nil || s.acquiring[id] > 0 {
		return false
	}
	s.purging[id] = true
	return true
}

func (s *Store) endPurge(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.purging, id)
}

// ErrPurging reports a group that garbage collection is purging right now;
// it is about to be gone, so the caller retries shortly.
var ErrPurging = errors.New("cvr group is being purged")

// gcLock is this store's hold on the GC lock.
type gcLock struct {
	s   *Store
	rev uint64
}

// lockGC takes the GC lock; nil when another view-syncer holds it.
func (s *Store) lockGC(ctx context.Context) (*gcLock, error) {
	now := time.Now()
	rec := func(now time.Time) []byte {
		return s.ownerRecord(streams.CVRGCLockKey, streams.CVROwner{ID: s.cfg.OwnerID, Address: s.cfg.Address, ExpiresMs: now.Add(s.cfg.LeaseTTL).UnixMilli()})
	}
	rev, err := s.kv.Create(ctx, streams.CVRGCLockKey, rec(now))
	if err == nil {
		return &gcLock{s: s, rev: rev}, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("cvr gc lock: %w", err)
	}
	e, err := s.kv.Get(ctx, streams.CVRGCLockKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil // released meanwhile: the next pass takes it
	}
	if err != nil {
		return nil, fmt.Errorf("cvr gc lock: %w", err)
	}
	var cur streams.CVROwner
	if json.Unmarshal(e.Value(), &cur) == nil && now.UnixMilli() < cur.ExpiresMs {
		return nil, nil
	}
	rev, err = s.kv.Update(ctx, streams.CVRGCLockKey, rec(now), e.Revision())
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cvr gc lock: %w", err)
	}
	return &gcLock{s: s, rev: rev}, nil
}

// renew extends the lock by LeaseTTL; an error means it was lost.
func (l *gcLock) renew(ctx context.Context) error {
	b := l.s.ownerRecord(streams.CVRGCLockKey, streams.CVROwner{ID: l.s.cfg.OwnerID, Address: l.s.cfg.Address, ExpiresMs: time.Now().Add(l.s.cfg.LeaseTTL).UnixMilli()})
	rev, err := l.s.kv.Update(ctx, streams.CVRGCLockKey, b, l.rev)
	if err != nil {
		return fmt.Errorf("cvr gc lock: %w", err)
	}
	l.rev = rev
	return nil
}

func (l *gcLock) unlock(ctx context.Context) error {
	err := l.s.kv.Delete(ctx, streams.CVRGCLockKey, jetstream.LastRevision(l.rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("cvr gc lock: %w", err)
	}
	return nil
}
