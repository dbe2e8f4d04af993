package viewsyncer

import (
	"context"
	"runtime"
	"time"
)

// Fairness between groups (issue 15, point 1). A group's config change
// hydrates under its lock, on a read connection of its own, for as long
// as its queries take. Three things keep that from holding up the others:
//
//   - The replica's advance reads from its own connections (Server.advDB),
//     so no hydration can leave it waiting for the pool.
//   - The advance does not wait for a busy group: it leaves the changes
//     with the group (pendingAdvance), which applies them once free, from
//     its own watermark, instead of re-hydrating.
//   - A group whose queries the changes cannot touch (zql's Affects) is
//     moved on in place, before the others take the snapshots: 1,000
//     such groups cost a watcher of the changed rows a few milliseconds,
//     not their turns through the advance (passQuiet).
//   - A group whose last sync was slow may hold only one of
//     slowReadConns connections of the groups' pool; the rest stay free
//     for the other groups, and for new connections. The advance takes
//     slow groups last.
//
// The Go scheduler shares the CPU between the hydrations that run: a
// light query next to heavy ones takes its share, not its turn. A sync
// that has run for slowSync hydrates its further queries one at a time,
// taking turns with the other long syncs for heavyHydrations slots, so
// that the heavy work leaves most of the CPU to everything else.

// Read connections.
const (
	// groupReadConns is the size of the pool the groups read from for
	// their own syncs: at most one connection per group at a time, since
	// every read happens under the group's lock.
	groupReadConns = 2 * DefaultReadConns
	// slowReadConns bounds the connections of that pool that slow groups
	// hold at once.
	slowReadConns = DefaultReadConns / 2
	// slowSync is how long a sync may take before its group counts as
	// slow, until a config sync of it is quick again.
	slowSync = 250 * time.Millisecond
	// maxPendingRows bounds the changes a busy group keeps; past it the
	// group re-hydrates when free.
	maxPendingRows = 100_000
)

// pendingAdvance is what the advance left with a group it found busy:
// the replica's changes from state version from to to, as the advances
// reported them (shared with the other groups, not copied); reset means
// that the changes up to resetAt cannot be followed: the group must
// re-hydrate, unless its pipelines are there already (a sync that moved
// them past resetAt re-hydrated them), when the parts, which start at
// resetAt, still apply.
type pendingAdvance struct {
	from, to string
	parts    []*changeSet
	rows     int
	reset    bool
	resetAt  string
}

// deferAdvance keeps an advance's changes for g, which was busy; g
// applies them when free (catchUp).
func (g *group) deferAdvance(from, to string, changed *changeSet) {
	g.pendMu.Lock()
	defer g.pendMu.Unlock()
	p := g.pend
	switch {
	case p == nil:
		p = &pendingAdvance{from: from}
		g.pend = p
	case p.to != from:
		// A gap: the group missed an advance (it was loaded meanwhile).
		p.resetTo(to)
	}
	p.to = to
	switch {
	case changed == nil:
		p.resetTo(to)
	case p.resetAt != to:
		p.parts = append(p.parts, changed)
		p.rows += len(changed.rows)
		if p.rows > maxPendingRows {
			p.resetTo(to)
		}
	}
}

// resetTo drops p's changes up to to, which cannot be followed.
func (p *pendingAdvance) resetTo(to string) {
	p.reset, p.resetAt = true, to
	p.parts, p.rows = nil, 0
}

// merged is p's changes and then more's, in one change set; nil if p
// must re-hydrate.
func (p *pendingAdvance) merged(more *changeSet) *changeSet {
	if p.reset {
		return nil
	}
	parts := p.parts
	if more != nil {
		parts = append(parts[:len(parts):len(parts)], more)
	}
	cs := &changeSet{}
	for _, part := range parts {
		cs.rows = append(cs.rows, part.rows...)
	}
	return cs
}

// hasPending reports whether an advance left changes with g.
func (g *group) hasPending() bool {
	g.pendMu.Lock()
	defer g.pendMu.Unlock()
	return g.pend != nil
}

// takePending merges what the advance left with g into a sync's changes,
// which lead from state version from to to; g's pipelines are at state
// version at. It returns the changes to apply and where they start. g's
// lock is held.
func (g *group) takePending(from, to, at string, changed *changeSet) (string, *changeSet) {
	g.pendMu.Lock()
	defer g.pendMu.Unlock()
	p := g.pend
	if p != nil && p.reset && p.resetAt <= at {
		// The pipelines are past what could not be followed: the rest
		// follows from there.
		p.from, p.reset = p.resetAt, false
	}
	switch {
	case p == nil:
		return from, changed
	case changed == nil:
		// Re-hydrating anyway, at a snapshot no older than the changes
		// left: they are covered.
		if p.to <= to {
			g.pend = nil
		}
		return from, nil
	case p.to == to && p.from <= at:
		// The changes left end where this sync does: they include its
		// own (an advance that found g busy, then free).
		g.pend = nil
		return p.from, p.merged(nil)
	case p.to == from && p.from <= at:
		g.pend = nil
		return p.from, p.merged(changed)
	case p.to <= at:
		g.pend = nil // stale: the group is past them
	}
	return from, changed
}

// unlockAndCatchUp lets go of g's lock; if an advance left changes with g
// meanwhile, g applies them in the background.
func (g *group) unlockAndCatchUp() {
	dropped := g.takeDropped()
	g.mu.Unlock()
	g.s.requestRelease(dropped)
	if g.hasPending() && g.catchingUp.CompareAndSwap(false, true) {
		go g.catchUp()
	}
}

// catchUp applies what the advance left with g, when the replica is still
// where the advance left it; when it moved on, the next advance brings
// the rest and applies all of it. An advance that found g busy with the
// catch-up itself has it run again.
func (g *group) catchUp() {
	for {
		seen := g.catchUpOnce()
		g.catchingUp.Store(false)
		g.pendMu.Lock()
		again := g.pend != nil && g.pend.to != seen
		g.pendMu.Unlock()
		if !again || !g.catchingUp.CompareAndSwap(false, true) {
			return
		}
	}
}

// catchUpOnce is one try of catchUp; it returns the end of the changes it
// found.
func (g *group) catchUpOnce() (seen string) {
	defer g.contain("catch-up")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pendMu.Lock()
	p := g.pend
	g.pendMu.Unlock()
	if p == nil {
		return ""
	}
	if g.unloaded || g.cvr == nil || !g.hasReady() {
		return p.to
	}
	if p.to <= g.pipelinesAt() {
		g.takePending(p.to, p.to, p.to, nil)
		return p.to
	}
	snap, err := g.openSnapshot(ctx)
	if err != nil || snap == nil {
		return p.to
	}
	defer snap.close()
	if snap.version != p.to {
		return p.to // the next advance carries on from p.to
	}
	err = g.syncAt(ctx, snap)
	if err == nil {
		g.cc.SetRetransformReady(true)
	} else if ctx.Err() == nil {
		g.log.Error("catch up group", "err", err)
	}
	g.dropIfBroken()
	return p.to
}

// openSnapshot opens a snapshot for g's own sync, from the groups' pool:
// a slow group waits for one of slowReadConns first.
func (g *group) openSnapshot(ctx context.Context) (*snapshot, error) {
	var release func()
	if g.slow.Load() {
		select {
		case g.s.slowReads <- struct{}{}:
			release = func() { <-g.s.slowReads }
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	snap, err := g.s.openSnapshot(ctx)
	if snap == nil && release != nil {
		release()
	} else if snap != nil {
		snap.release = release
	}
	return snap, err
}

// hydrationTurn waits, for a sync that began at start and has run past
// slowSync, for one of the slots long syncs hydrate in, one query a turn;
// done gives it back. Waiters are served in order.
func (s *Server) hydrationTurn(ctx context.Context, start time.Time) (done func(), err error) {
	if start.IsZero() || time.Since(start) < slowSync {
		return func() {}, nil
	}
	select {
	case s.heavyTurns <- struct{}{}:
		return func() { <-s.heavyTurns }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// heavyHydrations is how many queries of long syncs hydrate at once: half
// the CPUs, at least one.
func heavyHydrations() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// timeSync records how long a config sync of g took: a slow one makes g
// slow for its next reads.
func (g *group) timeSync(d time.Duration) {
	g.syncTime += d
	g.slow.Store(d > slowSync)
}
