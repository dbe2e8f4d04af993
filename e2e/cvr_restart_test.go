package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestCVR_Restart is issue 5's acceptance point 1: `jetsync run` restarts
// between two Postgres writes, and the real client, reconnecting with its
// baseCookie, gets one catch-up poke with exactly the missed change: no
// ClientNotFound and no full reload.
func TestCVR_Restart(t *testing.T) {
	app := newCVRApp(t, 200)
	port := freePort(t)
	env := app.runEnv(t, port)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := start(t, env, "run")
	waitHealthy(t, srv, url, 90*time.Second)

	d := startDriver(t, app.node)
	d.openWired(t, "a", url, "u000001", "a")
	d.waitState(t, "a", "connected", 30*time.Second)
	d.do(t, map[string]any{"cmd": "query", "client": "a", "id": "open10", "table": "issue",
		"where": openIssuesQuery["where"], "orderBy": openIssuesQuery["orderBy"], "limit": 10})
	d.waitRowsEqual(t, "a", "open10", app.want(t))

	ids := app.windowIDs(t)
	app.exec(t, `UPDATE issue SET title = 'before the restart' WHERE id = $1`, ids[0])
	d.waitRowsEqual(t, "a", "open10", app.want(t))
	base := d.lastCookie(t, "a")

	if code := srv.stop(t, 60*time.Second); code != 0 {
		t.Fatalf("jetsync run exit code %d after SIGTERM", code)
	}
	mark := d.mark()
	app.exec(t, `UPDATE issue SET title = 'while it was down' WHERE id = $1`, ids[1])

	srv = start(t, env, "run")
	waitHealthy(t, srv, url, 90*time.Second)
	d.waitRowsEqual(t, "a", "open10", app.want(t))
	d.waitState(t, "a", "connected", 30*time.Second)

	w := d.wire(t, "a", mark)
	checkCatchup(t, w, base, []string{"put:issue:" + ids[1]})
	if t.Failed() {
		return
	}
	// Later changes flow as before.
	app.exec(t, `UPDATE issue SET title = 'after the restart' WHERE id = $1`, ids[2])
	d.waitRowsEqual(t, "a", "open10", app.want(t))
}
