package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
)

// The transition matrix (issue 12): real clients with a legacy (AST) query
// and a synced (name + args) query, connected before, during and right
// after each transition of the replica, must all end with views equal to
// Postgres, none hanging and none told ClientNotFound where zero-cache
// would not tell it.

// transitionIssues sizes the upstream so that the initial sync takes a
// window clients can connect in.
func transitionIssues(t *testing.T) int {
	if s := os.Getenv("JETSYNC_TRANSITION_ISSUES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("JETSYNC_TRANSITION_ISSUES=%q: %v", s, err)
		}
		return n
	}
	return 50000
}

// labelsSQL is the labelsAll query's rows in Postgres.
const labelsSQL = `SELECT json_build_object('id', l.id, 'name', l.name) FROM label l ORDER BY l.id`

// transitionRig holds what the cases share: the upstream, the API server
// synced queries are transformed by, and the driver running the clients.
type transitionRig struct {
	app *cvrApp
	api *apiServer
	d   *zeroDriver
	// clients are the names of every client opened, whose views are
	// checked after each transition.
	clients []string
}

// openClients opens one client per query kind, each its own client group
// on server, named <prefix>-legacy and <prefix>-synced, and materializes
// its labels query.
func (r *transitionRig) openClients(t *testing.T, server, prefix string) []string {
	t.Helper()
	var names []string
	for _, synced := range []bool{false, true} {
		name := prefix + "-legacy"
		if synced {
			name = prefix + "-synced"
		}
		r.d.openWired(t, name, server, "u000001", name)
		r.d.do(t, map[string]any{"cmd": "query", "client": name, "id": "labels", "shape": "labelsAll", "synced": synced})
		names = append(names, name)
	}
	r.clients = append(r.clients, names...)
	return names
}

// waitViews waits until every named client's labels view is complete and
// equals Postgres, for at most timeout, and returns how long after start
// each did.
// It fails for every client left behind, showing what it last had.
func (r *transitionRig) waitViews(t *testing.T, names []string, start time.Time, timeout time.Duration) map[string]time.Duration {
	t.Helper()
	deadline := time.Now().Add(timeout)
	took := map[string]time.Duration{}
	last := map[string]string{}
	for {
		want := decodeJSON(t, sqlRows(t, r.app.pg, labelsSQL))
		for _, name := range names {
			if _, ok := took[name]; ok {
				continue
			}
			ev, ok := r.d.find(func(ev driverEvent) bool { return ev.Event == "rows" && ev.Client == name && ev.ID == "labels" })
			switch {
			case !ok:
				last[name] = "no view yet"
			case !ev.Complete:
				last[name] = fmt.Sprintf("%s view, %d bytes", ev.ResultType, len(ev.Rows))
			default:
				if diff := cmp.Diff(want, decodeJSON(t, ev.Rows)); diff != "" {
					last[name] = "complete but differs (-postgres +client):\n" + diff
				} else {
					took[name] = time.Since(start)
				}
			}
		}
		if len(took) == len(names) {
			return took
		}
		if time.Now().After(deadline) {
			for _, name := range names {
				if _, ok := took[name]; !ok {
					t.Errorf("client %s: labels view not equal to Postgres after %s: %s", name, timeout, last[name])
				}
			}
			t.FailNow()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkNoClientNotFound fails for a client that was told ClientNotFound
// (an error frame or the client's own client-state-not-found) since mark.
func (r *transitionRig) checkNoClientNotFound(t *testing.T, names []string, mark int) {
	t.Helper()
	for _, name := range names {
		w := r.d.wire(t, name, mark)
		if w.notFound > 0 {
			t.Errorf("client %s got client-state-not-found %d times", name, w.notFound)
		}
		for _, k := range w.errorKinds() {
			if strings.HasPrefix(k, "ClientNotFound") {
				t.Errorf("client %s got %s", name, k)
			}
		}
	}
}

// renameLabel changes a label upstream, so that the views must follow the
// replica after a transition, not only hydrate.
func (r *transitionRig) renameLabel(t *testing.T, name string) {
	t.Helper()
	r.app.exec(t, `UPDATE label SET name = $1 WHERE id = 'l01'`, name)
}

// ready reports whether the server's health check answers OK.
func ready(url string) bool {
	resp, err := http.Get(url + "/")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func TestTransitions(t *testing.T) {
	issues := transitionIssues(t)
	app := newCVRApp(t, issues)
	r := &transitionRig{app: app, api: startAPIServer(t, app.node, app.upstream), d: startDriver(t, app.node)}

	// The initial sync: clients opened before jetsync listens, while it
	// copies the upstream (the sync endpoint accepts sockets before the
	// replica exists), and right after it is ready.
	t.Run("InitialSync", func(t *testing.T) {
		// A lock on label holds the initial sync's copy, so that the
		// "during" clients surely connect before the replica exists.
		lock, err := pgx.Connect(context.Background(), app.upstream)
		if err != nil {
			t.Fatal(err)
		}
		defer lock.Close(context.Background())
		hold, err := lock.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer hold.Rollback(context.Background())
		if _, err := hold.Exec(context.Background(), `LOCK TABLE label IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}

		port := freePort(t)
		url := fmt.Sprintf("http://127.0.0.1:%d", port)
		mark := r.d.mark()
		before := r.openClients(t, url, "initial-before")
		p := start(t, runEnv(t, app.upstream, port, "ZERO_QUERY_URL="+r.api.url+"/query"), "run")
		p.logRecord(t, "jetsync running", 60*time.Second)
		during := r.openClients(t, url, "initial-during")
		for _, name := range append(before, during...) {
			r.d.waitState(t, name, "connected", 60*time.Second)
		}
		// Every client has sent its queries: the replica is still empty.
		time.Sleep(time.Second)
		if ready(url) {
			t.Errorf("GET / answered OK before the replica existed")
		}
		if err := hold.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitHealthy(t, p, url, 3*time.Minute)
		readyAt := time.Now()
		after := r.openClients(t, url, "initial-after")
		all := append(append(before, during...), after...)
		took := r.waitViews(t, all, readyAt, 30*time.Second)
		for _, name := range all {
			t.Logf("%s: complete %v after ready", name, took[name].Round(time.Millisecond))
		}
		r.renameLabel(t, "after the initial sync")
		r.waitViews(t, all, time.Now(), 30*time.Second)
		r.checkNoClientNotFound(t, all, mark)
	})
}
