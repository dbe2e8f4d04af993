package replicator

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/trace"

	"github.com/jetsync/jetsync/projections/replica"
)

// RowChange is one changed row; see replica.RowChange.
type RowChange = replica.RowChange

// Update is what a subscriber learns from Next: the replica advanced from
// watermark From to To.
type Update struct {
	From, To string
	// Reset means too much changed to list (the subscription's cap was hit,
	// a table was truncated or altered, or a new initial sync ran): re-read
	// everything. Changes is then empty.
	Reset   bool
	Changes []RowChange
	// Traces are the replica applies of traced transactions in the
	// update (at most maxTraces), for the spans that follow them.
	Traces []trace.SpanContext
}

// maxTraces bounds the traces an update carries: a subscriber that fell
// behind continues a few, not every one.
const maxTraces = 8

// ErrClosed is returned by Next on a closed subscription.
var ErrClosed = errors.New("subscription closed")

// Subscription reports the rows the replica changes. It coalesces: Next
// returns everything since the previous Next, and past the consumer's
// SubscriptionCap changes it holds only a Reset, so a slow subscriber costs
// bounded memory.
type Subscription struct {
	c     *Consumer
	ready chan struct{} // capacity 1: "something is pending"

	// Guarded by c.mu.
	from, to string
	reset    bool
	changes  []RowChange
	traces   []trace.SpanContext
	closed   bool
}

// Subscribe starts a subscription at the current watermark.
func (c *Consumer) Subscribe() *Subscription {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &Subscription{c: c, ready: make(chan struct{}, 1), from: c.state.Watermark, to: c.state.Watermark}
	c.subs[s] = struct{}{}
	return s
}

// Next blocks until the replica has changed since the previous Next (or
// Subscribe), and returns how.
func (s *Subscription) Next(ctx context.Context) (Update, error) {
	return s.NextRead(ctx, nil)
}

// NextRead is Next, and begin, if not nil, runs while no commit can land:
// a read transaction that begin starts, and reads from once (SQLite fixes
// a transaction's view at its first read), sees the replica at exactly
// the update's To. The update is taken even if begin fails. begin must be
// quick: commits wait for it.
func (s *Subscription) NextRead(ctx context.Context, begin func() error) (Update, error) {
	for {
		if s.pending() {
			if begin != nil {
				s.c.commitMu.RLock()
				defer s.c.commitMu.RUnlock()
			}
			u, ok := s.take()
			if !ok {
				return Update{}, ErrClosed
			}
			if begin != nil {
				return u, begin()
			}
			return u, nil
		}
		select {
		case <-s.ready:
		case <-ctx.Done():
			return Update{}, ctx.Err()
		}
	}
}

// pending reports whether Next has something to return: changes, or
// ErrClosed.
func (s *Subscription) pending() bool {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.closed || s.reset || len(s.changes) > 0 || s.from != s.to
}

// take returns what changed since the last take; ok is false once the
// subscription is closed.
func (s *Subscription) take() (u Update, ok bool) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.closed {
		return Update{}, false
	}
	u = Update{From: s.from, To: s.to, Reset: s.reset, Changes: s.changes, Traces: s.traces}
	s.from, s.reset, s.changes, s.traces = s.to, false, nil, nil
	return u, true
}

// Close ends the subscription; a blocked Next returns ErrClosed.
func (s *Subscription) Close() {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if !s.closed {
		s.closed = true
		delete(s.c.subs, s)
		s.changes = nil
		s.signal()
	}
}

func (s *Subscription) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// publish sets the state after a commit and hands its outcome to every
// subscriber, at once: a Subscribe sees either both or neither.
func (c *Consumer) publish(st replica.State, o outcome) {
	c.metrics.observe(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state = st
	for s := range c.subs {
		s.to = st.Watermark
		switch {
		case s.reset:
		case o.reset || len(s.changes)+len(o.rows) > c.cfg.SubscriptionCap:
			s.reset, s.changes = true, nil
		default:
			s.changes = append(s.changes, o.rows...)
		}
		if n := min(len(o.traces), maxTraces-len(s.traces)); n > 0 {
			s.traces = append(s.traces, o.traces[:n]...)
		}
		s.signal()
	}
}

func (c *Consumer) hasSubscribers() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.subs) > 0
}

// changeBatch collects one SQLite transaction's row changes, up to a cap.
type changeBatch struct {
	cap     int
	reset   bool
	changes []RowChange
}

func (b *changeBatch) RowChanged(rc replica.RowChange) {
	if b.reset {
		return
	}
	if len(b.changes) >= b.cap {
		b.setReset()
		return
	}
	b.changes = append(b.changes, rc)
}

func (b *changeBatch) TableChanged(string) { b.setReset() }

func (b *changeBatch) setReset() { b.reset, b.changes = true, nil }
