package viewsyncer

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// waitHanging waits until the API server holds a call (hang).
func (a *apiServer) waitHanging(t *testing.T, what string) {
	t.Helper()
	polltest.Until(t, 10*time.Second, what, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.hanging > 0
	})
}

// updatesReach retitles an issue the clients' issueQuery holds three
// times, and checks that each update reaches every client within 3 s.
func updatesReach(t *testing.T, e *env, clients ...*tc) {
	t.Helper()
	for i, title := range []string{"one", "two", "three"} {
		start := time.Now()
		e.execSQL("UPDATE issue SET title = '" + title + "' WHERE id = 'i0000001'")
		for _, c := range clients {
			waitPatch(c, `"title":"`+title+`"`)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("update %d reached every client after %v; want within 3s", i, d)
		}
	}
}

// TestServer_SlowAPIServerIsolated hangs the API server for one group's
// token while that group's revalidation is due: another group's eviction
// and pokes go on meanwhile.
func TestServer_SlowAPIServerIsolated(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, api: true, revalidate: 200 * time.Millisecond})
	slow := connect(t, e, dialOpts{group: "slowx", client: "x1", user: "ux", token: "user:ux", init: initFrame(testSchema, put("good", issueQuery, 0))})
	slow.hydrated()
	fast := connect(t, e, dialOpts{group: "fasty", client: "y1", user: "uy", token: "user:uy",
		init: initFrame(testSchema, put("good", issueQuery, 0), put("a", issue7, 300))})
	fast.hydrated()

	e.api.hang("user:ux")
	e.api.waitHanging(t, "slowx's revalidation to hang")

	fast.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + del("a") + `]}]`)
	if p := fast.poke(); !has(p, `desired y1 {"hash":"a","op":"del"}`) {
		t.Fatalf("poke = %v; want desired del a", p.patches)
	}
	start := time.Now()
	waitPatch(fast, `got {"hash":"a","op":"del"}`)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("fasty's query evicted %v after its TTL started; want within 3s", d)
	}
	updatesReach(t, e, fast)
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
	c := connect(t, e, dialOpts{group: "an", client: "c1", user: "ua", token: "user:ua", init: initFrame(testSchema, put("good", issueQuery, 0))})
	c.hydrated()
	if d := c.inspect(`{"op":"authenticate","id":"1","value":"s3cret"}`); d.Op != "authenticated" || !valueOf[bool](t, d) {
		t.Fatalf("authenticate = %+v", d)
	}
	e.api.hang("user:ua")
	c.send(`["inspect",{"op":"analyze-query","id":"2","name":"issuesByIDs","args":[{"ids":["i0000004"]}]}]`)
	e.api.waitHanging(t, "the transform to hang")
	start := time.Now()
	e.execSQL("UPDATE issue SET title = 'while analyzing' WHERE id = 'i0000001'")
	waitPatch(c, `"title":"while analyzing"`)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the poke came %v after the update; want within 3s", d)
	}
}

// panicOnce makes the first pass of where for group panic.
func panicOnce(t *testing.T, where, group string) {
	var fired atomic.Bool
	hook := func(w, g string) {
		if w == where && g == group && fired.CompareAndSwap(false, true) {
			panic("injected for the test")
		}
	}
	panicHook.Store(&hook)
	t.Cleanup(func() { panicHook.Store(nil) })
}

// expectErrorAfterPokes is expectError after any pokes.
func (c *tc) expectErrorAfterPokes(kind, msgPrefix string, code int) {
	c.t.Helper()
	for {
		tag, body := c.next()
		switch tag {
		case "pokeStart", "pokePart", "pokeEnd":
			continue
		}
		var pe protocolError
		_ = json.Unmarshal(body, &pe)
		if tag != "error" || pe.Kind != kind || !strings.HasPrefix(pe.Message, msgPrefix) {
			c.t.Fatalf("got %s %s; want error %s %q…", tag, body, kind, msgPrefix)
		}
		c.expectClose(code)
		return
	}
}

// TestServer_WriterPanicContained makes a connection's writer panic: every
// socket of its group gets an Internal error, another group keeps its
// pokes, and the victim's client starts its group over when it returns.
func TestServer_WriterPanicContained(t *testing.T) {
	e := newEnv(t, envOptions{issues: 20})
	v1 := connect(t, e, dialOpts{group: "victim", client: "c1", init: initFrame(testSchema, put("good", issueQuery, 0))})
	v1.hydrated()
	v2 := connect(t, e, dialOpts{group: "victim", client: "c2", init: initFrame("", put("good", issueQuery, 0))})
	v2.expect("connected")
	v2.poke()
	v1.poke()
	other := connect(t, e, dialOpts{group: "bystander", client: "b1", init: initFrame(testSchema, put("good", issueQuery, 0))})
	other.hydrated()

	panicOnce(t, "writer", "victim")
	e.execSQL("UPDATE issue SET title = 'after the panic' WHERE id = 'i0000001'")
	v1.expectErrorAfterPokes(kindInternal, "Internal error in the view-syncer (writer)", closeNormal)
	v2.expectErrorAfterPokes(kindInternal, "Internal error in the view-syncer (writer)", closeNormal)
	waitPatch(other, `"title":"after the panic"`)
	e.execSQL("UPDATE issue SET title = 'and after' WHERE id = 'i0000002'")
	waitPatch(other, `"title":"and after"`)
	// What the panicked writer had taken off its queue is given back to
	// the send budget.
	polltest.Until(t, 10*time.Second, "every queued byte to be given back", func() bool { return e.srv.adm.queued.Load() == 0 })

	c := connect(t, e, dialOpts{group: "victim", client: "c1", init: initFrame(testSchema, put("good", issueQuery, 0))})
	if p := c.hydrated(); !has(p, "got "+`{"hash":"good","op":"put"}`) {
		t.Errorf("the victim's group starting over got %v; want its query", p.patches)
	}
	e.execSQL("UPDATE issue SET title = 'back' WHERE id = 'i0000001'")
	waitPatch(c, `"title":"back"`)
}

// TestServer_PusherPanicContained makes a group's pusher panic on a push's
// outcome: the group's socket gets an Internal error, another group's
// pushes go on, and the victim's client starts over when it returns.
func TestServer_PusherPanicContained(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, api: true})
	connectGroup := func(group string) *tc {
		c := connect(t, e, dialOpts{group: group, client: "c1", user: "u1", token: "user:u1", init: initFrame(testSchema, issue4Put)})
		c.hydrated()
		return c
	}
	victim, other := connectGroup("victim"), connectGroup("bystander")

	panicOnce(t, "pusher", "victim")
	victim.send(customPush("victim", "c1", 1, "issue.setTitle", `{"id":"i0000004","title":"pushed","modified":4.5}`))
	victim.expectErrorAfterPokes(kindInternal, "Internal error in the view-syncer (pusher)", closeNormal)
	other.send(customPush("bystander", "c1", 1, "issue.setTitle", `{"id":"i0000004","title":"pushed too","modified":5.5}`))
	waitPatch(other, `lmid c1 1`)

	c := connectGroup("victim")
	c.send(customPush("victim", "c1", 2, "issue.setTitle", `{"id":"i0000004","title":"pushed again","modified":6.5}`))
	waitPatch(c, `lmid c1 2`)
}

// TestRelay_PanicContained makes a relay to the group's owner panic: the
// relayed client gets an Internal error, and both view-syncers go on
// serving, relays included.
func TestRelay_PanicContained(t *testing.T) {
	o := envOptions{issues: 5, durable: true}
	e := newEnv(t, o)
	owner := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("good", issueQuery, 0))})
	owner.hydrated()
	e.use(e.startSyncer("vs-b", o))

	panicOnce(t, "relay", "g")
	relayed := connect(t, e, dialOpts{group: "g", client: "c2", init: initFrame("", put("good", issueQuery, 0))})
	relayed.expectErrorAfterPokes(kindInternal, "Internal error in the view-syncer (relay)", closeNormal)

	again := connect(t, e, dialOpts{group: "g", client: "c3", init: initFrame("", put("good", issueQuery, 0))})
	again.expect("connected")
	e.execSQL("UPDATE issue SET title = 'relayed' WHERE id = 'i0000001'")
	waitPatch(again, `"title":"relayed"`)
	waitPatch(owner, `"title":"relayed"`)
}

// TestServer_HungAPICallEnds hangs a group's revalidation: the call ends at
// the API timeout, the connection stays (a transient failure), and the
// group's maintenance resumes once the API server answers again.
func TestServer_HungAPICallEnds(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, api: true, revalidate: 200 * time.Millisecond, apiTimeout: 500 * time.Millisecond})
	c := connect(t, e, dialOpts{group: "hung", client: "c1", user: "uh", token: "user:uh", init: initFrame(testSchema, put("good", issueQuery, 0))})
	c.hydrated()
	e.api.hang("user:uh")
	var held time.Duration
	polltest.Until(t, 10*time.Second, "a held call to end", func() bool {
		e.api.mu.Lock()
		defer e.api.mu.Unlock()
		if len(e.api.hungFor) > 0 {
			held = e.api.hungFor[0]
			return true
		}
		return false
	})
	if held > 3*time.Second {
		t.Errorf("the held call ended after %v; want near the 500ms timeout", held)
	}
	c.alive()
	e.api.unhang("user:uh")
	before := len(e.api.reqs("/query"))
	polltest.Until(t, 10*time.Second, "a revalidation after the API server came back", func() bool {
		return len(e.api.reqs("/query")) > before
	})
	c.alive()
}

// TestServer_SlowTransformIsolated hangs the transform of one group's new
// synced query: another group's pokes go on meanwhile.
func TestServer_SlowTransformIsolated(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, api: true, apiTimeout: 20 * time.Second})
	slow := connect(t, e, dialOpts{group: "slowx", client: "x1", user: "ux", token: "user:ux", init: initFrame(testSchema, put("good", issueQuery, 0))})
	slow.hydrated()
	fast := connect(t, e, dialOpts{group: "fasty", client: "y1", user: "uy", token: "user:uy", init: initFrame(testSchema, put("good", issueQuery, 0))})
	fast.hydrated()

	e.api.hang("user:ux")
	slow.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + issue4Put + `]}]`)
	e.api.waitHanging(t, "slowx's transform to hang")
	updatesReach(t, e, fast)
	// slowx's own pokes go on too: its lock is free while the API server
	// holds the call.
	start := time.Now()
	e.execSQL("UPDATE issue SET title = 'four' WHERE id = 'i0000001'")
	waitPatch(slow, `"title":"four"`)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the update reached slowx after %v; want within 3s", d)
	}
	e.api.unhang("user:ux")
}

// TestServer_SlowConnectIsolated hangs the validation of a connection
// joining a group: the group's other client, and another group, keep
// their pokes.
func TestServer_SlowConnectIsolated(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, api: true, apiTimeout: 20 * time.Second})
	member := connect(t, e, dialOpts{group: "slowx", client: "x1", user: "ux", token: "user:ux", init: initFrame(testSchema, put("good", issueQuery, 0))})
	member.hydrated()
	fast := connect(t, e, dialOpts{group: "fasty", client: "y1", user: "uy", token: "user:uy", init: initFrame(testSchema, put("good", issueQuery, 0))})
	fast.hydrated()

	e.api.hang("user:ux")
	joining := connect(t, e, dialOpts{group: "slowx", client: "x2", user: "ux", token: "user:ux", init: initFrame("", issue4Put)})
	joining.expect("connected")
	e.api.waitHanging(t, "x2's validation to hang")
	updatesReach(t, e, fast, member)
}

// TestServer_SlowRetransformIsolated hangs the re-transform a changed
// token starts: the group's pokes, and another group's, go on.
func TestServer_SlowRetransformIsolated(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, secret: captureSecret, api: true, apiTimeout: 20 * time.Second})
	t1, t2 := jwtFor(t, "u1", time.Now().Unix()), jwtFor(t, "u1", time.Now().Unix()+1)
	slow := connect(t, e, dialOpts{group: "slowx", client: "x1", user: "u1", token: t1, init: initFrame(testSchema, put("good", issueQuery, 0), issue4Put)})
	slow.hydrated()
	fast := connect(t, e, dialOpts{group: "fasty", client: "y1", user: "u1", token: t1, init: initFrame(testSchema, put("good", issueQuery, 0))})
	fast.hydrated()

	e.api.hang(t2)
	slow.send(`["updateAuth",{"auth":"` + t2 + `"}]`)
	e.api.waitHanging(t, "the re-transform to hang")
	updatesReach(t, e, fast, slow)
}

// TestDurable_LeaseLostWhileMaintenanceHangs takes a group's lease while
// its revalidation waits on the API server: its client is sent away at
// once, not when the call ends.
func TestDurable_LeaseLostWhileMaintenanceHangs(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, durable: true, api: true, revalidate: 200 * time.Millisecond})
	c := connect(t, e, dialOpts{group: "g", client: "c1", user: "u1", token: "user:u1", init: initFrame(testSchema, put("good", issueQuery, 0))})
	c.hydrated()
	e.api.hang("user:u1")
	e.api.waitHanging(t, "the revalidation to hang")

	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, e.shard.OwnersBucket())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec, _ := json.Marshal(streams.CVROwner{ID: "thief", ExpiresMs: now.Add(time.Hour).UnixMilli(), GrantedMs: now.UnixMilli()})
	if _, err := kv.Put(ctx, streams.OwnerKey("g"), rec); err != nil {
		t.Fatal(err)
	}
	c.expectErrorAfterPokes(kindRehome, "CVR ownership was transferred to thief at ", closeNormal)
	if d := time.Since(now); d > 5*time.Second {
		t.Errorf("the client was sent away %v after the lease was taken; want within 5s", d)
	}
}
