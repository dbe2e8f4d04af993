package cvrstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/projections/cvr"
	"github.com/jetsync/jetsync/streams"
)

// Group is one client group's CVR as this store writes it. Its methods
// must not be called concurrently.
type Group struct {
	s       *Store
	id      string
	subject string
	lease   *Lease
	// seq is the stream sequence of the group's last message: the
	// expected last subject sequence of the next publish.
	seq   uint64
	since int // messages beyond the last snapshot
	err   error
	info  LoadInfo
	// applyErr is the first failure of an apply that ran after its
	// PubAck (applyQueue); the Group is then broken.
	applyMu  sync.Mutex
	applyErr error
}

// LoadInfo says how Load found a group.
type LoadInfo struct {
	// FromSeq is the local projection's sequence for the group before
	// Load (0: nothing local, or it was dropped).
	FromSeq uint64
	// Replayed counts the messages Load read from the stream.
	Replayed int
	// Rebuilt is set when the local projection could not be used (it had
	// missed purged history, or was ahead of the stream) and Load replayed
	// the whole subject.
	Rebuilt bool
}

// Load brings a group's local projection up to date with its subject and
// returns it for writing. lease, when not nil, is checked before every
// publish: a lost or expired lease stops the group at once. Load does not
// itself take the lease; take it first, so that no other owner appends
// while this one loads.
func (s *Store) Load(ctx context.Context, groupID string, lease *Lease) (*Group, error) {
	if err := streams.CheckGroupID(groupID); err != nil {
		return nil, err
	}
	g := &Group{s: s, id: groupID, subject: s.cfg.Shard.CVRSubject(groupID), lease: lease}
	// An earlier Group of this ID may still be applying what it published.
	if err := s.applies.wait(ctx, groupID); err != nil {
		return nil, err
	}
	last, err := s.lastSeq(ctx, g.subject)
	if err != nil {
		return nil, err
	}
	p, err := cvr.LoadProgress(ctx, s.w, groupID)
	if err != nil {
		return nil, err
	}
	g.info.FromSeq = p.Seq
	if p.Seq > last {
		// The stream lost what the projection holds (a purged group or a
		// new stream): the stream is the truth.
		if err := cvr.Drop(ctx, s.w, groupID); err != nil {
			return nil, err
		}
		g.info.Rebuilt, p = true, cvr.Progress{Last: true}
	}
	if p.Seq < last {
		err := g.replay(ctx, p.Seq, last)
		if errors.Is(err, cvr.ErrGap) && p.Seq > 0 {
			s.log.Info("cvr projection missed purged history; rebuilding", logkey.ClientGroup, groupID, logkey.Seq, p.Seq, "err", err)
			if err = cvr.Drop(ctx, s.w, groupID); err == nil {
				g.info.Rebuilt, g.info.Replayed = true, 0
				err = g.replay(ctx, 0, last)
			}
		}
		if err != nil {
			return nil, err
		}
		if p, err = cvr.LoadProgress(ctx, s.w, groupID); err != nil {
			return nil, err
		}
	}
	if !p.Last {
		return nil, fmt.Errorf("load cvr group %q: history ends inside an update at seq %d", groupID, p.Seq)
	}
	g.seq, g.since = last, p.SinceSnapshot
	s.log.Debug("cvr group loaded", logkey.ClientGroup, groupID, logkey.Seq, last, "from", g.info.FromSeq, "replayed", g.info.Replayed)
	return g, nil
}

func (s *Store) lastSeq(ctx context.Context, subject string) (uint64, error) {
	m, err := s.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last message of %s: %w", subject, err)
	}
	return m.Sequence, nil
}

// replayBatch is how many messages one projection transaction applies
// while replaying.
const replayBatch = 256

// replay applies the group's messages after seq up to last.
func (g *Group) replay(ctx context.Context, from, last uint64) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{g.subject}, DeliverPolicy: jetstream.DeliverAllPolicy}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from+1
	}
	cons, err := g.s.cfg.JS.OrderedConsumer(ctx, g.s.cfg.Shard.CVRStream(), cfg)
	if err != nil {
		return fmt.Errorf("replay %s: %w", g.subject, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(replayBatch))
	if err != nil {
		return fmt.Errorf("replay %s: %w", g.subject, err)
	}
	defer it.Stop()
	type item struct {
		seq uint64
		m   *streams.CVRMessage
	}
	var batch []item
	flush := func() error {
		err := g.s.applyTx(ctx, func(tx *sql.Tx) error {
			for _, it := range batch {
				if _, err := g.s.stmts.Apply(ctx, tx, it.seq, it.m); err != nil {
					return err
				}
			}
			return nil
		})
		batch = batch[:0]
		return err
	}
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("replay %s: %w", g.subject, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("replay %s: %w", g.subject, err)
		}
		seq := md.Sequence.Stream
		if seq > last {
			break // appended since Load began; Load's last is what it returns
		}
		m, err := streams.DecodeCVR(msg.Data())
		if err != nil {
			// A message this store cannot read would corrupt the group if
			// skipped.
			return fmt.Errorf("replay %s: seq %d: %w", g.subject, seq, err)
		}
		if m.Group != g.id {
			return fmt.Errorf("replay %s: seq %d belongs to group %q", g.subject, seq, m.Group)
		}
		batch = append(batch, item{seq, m})
		g.info.Replayed++
		if seq == last {
			break
		}
		if len(batch) == replayBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

func (s *Store) applyTx(ctx context.Context, f func(*sql.Tx) error) (err error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("cvr projection: %w", err)
	}
	// Applies run on goroutines of their own: a panic in one (a bad
	// record, say) is that group's failed apply, which its next Load
	// repairs from the stream, not the end of the process.
	defer func() {
		if r := recover(); r != nil {
			_ = tx.Rollback()
			s.log.Error("cvr projection apply panicked", "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("cvr projection: panic: %v", r)
		}
	}()
	if err := f(tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("cvr projection: commit: %w", err)
	}
	return nil
}

// applyHook, when a test sets it, runs at the start of each background
// apply of a published update.
var applyHook atomic.Pointer[func(group string)]

// ID is the group's ID.
func (g *Group) ID() string { return g.id }

// Seq is the stream sequence of the group's last message.
func (g *Group) Seq() uint64 { return g.seq }

// Info says how Load found the group.
func (g *Group) Info() LoadInfo { return g.info }

// State reads the group's whole CVR from the local projection.
func (g *Group) State(ctx context.Context) (*cvr.State, error) {
	if err := g.applied(ctx); err != nil {
		return nil, err
	}
	return cvr.Load(ctx, g.s.r, g.id)
}

// applied waits until the local projection holds everything published,
// and reports a failure to apply it.
func (g *Group) applied(ctx context.Context) error {
	if err := g.s.applies.wait(ctx, g.id); err != nil {
		return err
	}
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	if g.applyErr != nil {
		return fmt.Errorf("%w: cvr %q: local projection: %w", ErrBroken, g.id, g.applyErr)
	}
	return nil
}

// Publish appends one CVR update, at version (the CVR's version after it),
// and returns once JetStream has stored it, so that a pokeEnd sent
// afterwards never carries a cookie the stream cannot reproduce. An update
// larger than one message is published as one atomic batch, and updates of
// other groups published at the same time share it (commit.go). The
// update is then applied
// to the local projection in the background (State and a later Load wait
// for it), so events must not be modified after the call; once
// the group's history has grown past CompactAfter messages, Publish
// compacts it.
//
// ErrConflict means another writer advanced the group; ErrLeaseLost that
// the lease ended. After any error the Group is unusable (ErrBroken) and
// the caller must stop serving the group or Load it again.
func (g *Group) Publish(ctx context.Context, version string, events []streams.CVREvent) error {
	if err := g.publish(ctx, version, events, false); err != nil {
		return err
	}
	if g.s.cfg.CompactAfter > 0 && g.since >= g.s.cfg.CompactAfter {
		// The update is durable; a failed compaction only leaves the
		// history long, and breaks the Group if it found a conflict.
		if err := g.Compact(ctx); err != nil {
			g.s.log.Warn("cvr compaction failed", logkey.ClientGroup, g.id, logkey.Seq, g.seq, "err", err)
		}
	}
	return nil
}

func (g *Group) publish(ctx context.Context, version string, events []streams.CVREvent, snapshot bool) error {
	if g.err == nil {
		g.applyMu.Lock()
		if g.applyErr != nil {
			g.err = fmt.Errorf("local projection: %w", g.applyErr)
		}
		g.applyMu.Unlock()
	}
	if g.err != nil {
		return fmt.Errorf("%w: %w", ErrBroken, g.err)
	}
	if g.lease != nil {
		if err := g.lease.holds(ctx); err != nil {
			g.err = err
			return err
		}
	}
	hdr := streams.CVRMessage{Group: g.id, Owner: g.s.cfg.OwnerID, Version: version, Prev: g.seq}
	msgs, applied, err := encodeUpdate(hdr, events, g.s.cfg.MaxMessageBytes)
	if err != nil {
		return fmt.Errorf("publish cvr %q: %w", g.id, err) // nothing sent: the Group stays usable
	}
	last, err := g.s.commit(ctx, g.subject, msgs, g.seq)
	if err != nil {
		if conflict(err) {
			err = fmt.Errorf("%w: %w", ErrConflict, err)
		}
		g.err = err
		return fmt.Errorf("publish cvr %q: %w", g.id, err)
	}
	// Apply what the stream now holds, as a rebuild would decode it, once
	// the group's earlier applies are done, while the caller pokes. The
	// batch's messages are consecutive from last-n+1; only the last
	// sequence is recorded, and it is exact. applied shares nothing the
	// caller may change: events given to Publish are not to be modified.
	prev := g.seq
	g.seq = last
	g.s.applies.start(&applyJob{g: g, ctx: context.WithoutCancel(ctx), last: last, msgs: applied})
	if snapshot {
		g.since = len(msgs)
		// Everything before the snapshot is now redundant.
		if err := g.s.stream.Purge(ctx, jetstream.WithPurgeSubject(g.subject), jetstream.WithPurgeSequence(prev+1)); err != nil {
			return fmt.Errorf("compact cvr %q: purge: %w", g.id, err)
		}
	} else {
		g.since += len(msgs)
	}
	return nil
}

// Compact publishes a snapshot of the group's whole CVR and purges the
// messages before it, so that a rebuild replays only the snapshot and what
// follows.
func (g *Group) Compact(ctx context.Context) error {
	st, err := g.State(ctx)
	if err != nil {
		return err
	}
	if st.Progress.Seq != g.seq {
		return fmt.Errorf("compact cvr %q: projection at seq %d, group at %d", g.id, st.Progress.Seq, g.seq)
	}
	return g.publish(ctx, st.Instance.Version, cvr.SnapshotEvents(st), true)
}

// conflict reports JetStream's answer to a wrong expected last sequence.
func conflict(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		var jsErr jetstream.JetStreamError
		if !errors.As(err, &jsErr) || jsErr.APIError() == nil {
			return false
		}
		apiErr = jsErr.APIError()
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}
