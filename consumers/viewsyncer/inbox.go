package viewsyncer

import (
	"context"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// inbox reads a socket's frames ahead of its handler, so that a client
// that goes away is seen at once, even while its handler is busy
// hydrating: the group's work is then cancelled if none of its sockets is
// left (liveConn). It holds at most about limit bytes of frames; past that
// it stops reading until the handler catches up, as the socket did
// before.
type inbox struct {
	limit int
	mu    sync.Mutex
	// frames wait for the handler; err is the read's end, after them.
	frames [][]byte
	bytes  int
	err    error
	ready  chan struct{}
	room   chan struct{}
}

func newInbox(limit int) *inbox {
	return &inbox{limit: limit, ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// readLoop reads ws until it fails, or until done is closed while the
// inbox is full; then it calls gone.
func (in *inbox) readLoop(ws *websocket.Conn, done <-chan struct{}, gone func()) {
	defer gone()
	for {
		_, data, err := ws.ReadMessage()
		in.mu.Lock()
		if err != nil {
			in.err = err
			in.mu.Unlock()
			notify(in.ready)
			return
		}
		in.frames = append(in.frames, data)
		in.bytes += len(data)
		in.mu.Unlock()
		notify(in.ready)
		for {
			in.mu.Lock()
			full := in.bytes >= in.limit
			in.mu.Unlock()
			if !full {
				break
			}
			select {
			case <-in.room:
			case <-done:
				return
			}
		}
	}
}

// next returns the next frame, or the read's error once none is left.
func (in *inbox) next() ([]byte, error) {
	for {
		in.mu.Lock()
		if len(in.frames) > 0 {
			f := in.frames[0]
			in.frames[0] = nil
			in.frames = in.frames[1:]
			in.bytes -= len(f)
			in.mu.Unlock()
			notify(in.room)
			return f, nil
		}
		err := in.err
		in.mu.Unlock()
		if err != nil {
			return nil, err
		}
		<-in.ready
	}
}

// liveSocket is one socket of the group: its handler's cancel, and
// whether the socket closed.
type liveSocket struct {
	cancel context.CancelFunc
	closed bool
}

// abandonGrace is how long a group's work goes on after its last socket
// closed: a client that reconnects at once (a network blip) keeps it. A
// cancelled sync breaks the group (its CVR was half updated), which the
// client then finds gone.
const abandonGrace = time.Second

// liveConn registers c's socket as open, from before it attaches. The
// returned context ends abandonGrace after none of the group's sockets
// is left open (or when parent ends); closed marks c's socket closed, and
// leave forgets it once its handler is done.
func (g *group) liveConn(parent context.Context, c *conn) (ctx context.Context, closed, leave func()) {
	ctx, cancel := context.WithCancel(parent)
	g.liveMu.Lock()
	if g.live == nil {
		g.live = map[*conn]*liveSocket{}
	}
	g.live[c] = &liveSocket{cancel: cancel}
	g.liveMu.Unlock()
	closed = func() {
		g.liveMu.Lock()
		defer g.liveMu.Unlock()
		if ls := g.live[c]; ls != nil {
			ls.closed = true
		}
		if g.abandoned() {
			time.AfterFunc(abandonGrace, func() {
				g.liveMu.Lock()
				defer g.liveMu.Unlock()
				if !g.abandoned() {
					return
				}
				// Nobody is left to want what the group's handlers do.
				for _, x := range g.live {
					x.cancel()
				}
			})
		}
	}
	leave = func() {
		g.liveMu.Lock()
		delete(g.live, c)
		g.liveMu.Unlock()
		cancel()
	}
	return ctx, closed, leave
}

// abandoned reports whether every socket of the group closed. g.liveMu is
// held.
func (g *group) abandoned() bool {
	for _, x := range g.live {
		if !x.closed {
			return false
		}
	}
	return len(g.live) > 0
}
