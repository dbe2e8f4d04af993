package e2e

import (
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestCVR_SlowViewSyncer is issue 15's "Slow view-syncer", its correctness
// half (bench/slowvs measures the latency): three view-syncers share one
// NATS, each serving real Zero clients of its own groups. One is SIGSTOPped
// for longer than its lease while Postgres changes: the clients of the
// other two keep syncing all along. Then it gets SIGCONT, and its clients
// catch up without a reload: every client ends with exactly Postgres's
// rows, and keeps following new writes.
func TestCVR_SlowViewSyncer(t *testing.T) {
	app := newCVRApp(t, 200)
	c := newCVRCluster(t, app)
	vss := []*viewSyncer{c.startViewSyncer(t, "vs-a"), c.startViewSyncer(t, "vs-b"), c.startViewSyncer(t, "vs-c")}
	slow := vss[2]
	d := startDriver(t, app.node)
	clients := map[string]*viewSyncer{"a1": vss[0], "a2": vss[0], "b1": vss[1], "b2": vss[1], "c1": slow, "c2": slow}
	order := []string{"a1", "a2", "b1", "b2", "c1", "c2"}
	for _, name := range order {
		// A storage key of its own: each client is its own group.
		d.openWired(t, name, clients[name].url, "u000001", "k-"+name)
		d.do(t, map[string]any{"cmd": "query", "client": name, "id": "open10", "table": "issue",
			"where": openIssuesQuery["where"], "orderBy": openIssuesQuery["orderBy"], "limit": 10})
	}
	for _, name := range order {
		d.waitRowsEqual(t, name, "open10", app.want(t))
		if o := c.owner(t, d.groups[name]); o.ID != clients[name].id {
			t.Fatalf("client %s's group owned by %+v; want %s", name, o, clients[name].id)
		}
	}
	mark := d.mark()

	// Long enough for the slow one's leases (2 s) and its clients' pings
	// to lapse.
	const stop = 10 * time.Second
	if err := syscall.Kill(slow.p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	// A client of c2's group comes to vs-b meanwhile, as a client moves
	// when its view-syncer stops answering: vs-b serves it once the
	// stopped owner's lease lapses, without waiting for the owner.
	d.openWired(t, "m", vss[1].url, "u000001", "k-c2")
	d.do(t, map[string]any{"cmd": "query", "client": "m", "id": "open10", "table": "issue",
		"where": openIssuesQuery["where"], "orderBy": openIssuesQuery["orderBy"], "limit": 10})
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(slow.p.cmd.Process.Pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)

	// While it is stopped, the window changes in every way: rows are
	// retitled, one leaves (closed) and two enter (new, oldest first).
	// The clients of the others follow each change before it resumes.
	for round := range 3 {
		ids := app.windowIDs(t)
		for i, id := range ids {
			app.exec(t, `UPDATE issue SET title = $1 WHERE id = $2`, fmt.Sprintf("stopped %d.%d", round, i), id)
		}
		app.exec(t, `UPDATE issue SET open = false WHERE id = $1`, ids[len(ids)-1])
		app.exec(t, `INSERT INTO issue (id, title, open, modified, owner_id, created)
			SELECT $1, $1, true, min(modified) - 1, 'u000001', now() FROM issue`, fmt.Sprintf("slow-%d-a", round))
		app.exec(t, `INSERT INTO issue (id, title, open, modified, owner_id, created)
			SELECT $1, $1, true, min(modified) - 1, 'u000001', now() FROM issue`, fmt.Sprintf("slow-%d-b", round))
		for _, name := range order[:4] {
			d.waitRowsEqual(t, name, "open10", app.want(t))
		}
	}
	d.waitRowsEqual(t, "m", "open10", app.want(t))
	if g := d.groups["m"]; g != d.groups["c2"] {
		t.Fatalf("m's group %s; want c2's %s", g, d.groups["c2"])
	}
	if o := c.owner(t, d.groups["m"]); o.ID != vss[1].id {
		t.Fatalf("c2's group owned by %+v once m has its rows; want %s", o, vss[1].id)
	}
	markM := d.mark() // m's first socket is a new client's, without a cookie
	if elapsed := time.Since(stopped); elapsed >= stop {
		t.Fatalf("the clients of the running view-syncers took %v to follow the writes; the stop lasts %v", elapsed.Round(time.Millisecond), stop)
	}
	t.Logf("the running view-syncers' clients followed every write, and c2's group moved to vs-b, %v into the stop", time.Since(stopped).Round(time.Millisecond))
	for _, name := range order[4:] {
		if ev, ok := d.find(func(ev driverEvent) bool { return ev.Event == "rows" && ev.Client == name && ev.ID == "open10" }); ok && equalJSON(t, ev.Rows, app.openIssues(t)) {
			t.Fatalf("client %s of the stopped view-syncer has Postgres's rows already: the stop did not hold it", name)
		}
	}
	time.Sleep(time.Until(stopped.Add(stop))) // the stop's length is the scenario
	resume()
	resumedAt := time.Now()
	for _, name := range order[4:] {
		d.waitRowsEqual(t, name, "open10", app.want(t))
	}
	t.Logf("the stopped view-syncer's clients caught up %v after SIGCONT", time.Since(resumedAt).Round(time.Millisecond))
	// Everyone keeps following.
	ids := app.windowIDs(t)
	app.exec(t, `UPDATE issue SET title = 'after the stop' WHERE id = $1`, ids[0])
	for _, name := range order {
		d.waitRowsEqual(t, name, "open10", app.want(t))
		checkNoReload(t, d, name, mark)
	}
	d.waitRowsEqual(t, "m", "open10", app.want(t))
	checkNoReload(t, d, "m", markM)
	for _, name := range order[4:] {
		h := c.history(t, d.groups[name])
		writers := checkOneWriter(t, h)
		t.Logf("client %s's group: %d CVR messages, writers %v", name, len(h), writers)
	}
	for _, vs := range vss {
		if vs.p.exited() {
			t.Errorf("%s exited (%v)", vs.id, vs.p.err)
		}
	}
}

// equalJSON reports whether a and b are the same JSON value.
func equalJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	return cmp.Equal(decodeJSON(t, a), decodeJSON(t, b))
}
