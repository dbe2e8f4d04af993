package viewsyncer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/auth"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/internal/logkey"
)

// Timing of the downstream (docs/protocol.md §10).
const (
	// idlePong is how long the server stays silent before it sends an
	// unsolicited pong, so that a client waiting behind slow work keeps
	// the connection.
	idlePong = 6 * time.Second
	// writeTimeout bounds one frame's write; a client that does not read
	// for that long is closed.
	writeTimeout = 10 * time.Second
	// closeGrace is how long the server waits for the client's close
	// frame after sending its own.
	closeGrace = time.Second
	// maxCloseReason is the longest close reason a control frame carries.
	maxCloseReason = 123
)

var upgrader = websocket.Upgrader{
	// Browsers connect from the app's origin; zero-cache accepts any.
	CheckOrigin:     func(*http.Request) bool { return true },
	ReadBufferSize:  16 << 10,
	WriteBufferSize: 64 << 10,
	WriteBufferPool: sharedWriteBuffers,
}

// conn is one client websocket. Its handler goroutine reads and processes
// upstream frames in order; a writer goroutine drains the send queue.
type conn struct {
	s  *Server
	g  *group
	ws *websocket.Conn
	// out is ws's network connection, which the writer holds writes on
	// (coalesce.go); nil if the upgrade did not go through it.
	out *heldConn
	log *slog.Logger
	// proto is the sync protocol version of the connect URL.
	proto int

	clientID, wsID, userID string
	// token and claims are the connect-time auth; the group's auth
	// manager holds the current one. upgrade is what the API server is
	// sent from the upgrade request (cookie, origin, headers).
	token   string
	claims  map[string]any
	upgrade appapi.Conn

	// Guarded by g.mu.
	base               string
	hasBase, everPoked bool
	ready              bool
	// handling is set while a message of c's is handled, until its error
	// (if any) has sent c away: the group's maintenance round leaves c to
	// its handler meanwhile.
	handling atomic.Bool

	qmu       sync.Mutex
	queue     [][]byte
	qbytes    int
	closing   bool
	closeData []byte
	wake      chan struct{}
	// held is the bytes this socket holds of the server's send budget:
	// queued, or taken by the writer and not yet written.
	held atomic.Int64
	// slow is set once the socket is closed for not reading: the writer
	// stops writing what it holds.
	slow atomic.Bool
}

// connectParams are the URL's query parameters (docs/protocol.md §2.1).
type connectParams struct {
	clientID, clientGroupID, userID string
	baseCookie                      string
	hasBase                         bool
	wsID, profileID                 string
}

func parseConnectParams(q url.Values) (connectParams, error) {
	p := connectParams{
		clientID: q.Get("clientID"), clientGroupID: q.Get("clientGroupID"),
		userID: q.Get("userID"), baseCookie: q.Get("baseCookie"),
		wsID: q.Get("wsid"), profileID: q.Get("profileID"),
	}
	p.hasBase = p.baseCookie != ""
	if p.clientID == "" {
		return p, errors.New("invalid querystring parameter clientID: missing")
	}
	if p.clientGroupID == "" {
		return p, errors.New("invalid querystring parameter clientGroupID: missing")
	}
	for _, k := range []string{"ts", "lmid"} {
		if _, err := parseIntJS(q.Get(k)); err != nil {
			return p, fmt.Errorf("invalid querystring parameter %s: %w", k, err)
		}
	}
	return p, nil
}

// parseIntJS parses like JavaScript's parseInt: an optional sign and the
// leading digits, ignoring what follows ("1369.77" is 1369).
func parseIntJS(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := 0
	if i < len(s) && (s[i] == '-' || s[i] == '+') {
		i++
	}
	j := i
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	if j == i {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	return strconv.ParseInt(s[:j], 10, 64)
}

// syncPath parses [/<base>]/sync/v<N>/<action>.
func syncPath(p string) (version int, ok bool) {
	segs := strings.Split(strings.Trim(p, "/"), "/")
	if len(segs) == 4 {
		segs = segs[1:]
	}
	if len(segs) != 3 || segs[0] != "sync" || !strings.HasPrefix(segs[1], "v") {
		return 0, false
	}
	n, err := parseIntJS(segs[1][1:])
	if err != nil {
		return -1, true
	}
	return int(n), true
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	version, ok := syncPath(r.URL.Path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	release, refuse, early := s.admit()
	if early {
		refuseEarly(w)
		return
	}
	if release != nil {
		defer release()
	}
	proto := r.Header.Get("Sec-WebSocket-Protocol")
	var hdr http.Header
	if proto != "" {
		hdr = http.Header{"Sec-Websocket-Protocol": {proto}}
	}
	hw := &holdingWriter{ResponseWriter: w}
	ws, err := upgrader.Upgrade(hw, r, hdr)
	if err != nil {
		return // Upgrade has answered
	}
	defer ws.Close()
	if refuse != nil {
		closeWithError(ws, refuse)
		return
	}
	ws.SetReadLimit(s.cfg.MaxPayloadBytes)
	log := s.log.With(logkey.WSID, r.URL.Query().Get("wsid"))

	// Browsers hide failed upgrades, so bad requests are told on the socket
	// (docs/protocol.md §2.1).
	p, err := parseConnectParams(r.URL.Query())
	if err == nil && proto == "" {
		err = errors.New("missing Sec-WebSocket-Protocol")
	}
	var sp *secProtocol
	var init *initConnectionBody
	if err == nil {
		sp, init, err = decodeSecProtocol(proto)
	}
	if err != nil {
		log.Debug("bad connect request", "err", err)
		closeNow(ws, closeProtocol, err.Error())
		return
	}
	c := &conn{
		s: s, ws: ws, out: hw.conn, proto: version, clientID: p.clientID, wsID: p.wsID, userID: p.userID,
		base: p.baseCookie, hasBase: p.hasBase, wake: make(chan struct{}, 1),
		log: log.With(logkey.ClientGroup, p.clientGroupID, logkey.Client, p.clientID),
	}
	claims, perr := s.authenticate(r.Context(), sp.AuthToken, p.userID, true)
	if perr != nil {
		closeWithError(ws, perr)
		return
	}
	c.token, c.claims = sp.AuthToken, claims
	c.upgrade = appapi.ConnFromRequest(r, p.userID, sp.AuthToken)
	if version < MinServerProtocol || version > ProtocolVersion {
		side := "client"
		if version > ProtocolVersion {
			side = "server"
		}
		closeWithError(ws, newProtocolError(kindVersionNotSupported,
			"server is at sync protocol v%d and does not support v%d. The %s must be updated to a newer release.",
			ProtocolVersion, version, side))
		return
	}
	if s.draining.Load() {
		// Reconnect elsewhere, or here once restarted, soon: this
		// view-syncer gave its groups up.
		perr := newProtocolError(kindRehome, "Reconnect required")
		d := ownedRetry
		perr.MaxBackoffMs = &d
		closeWithError(ws, perr)
		return
	}
	ctx := r.Context()
	var g *group
	relayUntil := time.Now().Add(relayBudget)
	var gctx context.Context
	var closed, leave func()
	for {
		g, err = s.group(ctx, p.clientGroupID)
		var owned *cvrstore.OwnedError
		if errors.As(err, &owned) && owned.Owner.Address != "" && r.Header.Get(forwardedHeader) == "" {
			if owned.Signed {
				log.Debug("forwarding to the client group's owner", logkey.ClientGroup, p.clientGroupID, logkey.Owner, owned.Owner.ID)
				if s.forward(ctx, ws, r, proto, owned, relayUntil) {
					return
				}
				continue // the owner did not answer and its lease lapsed: take the group here
			}
			// Relaying would hand the client's token to whoever wrote the
			// record; the client is sent away to retry instead.
			if s.cfg.CVR != nil && s.cfg.CVR.PeerSecretSet() {
				log.Warn("not relaying to an owner whose record is not signed with the peer secret",
					logkey.ClientGroup, p.clientGroupID, logkey.Owner, owned.Owner.ID, "address", owned.Owner.Address)
			} else {
				log.Debug("not relaying: no peer secret", logkey.ClientGroup, p.clientGroupID, logkey.Owner, owned.Owner.ID)
			}
		}
		if err != nil {
			log.Info("client group not served here", logkey.ClientGroup, p.clientGroupID, "err", err)
			closeWithError(ws, loadError(err))
			return
		}
		c.g = g
		// A reader goroutine (below) sees the client go even while a
		// handler is busy: the group's work is cancelled once none of
		// its sockets is left, counting those waiting to attach.
		gctx, closed, leave = g.liveConn(ctx, c)
		perr := g.attach(c, sp.AuthToken != "", authMap(claims))
		if perr == errUnloaded {
			leave()
			continue // it left memory meanwhile: load it again
		}
		if perr != nil {
			leave()
			closeWithError(ws, perr)
			return
		}
		break
	}
	defer leave()
	ctx = gctx
	s.metrics.connections.Inc()
	defer s.metrics.connections.Dec()
	s.adm.add(c)
	defer s.adm.remove(c)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.containWriter()
		c.writeLoop()
	}()
	defer func() {
		c.closeQuietly()
		<-done
		g.detach(c)
	}()

	if b, err := encodeFrame("connected", connectedBody{WSID: p.wsID, Timestamp: time.Now().UnixMilli()}); err == nil {
		c.enqueue(b)
	}
	in := newInbox(int(s.cfg.MaxPayloadBytes))
	stop := make(chan struct{})
	reading := make(chan struct{})
	go func() {
		defer close(reading)
		in.readLoop(ws, stop, closed)
	}()
	defer func() {
		close(stop)
		// Unblock the read, then wait for the reader to end.
		_ = ws.SetReadDeadline(time.Now())
		<-reading
	}()
	if init != nil {
		if !c.handle(ctx, &upstream{Tag: tagInitConnection, InitConnection: init}) {
			return
		}
	}
	for {
		data, err := in.next()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) && !c.isClosing() {
				c.log.Debug("read", "err", err)
			}
			return
		}
		u, err := decodeUpstream(data)
		if err != nil {
			c.fail(newProtocolError(kindInvalidMessage, "%v", err))
			continue // drain until the client's close frame
		}
		c.handle(ctx, u)
	}
}

// handle processes one upstream message; false means the connection is
// closing.
func (c *conn) handle(ctx context.Context, u *upstream) bool {
	if c.isClosing() {
		return false
	}
	c.handling.Store(true)
	defer c.handling.Store(false)
	// A message may change what the group's maintenance has to do
	// (queries' TTLs, transforms, auth).
	defer c.g.wakeMaintenance()
	var err error
	switch u.Tag {
	case tagPing:
		if b, e := encodeFrame("pong", struct{}{}); e == nil {
			c.enqueue(b)
		}
	case tagInitConnection:
		err = c.g.initConnection(ctx, c, u.InitConnection)
	case tagChangeDesiredQueries:
		err = c.g.changeDesiredQueries(ctx, c, u.ChangeDesiredQueries.DesiredQueriesPatch)
	case tagDeleteClients:
		err = c.g.deleteClients(ctx, c, u.DeleteClients.ClientIDs)
		if err == nil {
			err = c.g.cleanupClients(c, u.DeleteClients.ClientIDs)
		}
	case tagUpdateAuth:
		claims, perr := c.s.authenticate(ctx, u.UpdateAuth.Auth, c.userID, false)
		if perr != nil {
			err = perr
		} else {
			err = c.g.updateAuth(ctx, c, u.UpdateAuth.Auth, claims)
		}
	case tagPush:
		err = c.g.push(ctx, c, u.Push)
	case tagAckMutationResponses:
		err = c.g.ackMutationResponses(c, u.AckMutationResponses)
	case tagInspect:
		c.g.inspect(ctx, c, u.Inspect)
	}
	if err != nil {
		if !expectedError(err) {
			c.log.Error("handle "+u.Tag, "err", err)
		}
		c.failErr(err)
		c.g.mu.Lock()
		c.g.dropIfBroken()
		c.g.mu.Unlock()
		return false
	}
	return true
}

// expectedError reports whether err is one the client is meant to get:
// a protocol error, the API server's failure, an auth refusal.
func expectedError(err error) bool {
	var perr *protocolError
	var f *appapi.Failure
	var ce *auth.Error
	return errors.As(err, &perr) || errors.As(err, &f) || errors.As(err, &ce) || errors.Is(err, context.Canceled)
}

// enqueue queues frames to send, all or none. A client whose queue would
// pass its limit is closed: it catches up when it reconnects. When all
// queues together pass the server's budget, the sockets holding the most
// are closed (shed).
func (c *conn) enqueue(frames ...[]byte) bool {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	c.qmu.Lock()
	if c.closing {
		c.qmu.Unlock()
		return false
	}
	if c.held.Load()+int64(n) > int64(c.s.cfg.MaxQueueBytes) {
		c.qmu.Unlock()
		c.closeSlow()
		return false
	}
	c.queue = append(c.queue, frames...)
	c.qbytes += n
	c.account(n)
	c.signal()
	c.qmu.Unlock()
	if c.s.adm.queued.Load() > c.s.sendBudget() {
		c.s.shed()
	}
	return !c.isClosing()
}

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// fail sends err and closes.
func (c *conn) fail(err *protocolError) { c.failErr(err) }

func (c *conn) closeQuietly() {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	c.setClosingLocked(websocket.CloseNormalClosure, "")
}

func (c *conn) setClosingLocked(code int, reason string) {
	if c.closing {
		return
	}
	c.closing = true
	c.closeData = websocket.FormatCloseMessage(code, truncate(reason, maxCloseReason))
	c.signal()
}

func (c *conn) isClosing() bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return c.closing
}

// truncate cuts s to at most n bytes; a character the cut splits goes,
// since a close reason must be valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// writeLoop is the connection's only writer.
func (c *conn) writeLoop() {
	idle := time.NewTicker(idlePong / 2)
	defer idle.Stop()
	last := time.Now()
	pong, _ := encodeFrame("pong", struct{}{})
	for {
		select {
		case <-c.wake:
		case now := <-idle.C:
			if now.Sub(last) >= idlePong {
				c.enqueue(pong)
			}
			continue
		}
		c.qmu.Lock()
		frames, closing, closeData := c.queue, c.closing, c.closeData
		c.queue, c.qbytes = nil, 0
		slow := c.slow.Load()
		c.qmu.Unlock()
		testPanicHook("writer", c.g.id)
		if slow {
			for _, f := range frames {
				c.account(-len(f))
			}
			frames = nil
		}
		c.out.hold()
		var werr error
		for i, f := range frames {
			if c.slow.Load() {
				// Closed for not reading meanwhile: the rest is dropped,
				// and the next round sends the close frame.
				for _, rest := range frames[i:] {
					c.account(-len(rest))
				}
				closing = false
				break
			}
			_ = c.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
			werr = c.ws.WriteMessage(websocket.TextMessage, f)
			c.account(-len(f))
			if werr != nil {
				for _, rest := range frames[i+1:] {
					c.account(-len(rest))
				}
				break
			}
		}
		if err := c.out.release(); werr == nil {
			werr = err
		}
		if werr != nil {
			c.log.Debug("write", "err", werr)
			c.closeQuietly()
			c.qmu.Lock()
			c.dropQueueLocked()
			c.qmu.Unlock()
			_ = c.ws.Close()
			return
		}
		if len(frames) > 0 {
			last = time.Now()
		}
		if closing {
			c.qmu.Lock()
			c.dropQueueLocked()
			c.qmu.Unlock()
			timeout := writeTimeout
			if c.slow.Load() {
				timeout = closeGrace
			}
			_ = c.ws.WriteControl(websocket.CloseMessage, closeData, time.Now().Add(timeout))
			// Let the reader see the client's close frame, or give up.
			_ = c.ws.SetReadDeadline(time.Now().Add(closeGrace))
			return
		}
	}
}

// containWriter, deferred by the connection's writer, keeps a panic there
// to the connection's group: the stack is logged, this socket, which has
// no writer any more, is sent the Internal error and closed here, and the
// group is failed as a panic of its other work fails it.
func (c *conn) containWriter() {
	r := recover()
	if r == nil {
		return
	}
	perr := internalPanicError("writer")
	_ = c.out.release()
	c.qmu.Lock()
	c.closing = true
	c.dropQueueLocked()
	// The frames the writer had taken off the queue go back too.
	c.account(-int(c.held.Load()))
	c.qmu.Unlock()
	if b, err := encodeFrame("error", perr); err == nil {
		_ = c.ws.SetWriteDeadline(time.Now().Add(writeTimeout))
		_ = c.ws.WriteMessage(websocket.TextMessage, b)
	}
	_ = c.ws.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(perr.closeCode, truncate(perr.Message, maxCloseReason)), time.Now().Add(writeTimeout))
	_ = c.ws.SetReadDeadline(time.Now().Add(closeGrace))
	c.g.failPanic("writer", r)
}

// closeNow closes a socket that never got going.
func closeNow(ws *websocket.Conn, code int, reason string) {
	_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, truncate(reason, maxCloseReason)), time.Now().Add(writeTimeout))
	drainClose(ws)
}

// closeWithError sends err, then closes, before the connection got going.
func closeWithError(ws *websocket.Conn, err *protocolError) {
	if b, e := encodeFrame("error", err); e == nil {
		_ = ws.SetWriteDeadline(time.Now().Add(writeTimeout))
		_ = ws.WriteMessage(websocket.TextMessage, b)
	}
	closeNow(ws, err.closeCode, err.Message)
}

// drainClose waits briefly for the client's close frame.
func drainClose(ws *websocket.Conn) {
	_ = ws.SetReadDeadline(time.Now().Add(closeGrace))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			return
		}
	}
}

// errPurged is what every client of a group that garbage collection
// purged gets, with or without a cookie, as from zero-cache: the client
// gives the group up and starts a new one.
var errPurged = newProtocolError(kindClientNotFound, "Client has been purged due to inactivity")

// ownedRetry is the reconnect delay a client gets from a view-syncer whose
// peer owns its group: the peer may be reached on the next attempt, or its
// lease runs out.
const ownedRetry = 1000

// loadError is what a client is told when its group cannot be loaded: a
// protocol error as it is (a purged group's ClientNotFound). A
// group a live peer owns is Rehome in zero-cache's OwnershipError form;
// any other failure is transient too, so Rehome as well ("Reconnect
// required"): Internal would stop the client for good.
func loadError(err error) *protocolError {
	var perr *protocolError
	if errors.As(err, &perr) {
		return perr
	}
	if errors.Is(err, cvrstore.ErrPurged) {
		return errPurged
	}
	var owned *cvrstore.OwnedError
	if errors.As(err, &owned) {
		perr := ownershipError(owned.Owner, time.Now())
		d := ownedRetry
		perr.MaxBackoffMs = &d
		return perr
	}
	return newProtocolError(kindRehome, "Reconnect required")
}

// forwardedHeader marks a connection one view-syncer forwards to another,
// which serves it or refuses it, never forwards it again: two peers that
// each think the other owns a group do not bounce a client between them.
const forwardedHeader = "X-Jetsync-Forwarded"

// relayBudget bounds how long a connection waits on its group's owner
// before it is served here or sent away: less than the real client's 10 s
// connect timeout, so that the client hears the outcome.
const relayBudget = 8 * time.Second

// leaseLapseGrace is how long past an owner's lease expiry a relay keeps
// waiting for it: a live owner renews well before then.
const leaseLapseGrace = 250 * time.Millisecond

// forward serves a client whose group a live peer owns through that peer:
// it opens the same sync URL there and relays frames both ways until
// either side closes, so that any view-syncer can take any connection
// (no sticky load balancer). It reports whether it dealt with the
// connection. A peer that does not answer before its lease lapses (a
// stopped or dead process, which renews nothing) is not waited for past
// the lapse: forward returns false, having written nothing, and the
// caller takes the group over. A peer it cannot reach by until, while
// its lease holds, gets the client sent away with Rehome, to retry
// shortly.
func (s *Server) forward(ctx context.Context, ws *websocket.Conn, r *http.Request, proto string, owned *cvrstore.OwnedError, until time.Time) bool {
	lapse := time.UnixMilli(owned.Owner.ExpiresMs).Add(leaseLapseGrace)
	deadline := until
	if lapse.Before(until) {
		deadline = lapse
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	u := strings.TrimSuffix(owned.Owner.Address, "/") + r.URL.RequestURI()
	d := websocket.Dialer{Subprotocols: []string{proto},
		ReadBufferSize: upgrader.ReadBufferSize, WriteBufferSize: upgrader.WriteBufferSize}
	up, _, err := d.DialContext(dctx, u, relayedHeader(r.Header))
	if err != nil {
		if ctx.Err() == nil && lapse.Before(until) {
			// Refused or unanswered: wait out the lease, then look again.
			t := time.NewTimer(time.Until(lapse))
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
				s.log.Info("the client group's owner did not answer before its lease lapsed", logkey.Owner, owned.Owner.ID, "address", owned.Owner.Address, "err", err)
				return false
			}
		}
		s.log.Info("forward to the client group's owner", logkey.Owner, owned.Owner.ID, "address", owned.Owner.Address, "err", err)
		closeWithError(ws, loadError(owned))
		return true
	}
	defer up.Close()
	s.metrics.connections.Inc()
	defer s.metrics.connections.Dec()
	errc := make(chan error, 2)
	group := r.URL.Query().Get("clientGroupID")
	// A panic in a relay ends this connection alone: both relays stop,
	// and the client is told Internal once they have.
	var panicked atomic.Bool
	relay := func(dst, src *websocket.Conn) {
		defer func() {
			if rec := recover(); rec != nil {
				s.log.Error("panic", "in", "relay", logkey.ClientGroup, group, "panic", fmt.Sprint(rec), "stack", string(debug.Stack()))
				panicked.Store(true)
				_ = up.Close()
				_ = ws.SetReadDeadline(time.Now())
				errc <- fmt.Errorf("relay panicked: %v", rec)
			}
		}()
		for {
			mt, data, err := src.ReadMessage()
			if err != nil && panicked.Load() {
				errc <- err
				return
			}
			if err != nil {
				code, reason := websocket.CloseNormalClosure, ""
				var ce *websocket.CloseError
				if errors.As(err, &ce) {
					code, reason = ce.Code, ce.Text
				}
				_ = dst.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(writeTimeout))
				errc <- err
				return
			}
			testPanicHook("relay", group)
			_ = dst.SetWriteDeadline(time.Now().Add(writeTimeout))
			if err := dst.WriteMessage(mt, data); err != nil {
				errc <- err
				return
			}
		}
	}
	go relay(up, ws)
	go relay(ws, up)
	<-errc
	// Let the close frame reach the other side, then end both relays
	// (at once after a panic, which sent none).
	if !panicked.Load() {
		_ = up.SetReadDeadline(time.Now().Add(closeGrace))
		_ = ws.SetReadDeadline(time.Now().Add(closeGrace))
	}
	<-errc
	if panicked.Load() {
		closeWithError(ws, internalPanicError("relay"))
	}
	return true
}

// relayedHeader is what a relayed upgrade request carries of the client's:
// everything but the handshake's own fields, which the dialer sets, so
// that the owner sees the Cookie, Origin and other headers its API
// server calls may forward.
func relayedHeader(in http.Header) http.Header {
	out := make(http.Header, len(in)+1)
	for k, vs := range in {
		switch http.CanonicalHeaderKey(k) {
		case "Host", "Upgrade", "Connection", "Content-Length", "Transfer-Encoding", "Keep-Alive", "Te", "Trailer",
			"Proxy-Connection", "Proxy-Authorization", "Sec-Websocket-Key", "Sec-Websocket-Version",
			"Sec-Websocket-Extensions", "Sec-Websocket-Protocol", "Sec-Websocket-Accept":
			continue
		}
		out[k] = slices.Clone(vs)
	}
	out.Set(forwardedHeader, "1")
	return out
}
