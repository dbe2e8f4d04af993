package viewsyncer

import (
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/streams"
)

// TestServer_PruneCVR prunes a live group's tombstone: a client that
// comes back with a cookie from before it starts over (ClientNotFound), one
// with a later cookie catches up, and the connected client is served
// throughout.
func TestServer_PruneCVR(t *testing.T) {
	for _, durable := range []bool{false, true} {
		name := "Mem"
		if durable {
			name = "Durable"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, envOptions{issues: 10, pruneAge: time.Millisecond, durable: durable})
			q := `{"table":"issue","orderBy":[["id","asc"]],"limit":3}`
			old := connect(t, e, dialOpts{group: "g", client: "old", init: initFrame(testSchema, put("q", q, 0))})
			oldCookie := old.hydrated().cookie
			_ = old.ws.Close()
			live := connect(t, e, dialOpts{group: "g", client: "live", init: initFrame("")})
			live.expect("connected")
			live.poke()

			e.tx("public", "issue", streams.Change{Op: streams.OpDelete, Old: streams.Row{"id": raw("i0000001")}})
			cookie := waitPatch(live, `{"id":{"id":"i0000001"},"op":"del"`).cookie

			e.srv.mu.Lock()
			g := e.srv.groups["g"]
			e.srv.mu.Unlock()
			tombstone := cvrstore.KeyID("issue", []byte(`{"id":"i0000001"}`))
			prune := func() {
				g.pruneDue.Store(0)
				g.prune(time.Now())
			}
			hasTombstone := func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				return g.cvr.Rows[tombstone] != nil
			}
			if !hasTombstone() {
				t.Fatal("no tombstone for the deleted row")
			}
			prune() // notes the version
			time.Sleep(5 * time.Millisecond)
			prune()
			if hasTombstone() {
				t.Fatal("the tombstone past the prune age was kept")
			}
			// The old cookie predates it: start over.
			back := connect(t, e, dialOpts{group: "g", client: "old", base: oldCookie, init: initFrame("")})
			back.expect("connected")
			back.expectError(kindClientNotFound, "Client has been inactive too long", closeNormal)
			// The later one catches up.
			again := connect(t, e, dialOpts{group: "g", client: "again", base: cookie, init: initFrame("")})
			again.expect("connected")
			again.poke()
			e.tx("public", "issue", streams.Change{Op: streams.OpUpdate, New: streams.Row{"id": raw("i0000002"), "title": raw("after the prune")}})
			waitPatch(again, "after the prune")
			waitPatch(live, "after the prune")
		})
	}
}

// TestServer_PruneHeldBack: a connected client whose cookie is older than
// the prune horizon keeps the records its catch-up needs.
func TestServer_PruneHeldBack(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, pruneAge: time.Millisecond})
	q := `{"table":"issue","orderBy":[["id","asc"]],"limit":3}`
	a := connect(t, e, dialOpts{group: "g", client: "a", init: initFrame(testSchema, put("q", q, 0))})
	cookie := a.hydrated().cookie
	e.tx("public", "issue", streams.Change{Op: streams.OpDelete, Old: streams.Row{"id": raw("i0000001")}})
	waitPatch(a, `{"id":{"id":"i0000001"},"op":"del"`)

	e.srv.mu.Lock()
	g := e.srv.groups["g"]
	e.srv.mu.Unlock()
	g.mu.Lock()
	// A connection that is still at the cookie from before the delete.
	g.conns["b"] = &conn{s: e.srv, g: g, clientID: "b", base: cookie, hasBase: true}
	g.mu.Unlock()
	for range 2 {
		g.pruneDue.Store(0)
		g.prune(time.Now())
		time.Sleep(5 * time.Millisecond)
	}
	g.mu.Lock()
	kept := g.cvr.Rows[cvrstore.KeyID("issue", []byte(`{"id":"i0000001"}`))] != nil
	through := g.cvr.PrunedThrough
	delete(g.conns, "b")
	g.mu.Unlock()
	if !kept || through > cookie {
		t.Errorf("pruned past a connected client's cookie %s: tombstone kept %v, pruned through %q", cookie, kept, through)
	}
}
