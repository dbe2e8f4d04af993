package viewsyncer

import (
	"context"
	"runtime/debug"
	"time"
)

// Returning memory to the OS after a group lets go of many rows.
//
// A whole-table query grows the Go heap to twice its live size, and the
// collector keeps those pages after the query goes: the runtime's own
// scavenger hands them back over seconds. Anything that arrives meanwhile
// (in bench/viewsyncer, 50 groups hydrating at once, with their SQLite
// memory outside the Go heap) then stacks on top of them, and that sum is
// the process's peak. So once a group drops the rows of big queries (a
// query removed, or its last client gone), the server forces a collection
// and frees what it leaves at once, at most once per releaseInterval.

const (
	// releaseRows is how many dropped rows make a group ask for the
	// release: a whole-table query, not the usual windows of a few
	// hundred rows, which the collector's own pace handles.
	releaseRows = 20_000
	// releaseInterval spaces the releases: each costs a full collection.
	releaseInterval = time.Second
)

// release holds the server's release requests.
type release struct {
	// rows is Server.releaseRows's threshold; tests lower it.
	rows int
	// wake is signalled, without blocking, to ask for a release.
	wake chan struct{}
	// free returns the memory: debug.FreeOSMemory, or a test's stand-in.
	free func()
}

func newRelease() release {
	return release{rows: releaseRows, wake: make(chan struct{}, 1), free: debug.FreeOSMemory}
}

// dropped records that g let go of n rows' values; the group's unlock
// asks for the release (g.mu held).
func (g *group) dropped(n int) { g.droppedRows += n }

// takeDropped returns and resets the rows g dropped since the last call
// (g.mu held).
func (g *group) takeDropped() int {
	n := g.droppedRows
	g.droppedRows = 0
	return n
}

// requestRelease asks for a release if n dropped rows are enough.
func (s *Server) requestRelease(n int) {
	if n < s.rel.rows {
		return
	}
	select {
	case s.rel.wake <- struct{}{}:
	default:
	}
}

// releaseLoop serves the release requests until ctx ends.
func (s *Server) releaseLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.rel.wake:
		}
		s.rel.free()
		select {
		case <-ctx.Done():
			return
		case <-time.After(releaseInterval):
		}
	}
}
