package viewsyncer

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/jetsync/jetsync/streams"
)

// dialStalled connects a client that never reads: its socket's receive
// buffer is tiny, so what the server sends backs up into its queue.
func dialStalled(t *testing.T, e *env, group, client, init string) *websocket.Conn {
	t.Helper()
	nd := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	proto, err := encodeSecProtocol(secProtocol{InitConnectionMessage: json.RawMessage(init)})
	if err != nil {
		t.Fatal(err)
	}
	q := url.Values{"clientGroupID": {group}, "clientID": {client}, "wsid": {"ws-" + client}, "ts": {"1"}, "lmid": {"0"}}
	d := websocket.Dialer{Subprotocols: []string{proto}, HandshakeTimeout: 5 * time.Second,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return nd.DialContext(ctx, network, addr)
		}}
	ws, _, err := d.Dial("ws"+strings.TrimPrefix(e.http.URL, "http")+"/sync/v51/connect?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// TestServer_SlowReaderShed has a client stop reading while its query's
// rows keep changing: once the bytes queued to it pass the server's send
// budget it is closed, its queue given back, while a client that reads
// gets every change.
func TestServer_SlowReaderShed(t *testing.T) {
	e := newEnv(t, envOptions{issues: 200})
	const budget = 1 << 20
	e.srv.cfg.SendBudgetBytes = budget

	fast := connect(t, e, dialOpts{group: "fast", client: "f", init: initFrame(testSchema, put("q", issueQuery, 0))})
	fast.hydrated()
	dialStalled(t, e, "slow", "s", initFrame(testSchema, put("all", `{"table":"issue"}`, 0)))
	waitFor(t, "the stalled client's group", func() bool {
		e.srv.mu.Lock()
		defer e.srv.mu.Unlock()
		return e.srv.groups["slow"] != nil
	})

	pad := strings.Repeat("x", 4000)
	for round := 0; counterValue(t, e.srv.metrics.closedSlow) == 0; round++ {
		if round == 200 {
			t.Fatalf("the stalled client was not closed; %d bytes queued", e.srv.adm.queued.Load())
		}
		cs := make([]streams.Change, 0, 50)
		for i := 1; i <= 50; i++ {
			cs = append(cs, streams.Change{Op: streams.OpUpdate, New: streams.Row{
				"id": raw(fmt.Sprintf("i%07d", i)), "title": raw(fmt.Sprintf("round %d %s", round, pad))}})
		}
		e.tx("public", "issue", cs...)
		// The reader keeps up with every round.
		waitPatch(fast, fmt.Sprintf("round %d ", round))
		if q := e.srv.adm.queued.Load(); q > 2*budget {
			t.Fatalf("%d bytes queued; the budget is %d", q, budget)
		}
	}
	waitFor(t, "the stalled client's queue to be given back", func() bool { return e.srv.adm.queued.Load() < budget/10 })
	waitFor(t, "the stalled client's socket to close", func() bool { return e.srv.adm.sockets.Load() == 1 })
	e.tx("public", "issue", streams.Change{Op: streams.OpUpdate, New: streams.Row{"id": raw("i0000001"), "title": raw("after the shed")}})
	waitPatch(fast, "after the shed")
	// Every byte is given back once the sockets are gone.
	_ = fast.ws.Close()
	waitFor(t, "the send budget to be whole again", func() bool {
		return e.srv.adm.queued.Load() == 0 && e.srv.adm.sockets.Load() == 0
	})
}

// TestServer_ShedLargestFirst: of two clients that stopped reading, the one
// holding the most of the send budget is closed first.
func TestServer_ShedLargestFirst(t *testing.T) {
	e := newEnv(t, envOptions{issues: 200})
	const budget = 3 << 20
	e.srv.cfg.SendBudgetBytes = budget
	dialStalled(t, e, "big", "b", initFrame(testSchema, put("all", `{"table":"issue"}`, 0)))
	dialStalled(t, e, "small", "s", initFrame(testSchema, put("q", `{"table":"issue","orderBy":[["id","asc"]],"limit":100}`, 0)))
	waitFor(t, "both groups", func() bool {
		e.srv.mu.Lock()
		defer e.srv.mu.Unlock()
		return e.srv.groups["big"] != nil && e.srv.groups["small"] != nil
	})
	var small *conn
	e.srv.adm.mu.Lock()
	for c := range e.srv.adm.conns {
		if c.clientID == "s" {
			small = c
		}
	}
	e.srv.adm.mu.Unlock()
	if small == nil {
		t.Fatal("the small client is not admitted")
	}
	pad := strings.Repeat("x", 4000)
	for round := 0; counterValue(t, e.srv.metrics.closedSlow) == 0; round++ {
		if round == 200 {
			t.Fatal("no client was closed")
		}
		// Every round changes 150 rows: all in the big window, 100 in the
		// small one.
		for from := 1; from <= 150; from += 50 {
			cs := make([]streams.Change, 0, 50)
			for i := from; i < from+50; i++ {
				cs = append(cs, streams.Change{Op: streams.OpUpdate, New: streams.Row{
					"id": raw(fmt.Sprintf("i%07d", i)), "title": raw(fmt.Sprintf("round %d %s", round, pad))}})
			}
			e.tx("public", "issue", cs...)
		}
		e.waitWM(e.wm)
	}
	t.Logf("the small client holds %d bytes", small.held.Load())
	if small.held.Load() == 0 {
		t.Fatal("the small client holds nothing: the test shows no order")
	}
	if small.isClosing() {
		t.Errorf("the client holding %d bytes was closed before the one holding the most", small.held.Load())
	}
	if n := counterValue(t, e.srv.metrics.closedSlow); n != 1 {
		t.Errorf("%v clients closed; want 1", n)
	}
}
