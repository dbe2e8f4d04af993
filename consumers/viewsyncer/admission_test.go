package viewsyncer

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/jetsync/jetsync/streams"
)

// expectOverloaded reads a ServerOverloaded error that asks the client to
// back off, and the close after it.
func (c *tc) expectOverloaded(msgPrefix string) {
	c.t.Helper()
	tag, body := c.next()
	var pe protocolError
	_ = json.Unmarshal(body, &pe)
	if tag != "error" || pe.Kind != kindServerOverloaded || !strings.HasPrefix(pe.Message, msgPrefix) ||
		pe.MinBackoffMs == nil || *pe.MinBackoffMs < 1000 {
		c.t.Fatalf("got %s %s; want a ServerOverloaded %q… with a minBackoffMs", tag, body, msgPrefix)
	}
	c.expectClose(closeNormal)
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const issueQuery = `{"table":"issue","orderBy":[["id","asc"]],"limit":3}`

func TestServer_ConnectionLimit(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	e.srv.cfg.MaxConnections = 2
	a := connect(t, e, dialOpts{group: "ga", client: "a", init: initFrame(testSchema, put("q", issueQuery, 0))})
	a.hydrated()
	b := connect(t, e, dialOpts{group: "gb", client: "b", init: initFrame(testSchema, put("q", issueQuery, 0))})
	b.hydrated()

	c := connect(t, e, dialOpts{group: "gc", client: "c", init: initFrame(testSchema, put("q", issueQuery, 0))})
	c.expectOverloaded("Too many connections")
	if n := counterValue(t, e.srv.metrics.refused.WithLabelValues("connections")); n != 1 {
		t.Errorf("refused{connections} = %v; want 1", n)
	}

	// The admitted keep being served.
	e.tx("public", "issue", streams.Change{Op: streams.OpUpdate, New: streams.Row{"id": raw("i0000001"), "title": raw("still served")}})
	waitPatch(a, "still served")
	waitPatch(b, "still served")

	// A slot that frees is taken again.
	_ = a.ws.Close()
	waitFor(t, "the closed socket's slot", func() bool { return e.srv.adm.sockets.Load() == 1 })
	d := connect(t, e, dialOpts{group: "gd", client: "d", init: initFrame(testSchema, put("q", issueQuery, 0))})
	d.hydrated()
}

func TestServer_QueriesPerClient(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	e.srv.cfg.MaxQueriesPerClient = 3
	q := func(i int) string {
		return fmt.Sprintf(`{"table":"issue","where":{"type":"simple","op":"=","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"i%07d"}}}`, i)
	}
	c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("q1", q(1), 0), put("q2", q(2), 0))})
	c.hydrated()
	// Replacing one query by another fits: a del'd query with no TTL left
	// no longer counts.
	c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + del("q2") + `,` + put("q3", q(3), 0) + `]}]`)
	waitPatch(c, `got {"hash":"q3"`)
	// A third one still fits; a fourth does not, and nothing of it is
	// saved.
	c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("q4", q(4), 0) + `]}]`)
	waitPatch(c, `got {"hash":"q4"`)
	c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("q5", q(5), 0) + `]}]`)
	c.expectError(kindInternal, "Too many queries", closeNormal)

	// The client comes back with what it had: its queries are all there,
	// and the refused one is not.
	e.srv.cfg.MaxQueriesPerClient = 100
	r := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame("")})
	r.expect("connected")
	r.poke()
	e.srv.mu.Lock()
	g := e.srv.groups["g"]
	e.srv.mu.Unlock()
	g.mu.Lock()
	_, q5 := g.cvr.Queries["q5"]
	_, q4 := g.cvr.Queries["q4"]
	g.mu.Unlock()
	if q5 || !q4 {
		t.Errorf("after the refusal: q4 saved %v (want true), q5 saved %v (want false)", q4, q5)
	}

	// A patch too large on its own is refused in the initConnection too.
	e.srv.cfg.MaxQueriesPerClient = 1
	n := connect(t, e, dialOpts{group: "g2", client: "n1", init: initFrame(testSchema, put("q1", q(1), 0), put("q2", q(2), 0))})
	n.expect("connected")
	n.expectError(kindInternal, "Too many queries", closeNormal)
}

func TestServer_MemoryPressure(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	a := connect(t, e, dialOpts{group: "ga", client: "a", init: initFrame(testSchema, put("q", issueQuery, 0))})
	a.hydrated()

	e.srv.adm.level.Store(int32(pressureShed))
	// A new socket, or a new query, is refused for now; the client backs
	// off and retries.
	b := connect(t, e, dialOpts{group: "gb", client: "b", init: initFrame(testSchema, put("q", issueQuery, 0))})
	b.expectOverloaded("Server is low on memory")
	a.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("q2", `{"table":"user"}`, 0) + `]}]`)
	a.expectOverloaded("Server is low on memory")
	if n := counterValue(t, e.srv.metrics.refused.WithLabelValues("memory")); n != 2 {
		t.Errorf("refused{memory} = %v; want 2", n)
	}

	// Higher, sockets are refused before the upgrade.
	e.srv.adm.level.Store(int32(pressureDrop))
	u := "ws" + strings.TrimPrefix(e.http.URL, "http") + "/sync/v51/connect?" + url.Values{"clientGroupID": {"gc"}, "clientID": {"c"}}.Encode()
	_, resp, err := websocket.DefaultDialer.Dial(u, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("dial under memory pressure: %v %v; want 503 with Retry-After", resp, err)
	}

	// Once it eases, the client is served again, its queries kept.
	e.srv.adm.level.Store(int32(pressureNone))
	r := connect(t, e, dialOpts{group: "ga", client: "a", init: initFrame("")})
	r.expect("connected")
	e.tx("public", "issue", streams.Change{Op: streams.OpUpdate, New: streams.Row{"id": raw("i0000001"), "title": raw("after the pressure")}})
	waitPatch(r, "after the pressure")
}
