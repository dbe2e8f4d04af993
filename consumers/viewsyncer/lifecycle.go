package viewsyncer

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/streams"
)

// A group's life: loaded (or created) by its first connection, advanced
// with the replica while it has ready connections, its expired queries
// evicted, then unloaded when idle, drained at shutdown, stopped when its
// lease is lost, or dropped when a sync broke it.

// group returns the client group id, loading it, or creating it, once:
// concurrent connections of a group wait for the first one's load.
func (s *Server) group(ctx context.Context, id string) (*group, error) {
	s.mu.Lock()
	for s.dropping[id] != nil {
		done := s.dropping[id]
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
	g := s.groups[id]
	if g == nil {
		g = &group{
			s: s, id: id, log: s.log.With(logkey.ClientGroup, id),
			pipelines: map[string]*pipeline{}, conns: map[string]*conn{},
			loaded: make(chan struct{}), maint: make(chan struct{}, 1),
		}
		g.cc = s.newAuthManager(g)
		s.groups[id] = g
		s.mu.Unlock()
		c, err := s.store.Load(ctx, id)
		if c == nil && err == nil {
			c = cvrstore.New(id)
		}
		s.mu.Lock()
		if err != nil {
			g.loadErr = err
			delete(s.groups, id)
		} else {
			g.cvr, g.cold, g.idleSince = c, c.Version != "", time.Now()
			g.leaseDone = c.LeaseDone()
		}
		close(g.loaded)
	}
	s.mu.Unlock()
	select {
	case <-g.loaded:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if g.loadErr != nil {
		return nil, fmt.Errorf("load cvr %s: %w", id, g.loadErr)
	}
	return g, nil
}

// advance moves the group to snap, updating the queries that read a
// changed table (re-hydrating all of them when changed is nil). Groups without
// connections wait: they re-hydrate when a client returns. A busy group
// is not waited for: it gets the changes to apply once free (fair.go).
func (g *group) advance(ctx context.Context, snap *snapshot, changed *changeSet) error {
	if !g.mu.TryLock() {
		g.deferAdvance(snap.from, snap.version, changed)
		// Its holder may have let go before the changes were left: then
		// nobody would apply them.
		if !g.mu.TryLock() {
			return nil
		}
	}
	defer g.unlockAndCatchUp()
	if !g.hasReady() || g.unloaded || snap.version <= g.pipelinesAt() {
		return nil
	}
	if hook := advanceHook.Load(); hook != nil {
		(*hook)(g.id)
	}
	start := time.Now()
	defer func() { g.s.metrics.advanceTime.Observe(time.Since(start).Seconds()) }()
	syncStart := time.Now()
	err := g.sync(ctx, snap, changed)
	if d := time.Since(syncStart); d > slowSync {
		g.slow.Store(true)
	}
	if err == nil {
		// The pipelines are synced: background retransforms may run.
		g.cc.SetRetransformReady(true)
	}
	g.dropIfBroken()
	return err
}

// passQuiet moves g to snap with no snapshot, CVR update or flush when
// no change in changed can touch its rows, and reports whether it did:
// most groups an advance visits are such (issue 15's reconnect storm:
// 1,000 groups each holding a query on the table a hot query's writes
// change), and the full advance took each of them through the advance's
// few snapshots in turn. It reports false, with nothing changed that
// g.advance would not change alike, for a busy group (which g.advance
// leaves the changes with) and for one that needs more than that: a query
// to hydrate, expire or update, a client to poke, a record to write.
func (g *group) passQuiet(snap *snapshot, changed *changeSet) bool {
	if changed == nil || !g.mu.TryLock() {
		return false
	}
	defer g.unlockAndCatchUp()
	if !g.hasReady() || g.unloaded || snap.version <= g.pipelinesAt() {
		return true // what g.advance would do: nothing
	}
	if g.broken || g.cold || g.hasPending() || g.pipelinesAt() != snap.from ||
		g.cvr.ReplicaVersion != snap.replicaVersion || g.wouldPoke() || !g.s.store.Quiet(g.cvr) {
		return false
	}
	now := g.ttlClock(time.Now())
	for h, p := range g.pipelines {
		if p.rehydrate || p.shared != nil && p.at != snap.from || !g.prepared(p, snap) ||
			!p.internal && g.queryExpired(h, now) || p.affected(changed) {
			return false
		}
	}
	for h := range g.cvr.Queries {
		if _, ok := g.pipelines[h]; !ok {
			return false // one to hydrate, or to drop with its rows
		}
	}
	// An array, not a map: this runs for every quiet group at every commit.
	for _, iq := range [...]struct{ hash, table string }{{lmidsQuery, g.s.clientsTable}, {mutationsQuery, g.s.mutationsTable}} {
		if _, ok := g.pipelines[iq.hash]; !ok {
			if _, ok := snap.schema.tables[iq.table]; ok {
				return false // an internal query to add
			}
		}
	}
	for _, p := range g.pipelines {
		p.pass(snap)
	}
	for _, p := range g.pipelines {
		if p.rehydrate {
			return false // it left its shared view: the full advance hydrates it
		}
	}
	g.at = max(g.at, snap.version)
	g.s.metrics.idleSyncs.Inc()
	g.cc.SetRetransformReady(true)
	return true
}

// prepared reports whether p runs the query g.prepare would compile for
// snap, without compiling anything.
func (g *group) prepared(p *pipeline, snap *snapshot) bool {
	switch {
	case p.query == nil || p.schema != snap.schema:
		return false
	case p.internal:
		return true
	case p.custom:
		q := g.cvr.Queries[p.hash]
		return q != nil && q.AST != nil && q.TransformationHash == p.transformed
	}
	return p.perms == snap.perms && p.authGen == g.authGen
}

// wouldPoke reports whether a sync that changed nothing would still poke
// a client of g (one not told of the CVR's version yet).
func (g *group) wouldPoke() bool {
	v := g.cvr.Version
	for _, c := range g.conns {
		if c.ready && !(c.hasBase && (c.base > v || c.base == v && c.everPoked)) {
			return true
		}
	}
	return false
}

// transformPending transforms the synced queries that are still waiting
// for their AST, then syncs the group so that they hydrate. A config change
// transforms only when there is a snapshot to sync at, so the queries of
// clients that connected before the replica existed wait for the replica;
// the group's maintenance round then transforms them, without the group's
// lock, through a ready connection, as a config change of its client
// would. A failure is that client's, and it is sent away with it (its
// reconnect transforms again), while the group's other queries go on.
func (g *group) transformPending(ctx context.Context) {
	if !g.s.api.QueryConfigured() || g.s.cfg.Replica.State().Watermark == "" {
		return
	}
	tried := map[*conn]bool{}
	for {
		unlock := g.lock()
		v, req, ok := g.pendingRequest(tried)
		unlock()
		if !ok {
			return
		}
		tried[v.c] = true
		res, err := g.callTransform(ctx, req)
		g.applyPending(ctx, v, res, err)
	}
}

// pendingRequest is the transform of the pending synced queries through
// a ready connection not tried yet; g's lock is held.
func (g *group) pendingRequest(tried map[*conn]bool) (*via, appapi.TransformRequest, bool) {
	if g.unloaded || g.broken || !g.hasPendingTransform() {
		return nil, appapi.TransformRequest{}, false
	}
	for _, c := range g.sortedConns() {
		// A connection whose message is being handled transforms through
		// that handler, and one being sent away (its own transform failed,
		// say) must not transform again.
		if !c.ready || tried[c] || c.handling.Load() || c.isClosing() {
			continue
		}
		v, err := g.viaConn(c, false)
		if err != nil {
			continue
		}
		if req, ok := g.transformRequest(v, g.ttlClock(time.Now())); ok {
			return v, req, true
		}
	}
	return nil, appapi.TransformRequest{}, false
}

// applyPending applies a pending transform through v, if v is still
// current, and syncs the group at a fresh snapshot.
func (g *group) applyPending(ctx context.Context, v *via, res appapi.TransformResult, err error) {
	unlock := g.lock()
	defer unlock()
	c := g.currentConn(v.ac)
	if c == nil || !c.ready {
		return
	}
	if err == nil {
		err = g.validateVia(v, g.applyTransform(res))
	} else if appapi.IsAuth(err) {
		g.cc.Fail(v.ac.Selector, v.ac.Revision)
	}
	if err != nil {
		g.log.Warn("transform queued synced queries", logkey.Client, c.clientID, "err", err)
		c.ready = false
		c.failErr(err)
		return
	}
	snap, err := g.s.openSnapshot(ctx)
	if err != nil || snap == nil {
		if err != nil {
			g.log.Error("sync transformed synced queries", "err", err)
		}
		return
	}
	defer snap.close()
	if err := g.checkTransformed(snap); err != nil {
		c.ready = false
		c.failErr(err)
		return
	}
	if err := g.syncAt(ctx, snap); err != nil && ctx.Err() == nil {
		g.log.Error("sync transformed synced queries", "err", err)
	}
	g.dropIfBroken()
}

// hasPendingTransform reports whether a live synced query waits for its AST.
func (g *group) hasPendingTransform() bool {
	clock := g.ttlClock(time.Now())
	for h, q := range g.cvr.Queries {
		if q.PendingTransform() && !g.queryExpired(h, clock) {
			return true
		}
	}
	return false
}

func (g *group) hasReady() bool {
	for _, c := range g.conns {
		if c.ready {
			return true
		}
	}
	return false
}

// scheduleMaintenance sets when g's next maintenance round is due, from
// what the round just found: the next query to expire, the idle unload,
// the next prune, a transform still waiting (due at once), and at the
// latest maintenanceEvery from now.
func (g *group) scheduleMaintenance(now time.Time) {
	due := now.Add(maintenanceEvery)
	unlock := g.lock()
	if !g.unloaded && g.cvr != nil {
		if len(g.conns) == 0 {
			due = earliest(due, g.idleSince.Add(g.s.cfg.GroupIdle))
		}
		// The TTL clock runs no faster than the wall's.
		clock := g.ttlClock(now)
		if next, ok := g.nextEviction(clock); ok {
			due = earliest(due, now.Add(time.Duration((next-clock)*float64(time.Millisecond))))
		}
		if g.hasPendingTransform() {
			due = now
		}
	}
	unlock()
	if p := g.pruneDue.Load(); p != 0 {
		due = earliest(due, time.Unix(0, p))
	}
	for {
		cur := g.maintAt.Load()
		if due.UnixNano() >= cur || g.maintAt.CompareAndSwap(cur, due.UnixNano()) {
			return
		}
	}
}

// wakeMaintenance makes g's maintenance due at the next tick.
func (g *group) wakeMaintenance() { g.maintAt.Store(0) }

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// evict removes the queries whose TTL ran out.
func (g *group) evict(ctx context.Context, now time.Time) error {
	unlock := g.lock()
	defer unlock()
	if !g.hasReady() || g.unloaded {
		return nil
	}
	clock := g.ttlClock(now)
	next, ok := g.nextEviction(clock)
	if !ok || next > clock {
		return nil
	}
	snap, err := g.openSnapshot(ctx)
	if err != nil || snap == nil {
		return err
	}
	defer snap.close()
	err = g.syncAt(ctx, snap)
	g.dropIfBroken()
	return err
}

// syncAt syncs the group at a fresh snapshot: only query-set changes,
// unless the snapshot is newer than the group's rows.
func (g *group) syncAt(ctx context.Context, snap *snapshot) error {
	snap.from = snap.version
	return g.sync(ctx, snap, &changeSet{})
}

// unloadIfIdle marks the group unloaded once it has had no connection for
// GroupIdle, persisting its stopped TTL clock; the caller then removes it
// and gives its lease up. Its pipelines go with it: a returning client
// re-hydrates them from the durable CVR.
func (g *group) unloadIfIdle(ctx context.Context, now time.Time) bool {
	unlock := g.lock()
	defer unlock()
	if g.unloaded || len(g.conns) > 0 || now.Sub(g.idleSince) < g.s.cfg.GroupIdle {
		return false
	}
	g.persistClock(ctx)
	g.unloaded = true
	g.stopLocked()
	g.pipelines, g.at = nil, ""
	g.log.Debug("unloaded idle client group")
	return true
}

// persistClock writes the TTL clock, which only a durable store keeps, and
// only for a group that has a version.
func (g *group) persistClock(ctx context.Context) {
	if g.broken || !g.cvr.Durable() || g.cvr.Version == "" {
		return
	}
	u := g.cvr.BeginConfig()
	u.Clock = true
	if err := g.s.store.Flush(ctx, g.cvr, u); err != nil {
		g.log.Warn("persist the ttl clock", "err", err)
	}
}

// stopLocked stops what runs for a group leaving memory: its maintenance
// timer and its pusher.
func (g *group) stopLocked() {
	g.count(true)
	g.cc.Stop()
	g.stopPusherLocked()
}

func (s *Server) removeGroup(g *group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groups[g.id] == g {
		delete(s.groups, g.id)
	}
}

// leaseLost stops serving a group whose ownership moved: its clients are
// sent to reconnect at once, as zero-cache's OwnershipError does.
func (s *Server) leaseLost(g *group) {
	// The new owner is read before the lock: nothing waits on NATS
	// under it.
	owner := s.ownerOf(g.id)
	g.mu.Lock()
	if !g.unloaded {
		g.unloaded = true
		g.stopLocked()
		g.log.Info("cvr lease lost; closing the group's connections", "err", g.cvr.LeaseErr())
		perr := ownershipError(owner, time.Now())
		for _, c := range g.conns {
			c.ready = false
			c.fail(perr)
		}
	}
	g.mu.Unlock()
	s.removeGroup(g)
}

// ownerOf reads who owns a group now, for the Rehome message.
func (s *Server) ownerOf(id string) streams.CVROwner {
	if s.owners == nil {
		return streams.CVROwner{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	o, _ := s.owners.Owner(ctx, id)
	return o
}

// ownershipError is zero-cache's OwnershipError: Rehome, reconnect at once.
func ownershipError(o streams.CVROwner, lastConnect time.Time) *protocolError {
	owner := o.ID
	if owner == "" {
		owner = "null"
	}
	perr := newProtocolError(kindRehome, "CVR ownership was transferred to %s at %s (last connect time: %s)",
		owner, isoTime(time.UnixMilli(o.GrantedMs)), isoTime(lastConnect))
	zero := 0
	perr.MaxBackoffMs = &zero
	return perr
}

// isoTime formats t as JavaScript's Date.toISOString does.
func isoTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// dropIfBroken forgets a group whose sync failed halfway. Its clients are
// sent away with Rehome; when they return, the group is unknown and they
// start over (ClientNotFound), as after a lost CVR.
func (g *group) dropIfBroken() {
	if !g.broken || g.unloaded {
		return
	}
	g.drop(newProtocolError(kindRehome, "Reconnect required"))
}

// drop forgets g, sending its clients away with err. g's lock is held.
func (g *group) drop(err *protocolError) {
	g.unloaded = true
	g.stopLocked()
	g.s.dropGroup(g)
	for _, c := range g.conns {
		c.ready = false
		c.fail(err)
	}
}

// contain, deferred by a goroutine that works on g outside any HTTP
// handler, keeps a panic there to g: it logs the stack, fails g's sockets
// with an Internal error and drops g, and the goroutine goes on with the
// other groups. The panicking code must have released g's lock (each
// lock() is paired with a deferred unlock).
func (g *group) contain(where string) {
	if r := recover(); r != nil {
		g.failPanic(where, r)
	}
}

// failPanic is contain's work once r was recovered, in the deferred call,
// so that the stack logged is the panic's.
func (g *group) failPanic(where string, r any) {
	g.log.Error("panic", "in", where, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	unlock := g.lock()
	defer unlock()
	if g.unloaded {
		return
	}
	g.broken = true
	g.drop(internalPanicError(where))
}

func internalPanicError(where string) *protocolError {
	return newProtocolError(kindInternal, "Internal error in the view-syncer (%s); the client group was reset", where)
}

// advanceHook, when a test sets it, runs in each group's advance, under
// its lock: a way to make one group panic.
var advanceHook atomic.Pointer[func(id string)]

// maintenanceHook, when a test sets it, runs at the start of each group's
// maintenance round.
var maintenanceHook atomic.Pointer[func(id string)]

// panicHook, when a test sets it, runs where a goroutine outside the HTTP
// handler works for a group (the connection's writer, the pusher, a
// relay), with that place's name: a way to make it panic there.
var panicHook atomic.Pointer[func(where, group string)]

func testPanicHook(where, group string) {
	if hook := panicHook.Load(); hook != nil {
		(*hook)(where, group)
	}
}

// dropGroup forgets g in memory and in the store. The store's I/O runs
// outside s.mu, which every new connection takes; a connection of the same
// group meanwhile waits in group for the drop to end, so that it loads what
// was durably written, not the copy being dropped.
func (s *Server) dropGroup(g *group) {
	done := make(chan struct{})
	s.mu.Lock()
	if s.groups[g.id] == g {
		delete(s.groups, g.id)
	}
	s.dropping[g.id] = done
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.dropping, g.id)
		s.mu.Unlock()
		close(done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.store.Drop(ctx, g.cvr)
}

// Drain pacing (zero-cache's drain-coordinator.ts): after a group's
// clients are sent away, the next group waits the group's hydration time
// divided by drainUtilization, so that the servers they reconnect to are
// not swamped. jetsync bounds each wait and the whole drain, which must
// end before the orchestrator's kill.
const (
	drainUtilization = 0.6
	drainPadding     = 2 * time.Millisecond
	maxDrainPause    = time.Second
	maxDrain         = 10 * time.Second
)

// closeAll drains the server: group by group, paced, it stops the group,
// persists its TTL clock, gives its lease up, so that a peer can serve it
// at once, and closes its connections with a plain close, on which the
// clients reconnect (zero-cache's drain). Connections that arrive
// meanwhile are sent away with Rehome.
func (s *Server) closeAll() {
	s.draining.Store(true)
	defer s.bg.Wait()
	groups := s.groupList()
	if len(groups) == 0 {
		return
	}
	start := time.Now()
	s.log.Info("draining client groups", "groups", len(groups))
	for i, g := range groups {
		pause := s.drainGroup(g)
		if i == len(groups)-1 {
			break
		}
		pause = min(time.Duration(float64(pause)/drainUtilization)+drainPadding, maxDrainPause, maxDrain-time.Since(start))
		if pause > 0 {
			time.Sleep(pause)
		}
	}
	s.log.Info("drained client groups", "groups", len(groups), "elapsed", time.Since(start).Round(time.Millisecond))
}

// drainGroup unloads g and closes its connections; it returns the time g
// spent hydrating, which its clients' reconnection costs elsewhere.
func (s *Server) drainGroup(g *group) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock := g.lock()
	defer unlock()
	for _, c := range g.conns {
		c.ready = false
	}
	if !g.unloaded {
		g.persistClock(ctx)
		g.unloaded = true
		g.stopLocked()
		s.removeGroup(g)
		s.store.Unload(ctx, g.cvr)
	}
	for _, c := range g.conns {
		c.closeQuietly()
	}
	return g.syncTime
}
