package viewsyncer

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// Bounds on what clients can make the server hold (docs/protocol.md §10):
// sockets, bytes queued to them, desired queries, and the process's memory.
const (
	// DefaultMaxConnections is how many sync sockets one server serves
	// at once (relayed ones included); more are refused ServerOverloaded.
	DefaultMaxConnections = 10000
	// DefaultSendBudgetBytes bounds the bytes queued to all sockets
	// together: past it the readers holding the most are closed first.
	DefaultSendBudgetBytes = 256 << 20
	// DefaultMaxQueriesPerClient bounds one client's desired queries
	// (active, or inactive with their TTL running). The real client keeps
	// a query desired while a view of it is open, and for its TTL after.
	DefaultMaxQueriesPerClient = 2000
)

// Memory pressure levels, as fractions of Config.MemoryLimit: from
// shedFraction the server refuses new sockets and new queries and keeps
// its send queues to a quarter of their budget; from dropFraction it
// refuses sockets before the upgrade (HTTP 503) and keeps the queues to a
// sixteenth, closing the sockets that hold the most.
const (
	// From cautionFraction, hydrations of new queries run one at a time,
	// each admitted on a fresh reading: the ones in flight when the
	// pressure rises would otherwise overshoot it together. A hydration
	// admitted just under shedFraction still adds what it holds, tens of
	// MiB for a large one, so shedFraction leaves that much headroom.
	cautionFraction = 0.30
	shedFraction    = 0.60
	dropFraction    = 0.85
	// memorySample is how often the memory monitor reads the process's
	// resident size.
	memorySample = 50 * time.Millisecond
	// freeInterval spaces the monitor's forced collections while under
	// pressure: garbage, and free pages the runtime keeps, would otherwise
	// hold the resident size up, and the server refusing work, long after
	// the load left.
	freeInterval = 5 * time.Second
	// overloadBackoffMs is the least a refused client waits before it
	// reconnects.
	overloadBackoffMs = 2000
)

type pressure int32

const (
	pressureNone pressure = iota
	pressureShed
	pressureDrop
)

// admission is the server's account of what the bounds cover.
type admission struct {
	// sockets counts admitted sync sockets, relays included.
	sockets atomic.Int64
	// queued is the bytes queued to, or being written to, every socket.
	queued atomic.Int64
	level  atomic.Int32
	// rss is the last resident size the monitor read (0 when it does not
	// run).
	rss atomic.Int64

	// mu guards conns; it is a leaf: nothing is taken under it.
	mu    sync.Mutex
	conns map[*conn]struct{}
	// shedding serialises shed passes, so that two enqueues over the
	// budget do not both close a victim for the same overflow.
	shedding sync.Mutex
	// hydrating is held by the one hydration of new queries that runs
	// under caution (admitHydration).
	hydrating sync.Mutex
	// inflight holds a token for each hydration of new queries running
	// under a memory limit (admitHydration).
	inflight chan struct{}
}

func (a *admission) pressure() pressure { return pressure(a.level.Load()) }

func (a *admission) add(c *conn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conns == nil {
		a.conns = map[*conn]struct{}{}
	}
	a.conns[c] = struct{}{}
}

func (a *admission) remove(c *conn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.conns, c)
}

// overloaded is the retryable refusal a client gets while the server is at
// a bound: the real client backs off at least minBackoffMs, then retries.
func overloaded(format string, args ...any) *protocolError {
	perr := newProtocolError(kindServerOverloaded, format, args...)
	d := overloadBackoffMs
	perr.MinBackoffMs = &d
	return perr
}

// admit takes a socket slot, or says why the socket is refused: nil and
// false before the upgrade (HTTP 503), a protocol error after it.
func (s *Server) admit() (release func(), refuse *protocolError, early bool) {
	a := &s.adm
	if a.pressure() >= pressureDrop {
		s.metrics.refused.WithLabelValues("memory").Inc()
		return nil, nil, true
	}
	n := a.sockets.Add(1)
	release = func() { a.sockets.Add(-1) }
	switch {
	case s.cfg.MaxConnections > 0 && n > int64(s.cfg.MaxConnections):
		release()
		s.metrics.refused.WithLabelValues("connections").Inc()
		return nil, overloaded("Too many connections: this server serves at most %d", s.cfg.MaxConnections), false
	case a.pressure() >= pressureShed:
		release()
		s.metrics.refused.WithLabelValues("memory").Inc()
		return nil, overloaded("Server is low on memory"), false
	}
	return release, nil, false
}

// refuseEarly answers an upgrade request the server cannot afford to
// upgrade.
func refuseEarly(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(overloadBackoffMs/1000))
	http.Error(w, "server overloaded", http.StatusServiceUnavailable)
}

// sendBudget is the bytes all send queues may hold at the current memory
// pressure.
func (s *Server) sendBudget() int64 {
	b := s.cfg.SendBudgetBytes
	switch s.adm.pressure() {
	case pressureShed:
		b /= 4
	case pressureDrop:
		b /= 16
	}
	return b
}

// shed closes the sockets holding the most queued bytes until the queues
// fit the budget. Called without locks: it takes each victim's qmu alone.
func (s *Server) shed() {
	a := &s.adm
	budget := s.sendBudget()
	if a.queued.Load() <= budget {
		return
	}
	a.shedding.Lock()
	defer a.shedding.Unlock()
	if a.queued.Load() <= budget {
		return
	}
	a.mu.Lock()
	conns := make([]*conn, 0, len(a.conns))
	for c := range a.conns {
		if c.held.Load() > 0 {
			conns = append(conns, c)
		}
	}
	a.mu.Unlock()
	slices.SortFunc(conns, func(x, y *conn) int {
		switch hx, hy := x.held.Load(), y.held.Load(); {
		case hx > hy:
			return -1
		case hx < hy:
			return 1
		}
		return 0
	})
	for _, c := range conns {
		if a.queued.Load() <= budget {
			return
		}
		c.closeSlow()
	}
}

// closeSlow closes a socket whose reader fell behind: what is queued to it
// is dropped at once (it catches up when it reconnects), and a write
// blocked on it is cut short.
func (c *conn) closeSlow() {
	c.qmu.Lock()
	if c.closing {
		c.qmu.Unlock()
		return
	}
	c.slow.Store(true)
	dropped := c.dropQueueLocked()
	c.s.metrics.closedSlow.Inc()
	c.log.Warn("closing a client that does not keep up", "queued_bytes", dropped, "all_queued_bytes", c.s.adm.queued.Load())
	// zero-cache has no such bound, so no error kind for it: a close
	// without an error frame (which a client that does not read would not
	// see anyway) has the real client reconnect and catch up from its
	// cookie.
	c.setClosingLocked(websocket.CloseTryAgainLater, "send queue full")
	c.qmu.Unlock()
	// The writer may be stuck in a write the client does not read: end it.
	if nc := c.ws.NetConn(); nc != nil {
		_ = nc.SetWriteDeadline(time.Now())
	}
}

// dropQueueLocked empties the queue, giving its bytes back to the budget;
// it returns how many there were.
func (c *conn) dropQueueLocked() int {
	n := c.qbytes
	c.queue, c.qbytes = nil, 0
	c.account(-n)
	return n
}

// account adds n bytes (negative: releases them) to the socket's share of
// the send budget.
func (c *conn) account(n int) {
	c.held.Add(int64(n))
	c.s.adm.queued.Add(int64(n))
}

// monitorMemory samples the process's resident size until ctx ends and
// sets the pressure level from it; a rise sheds the send queues at once.
func (s *Server) monitorMemory(ctx context.Context) {
	limit := s.cfg.MemoryLimit
	if limit <= 0 {
		return
	}
	t := time.NewTicker(memorySample)
	defer t.Stop()
	last := pressureNone
	var freed time.Time
	for {
		rss := residentBytes()
		lvl := levelAt(rss, limit)
		if lvl > pressureNone && time.Since(freed) >= freeInterval {
			debug.FreeOSMemory()
			freed = time.Now()
			rss = residentBytes()
			lvl = levelAt(rss, limit)
		}
		s.adm.rss.Store(rss)
		s.adm.level.Store(int32(lvl))
		if lvl != last {
			s.log.Warn("memory pressure changed", "level", lvl.String(), "rss", rss, "limit", limit)
			last = lvl
		}
		if lvl > pressureNone {
			s.shed()
		}
		select {
		case <-ctx.Done():
			s.adm.level.Store(int32(pressureNone))
			return
		case <-t.C:
		}
	}
}

func levelAt(rss, limit int64) pressure {
	switch {
	case float64(rss) >= dropFraction*float64(limit):
		return pressureDrop
	case float64(rss) >= shedFraction*float64(limit):
		return pressureShed
	}
	return pressureNone
}

func (p pressure) String() string {
	switch p {
	case pressureShed:
		return "shed"
	case pressureDrop:
		return "drop"
	}
	return "none"
}

// residentBytes is the process's resident set size from /proc, or, where
// there is none, the memory the Go runtime holds from the OS.
func residentBytes() int64 {
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := bytes.Fields(b); len(f) > 1 {
			if pages, err := strconv.ParseInt(string(f[1]), 10, 64); err == nil {
				return pages * int64(os.Getpagesize())
			}
		}
	}
	samples := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	rtmetrics.Read(samples)
	if samples[0].Value.Kind() != rtmetrics.KindUint64 || samples[1].Value.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return int64(samples[0].Value.Uint64() - samples[1].Value.Uint64())
}

// sharedWriteBuffers lends write buffers to sockets only while they write,
// so that an idle socket holds none.
var sharedWriteBuffers websocket.BufferPool = &sync.Pool{}

// checkQueries refuses, before anything is saved, a patch that would leave
// the client desiring more queries than the bound (active ones, and
// inactive ones whose TTL still runs), and under memory pressure any
// query the group does not have yet. Called with g.mu held; the caller
// runs release once the patch's queries hydrated.
func (g *group) checkQueries(clientID string, ops []queryPatchOp, clock float64) (release func(), perr *protocolError) {
	limit := g.s.cfg.MaxQueriesPerClient
	n, added := g.desiredAfter(clientID, ops, clock)
	if limit > 0 && n > limit {
		g.s.metrics.refused.WithLabelValues("queries").Inc()
		return nil, newProtocolError(kindInternal, "Too many queries: a client may desire at most %d at once, counting those whose TTL still runs", limit)
	}
	if !added {
		return func() {}, nil
	}
	return g.s.admitHydration()
}

// tooManyQueries reports whether checkQueries refuses ops for their
// number. g.mu is held.
func (g *group) tooManyQueries(clientID string, ops []queryPatchOp, clock float64) bool {
	n, _ := g.desiredAfter(clientID, ops, clock)
	return g.s.cfg.MaxQueriesPerClient > 0 && n > g.s.cfg.MaxQueriesPerClient
}

// desiredAfter is how many queries the client would desire after ops,
// and whether ops add one the group does not have. g.mu is held.
func (g *group) desiredAfter(clientID string, ops []queryPatchOp, clock float64) (n int, added bool) {
	held := map[string]bool{}
	if cl := g.cvr.Clients[clientID]; cl != nil {
		for hash, d := range cl.Desired {
			if !d.Expired(clock) {
				held[hash] = true
			}
		}
	}
	for _, op := range ops {
		switch op.Op {
		case "put":
			if !held[op.Hash] {
				held[op.Hash] = true
				if g.cvr.Queries[op.Hash] == nil {
					added = true
				}
			}
		case "clear":
			clear(held)
		}
	}
	return len(held), added
}

// errLowMemory refuses new queries under memory pressure.
var errLowMemory = overloaded("Server is low on memory: new queries are refused for now")

// admitHydration admits the hydration of new queries: refused under
// pressure; under a memory limit, at most GOMAXPROCS at once, since a
// burst admitted together while the resident size was low would
// overshoot the limit together; and one at a time under caution, each on
// a fresh reading of the resident size.
func (s *Server) admitHydration() (release func(), perr *protocolError) {
	limit := s.cfg.MemoryLimit
	refuse := func() (func(), *protocolError) {
		s.metrics.refused.WithLabelValues("memory").Inc()
		return nil, errLowMemory
	}
	if s.adm.pressure() >= pressureShed {
		return refuse()
	}
	if limit <= 0 {
		return func() {}, nil
	}
	s.adm.inflight <- struct{}{}
	leave := func() { <-s.adm.inflight }
	if float64(residentBytes()) < cautionFraction*float64(limit) {
		return leave, nil
	}
	s.adm.hydrating.Lock()
	if levelAt(residentBytes(), limit) >= pressureShed {
		s.adm.hydrating.Unlock()
		leave()
		return refuse()
	}
	return func() { s.adm.hydrating.Unlock(); leave() }, nil
}
