package viewsyncer

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

// sharedOf is the shared view group id's pipeline of query hash follows,
// nil for none.
func sharedOf(t *testing.T, e *env, id, hash string) *sharedView {
	t.Helper()
	e.srv.mu.Lock()
	g := e.srv.groups[id]
	e.srv.mu.Unlock()
	if g == nil {
		t.Fatalf("group %s not loaded", id)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.pipelines[hash]
	if p == nil {
		t.Fatalf("group %s has no pipeline %s", id, hash)
	}
	return p.shared
}

// TestServer_SharedViews checks that groups running the same query follow
// one view, that each still gets exactly its own changes, and that a group
// that fell behind leaves the view, re-hydrates and joins again.
func TestServer_SharedViews(t *testing.T) {
	e := newEnv(t, envOptions{issues: 40})
	window := `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},"orderBy":[["modified","asc"]],"limit":5}`
	other := `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},"orderBy":[["modified","asc"]],"limit":6}`
	const groups = 4
	clients := make([]*tc, groups)
	rows := make([]map[string]string, groups)
	for i := range clients {
		clients[i] = connect(t, e, dialOpts{group: fmt.Sprint("sh", i), client: "c1", init: initFrame(testSchema, put("w", window, 0))})
		rows[i] = issueRows(t, map[string]string{}, clients[i].hydrated())
	}
	odd := connect(t, e, dialOpts{group: "odd", client: "c1", init: initFrame(testSchema, put("w", other, 0))})
	oddRows := issueRows(t, map[string]string{}, odd.hydrated())

	checks := 0
	check := func(stmt string, live []int) {
		t.Helper()
		checks++
		fresh := connect(t, e, dialOpts{group: fmt.Sprint("fresh", checks), client: "c1", init: initFrame(testSchema, put("w", window, 0))})
		want := issueRows(t, map[string]string{}, fresh.hydrated())
		fresh.ws.Close()
		for _, i := range live {
			if !maps.Equal(rows[i], want) {
				t.Errorf("after %s group %d holds %v; want %v", stmt, i, slices.Sorted(maps.Keys(rows[i])), slices.Sorted(maps.Keys(want)))
			}
		}
	}
	// A group whose rows a write leaves alone gets no poke for it: each
	// live group reads pokes until it holds what a fresh hydration
	// holds, and one that never gets there fails on a read's deadline.
	converge := func(c *tc, rows, want map[string]string) map[string]string {
		t.Helper()
		for !maps.Equal(rows, want) {
			rows = issueRows(t, rows, c.poke())
		}
		return rows
	}
	hydrate := func(query string) map[string]string {
		t.Helper()
		checks++
		fresh := connect(t, e, dialOpts{group: fmt.Sprint("fresh", checks), client: "c1", init: initFrame(testSchema, put("w", query, 0))})
		defer fresh.ws.Close()
		return issueRows(t, map[string]string{}, fresh.hydrated())
	}
	step := func(stmt string, live []int) {
		t.Helper()
		e.execSQL(stmt) // returns once the replica has it
		want := hydrate(window)
		for _, i := range live {
			rows[i] = converge(clients[i], rows[i], want)
		}
	}
	all := []int{0, 1, 2, 3}
	step("UPDATE issue SET modified = 0 WHERE id = 'i0000040'", all)
	sv := sharedOf(t, e, "sh0", "w")
	if sv == nil {
		t.Fatal("group sh0's pipeline follows no shared view after an advance")
	}
	for i := 1; i < groups; i++ {
		if got := sharedOf(t, e, fmt.Sprint("sh", i), "w"); got != sv {
			t.Errorf("group sh%d follows %p; want the view of sh0, %p", i, got, sv)
		}
	}
	if got := sharedOf(t, e, "odd", "w"); got == sv {
		t.Errorf("a different query follows the same shared view")
	}

	// Group 3's only client goes: the advances pass it by.
	clients[3].ws.Close()
	live := []int{0, 1, 2}
	step("UPDATE issue SET open = false WHERE id = 'i0000040'", live)
	step("UPDATE issue SET title = 'renamed' WHERE id = 'i0000001'", live)

	// A new client of group 3 catches up from nothing, then follows.
	clients[3] = connect(t, e, dialOpts{group: "sh3", client: "c2", init: initFrame(testSchema, put("w", window, 0))})
	clients[3].expect("connected")
	rows[3] = map[string]string{}
	for len(rows[3]) == 0 { // its config poke, then its catch-up
		rows[3] = issueRows(t, rows[3], clients[3].poke())
	}
	check("group 3's return", all)
	// Changes the window sees (i0000038 is open): an advance only moves
	// a query its changes cannot touch (zql's Affects), and a group joins
	// the shared view when it updates.
	step("UPDATE issue SET modified = 1 WHERE id = 'i0000038'", all)
	step("DELETE FROM issue WHERE id = 'i0000038'", all)
	if got := sharedOf(t, e, "sh3", "w"); got == nil || got != sharedOf(t, e, "sh0", "w") {
		t.Errorf("group sh3 follows %p after its return; want the others' view", got)
	}
	// The odd query's group got its own changes.
	converge(odd, oddRows, hydrate(other))
}
