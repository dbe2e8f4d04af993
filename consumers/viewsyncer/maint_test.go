package viewsyncer

import (
	"testing"
	"time"

	"github.com/jetsync/jetsync/internal/polltest"
)

// TestServer_SlowAPIServerIsolated hangs the API server for one group's
// token while that group's revalidation is due: another group's eviction
// and pokes go on meanwhile.
func TestServer_SlowAPIServerIsolated(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, api: true, revalidate: 200 * time.Millisecond})
	good := `{"table":"issue","orderBy":[["id","asc"]],"limit":3}`
	slow := connect(t, e, dialOpts{group: "slowx", client: "x1", user: "ux", token: "user:ux", init: initFrame(testSchema, put("good", good, 0))})
	slow.hydrated()
	fast := connect(t, e, dialOpts{group: "fasty", client: "y1", user: "uy", token: "user:uy",
		init: initFrame(testSchema, put("good", good, 0), put("a", issue7, 300))})
	fast.hydrated()

	e.api.hang("user:ux")
	polltest.Until(t, 10*time.Second, "slowx's revalidation to hang", func() bool {
		e.api.mu.Lock()
		defer e.api.mu.Unlock()
		return e.api.hanging > 0
	})

	fast.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + del("a") + `]}]`)
	if p := fast.poke(); !has(p, `desired y1 {"hash":"a","op":"del"}`) {
		t.Fatalf("poke = %v; want desired del a", p.patches)
	}
	start := time.Now()
	waitPatch(fast, `got {"hash":"a","op":"del"}`)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("fasty's query evicted %v after its TTL started; want within 3s", d)
	}
	for i, title := range []string{"one", "two", "three"} {
		start := time.Now()
		e.execSQL("UPDATE issue SET title = '" + title + "' WHERE id = 'i0000001'")
		waitPatch(fast, `"title":"`+title+`"`)
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("update %d reached fasty after %v; want within 3s", i, d)
		}
	}
	e.api.mu.Lock()
	hanging := e.api.hanging
	e.api.mu.Unlock()
	if hanging == 0 {
		t.Errorf("slowx's call is no longer held: the test did not test a hung call")
	}
}

// TestInspect_AnalyzeWithoutTheLock sends analyze-query for a named query
// while the API server holds its transform: the group's pokes go on.
func TestInspect_AnalyzeWithoutTheLock(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, api: true, adminPassword: "s3cret"})
	good := `{"table":"issue","orderBy":[["id","asc"]],"limit":3}`
	c := connect(t, e, dialOpts{group: "an", client: "c1", user: "ua", token: "user:ua", init: initFrame(testSchema, put("good", good, 0))})
	c.hydrated()
	if d := c.inspect(`{"op":"authenticate","id":"1","value":"s3cret"}`); d.Op != "authenticated" || !valueOf[bool](t, d) {
		t.Fatalf("authenticate = %+v", d)
	}
	e.api.hang("user:ua")
	c.send(`["inspect",{"op":"analyze-query","id":"2","name":"issuesByIDs","args":[{"ids":["i0000004"]}]}]`)
	polltest.Until(t, 10*time.Second, "the transform to hang", func() bool {
		e.api.mu.Lock()
		defer e.api.mu.Unlock()
		return e.api.hanging > 0
	})
	start := time.Now()
	e.execSQL("UPDATE issue SET title = 'while analyzing' WHERE id = 'i0000001'")
	waitPatch(c, `"title":"while analyzing"`)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the poke came %v after the update; want within 3s", d)
	}
}
