package viewsyncer

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// A poke is at least three websocket messages (pokeStart, pokePart,
// pokeEnd), and gorilla/websocket writes each to the socket as it is
// sent: three write syscalls per client per poke, a tenth of jetsync's CPU
// when one commit pokes 200 groups (bench/fanout). The writer instead
// holds what it writes in a round of its queue and hands it to the socket
// in one write at the round's end.

// maxHeldBytes bounds what a round holds before writing it out: a copy
// of frames the send queue already accounts for. A connection keeps its
// buffer between rounds only up to keptHeldBytes, a small poke's worth,
// so that many idle connections hold little.
const (
	maxHeldBytes  = 64 << 10
	keptHeldBytes = 4 << 10
)

// heldConn is a websocket's network connection whose writes, between hold
// and release, are kept and written together at release. Writes from
// other goroutines meanwhile (gorilla's control frames) queue behind the
// held ones, in order.
type heldConn struct {
	net.Conn
	mu   sync.Mutex
	held bool
	buf  []byte
	err  error
	// writes counts writes to the connection, for tests.
	writes atomic.Int64
}

func (c *heldConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.held {
		return c.write(p)
	}
	if len(c.buf)+len(p) > maxHeldBytes {
		if _, err := c.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) > maxHeldBytes {
			return c.write(p)
		}
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (c *heldConn) write(p []byte) (int, error) {
	c.writes.Add(1)
	n, err := c.Conn.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}

func (c *heldConn) flushLocked() (int, error) {
	if len(c.buf) == 0 {
		return 0, nil
	}
	n, err := c.write(c.buf)
	if cap(c.buf) > keptHeldBytes {
		c.buf = nil
	} else {
		c.buf = c.buf[:0]
	}
	return n, err
}

// hold keeps the writes until release; a nil c does nothing.
func (c *heldConn) hold() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.held = true
	c.mu.Unlock()
}

// release writes what was held, and the error of any write held or not
// since hold.
func (c *heldConn) release() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = false
	if c.err != nil {
		return c.err
	}
	_, err := c.flushLocked()
	return err
}

// holdingWriter hands gorilla's Upgrade a heldConn when it hijacks the
// response's connection.
type holdingWriter struct {
	http.ResponseWriter
	conn *heldConn
}

func (w *holdingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.conn = &heldConn{Conn: nc}
	return w.conn, rw, nil
}
