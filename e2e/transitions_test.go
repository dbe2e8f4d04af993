package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// The transition matrix (issue 12): real clients with a legacy (AST) query
// and a synced (name + args) query, connected before, during and right
// after each transition of the replica, must all end with views equal to
// Postgres, none hanging and none told ClientNotFound where zero-cache
// would not tell it.

// transitionIssues sizes the upstream; a lock, not its size, holds the
// initial sync open while clients connect.
func transitionIssues(t *testing.T) int {
	if s := os.Getenv("JETSYNC_TRANSITION_ISSUES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("JETSYNC_TRANSITION_ISSUES=%q: %v", s, err)
		}
		return n
	}
	return 2000
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
	// checked after each transition unless closed.
	clients []string
	closed  map[string]bool
}

// openClients opens one client per query kind, each its own client group
// on server, named <prefix>-legacy and <prefix>-synced, and materializes
// its labels query.
func (r *transitionRig) openClients(t *testing.T, server, prefix string) []string {
	t.Helper()
	return []string{
		r.openClient(t, server, prefix+"-legacy", prefix+"-legacy", false),
		r.openClient(t, server, prefix+"-synced", prefix+"-synced", true),
	}
}

// openClient opens client name on server, in the client group of
// storageKey (clients sharing one are tabs of one group), and materializes
// its labels query, synced or legacy.
func (r *transitionRig) openClient(t *testing.T, server, name, storageKey string, synced bool) string {
	t.Helper()
	r.d.openWired(t, name, server, "u000001", storageKey)
	r.d.do(t, map[string]any{"cmd": "query", "client": name, "id": "labels", "shape": "labelsAll", "synced": synced})
	r.clients = append(r.clients, name)
	return name
}

// live are the clients opened and not closed since.
func (r *transitionRig) live() []string {
	var out []string
	for _, name := range r.clients {
		if !r.closed[name] {
			out = append(out, name)
		}
	}
	return out
}

func (r *transitionRig) close(t *testing.T, name string) {
	t.Helper()
	r.d.do(t, map[string]any{"cmd": "close", "client": name})
	r.closed[name] = true
}

// waitViews waits until every named client's labels view is complete and
// equals Postgres, for at most timeout, and returns how long after start
// each did.
// It fails naming every client left behind, with what it last had.
func (r *transitionRig) waitViews(t *testing.T, names []string, start time.Time, timeout time.Duration) map[string]time.Duration {
	t.Helper()
	took := map[string]time.Duration{}
	polltest.UntilNil(t, timeout, "the clients' labels views to equal Postgres", func() error {
		want := decodeJSON(t, sqlRows(t, r.app.pg, labelsSQL))
		var behind []string
		for _, name := range names {
			if _, ok := took[name]; ok {
				continue
			}
			ev, ok := r.d.find(func(ev driverEvent) bool { return ev.Event == "rows" && ev.Client == name && ev.ID == "labels" })
			switch {
			case !ok:
				behind = append(behind, "client "+name+": no view yet")
			case !ev.Complete:
				behind = append(behind, fmt.Sprintf("client %s: %s view, %d bytes", name, ev.ResultType, len(ev.Rows)))
			default:
				if diff := cmp.Diff(want, decodeJSON(t, ev.Rows)); diff != "" {
					behind = append(behind, "client "+name+": complete but differs (-postgres +client):\n"+diff)
				} else {
					took[name] = time.Since(start)
				}
			}
		}
		if len(behind) > 0 {
			return errors.New(strings.Join(behind, "\n"))
		}
		return nil
	})
	return took
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

// transition is one transition of the replica as clients live it.
type transition struct {
	server string // where the clients connect
	prefix string // names the clients <prefix>-{before,during,after}-*
	// settle waits for the "before" clients' views before run; false
	// when the server is not up yet.
	settle bool
	// run makes the transition, calling during where the "during"
	// clients connect (it opens them and returns their names); the
	// "after" clients connect once it returns.
	run     func(t *testing.T, during func() []string)
	rename  string        // the label's new name, written after it
	timeout time.Duration // for every live view to equal Postgres after the write
}

// across runs tr with clients connected before, during and right after
// it, then writes upstream and checks that every live client's view
// equals Postgres and that none of these clients was told ClientNotFound.
// It returns the "before" clients and the driver's mark, for a subtest's
// checks of its own.
func (r *transitionRig) across(t *testing.T, tr transition) (before []string, mark int) {
	t.Helper()
	mark = r.d.mark()
	before = r.openClients(t, tr.server, tr.prefix+"-before")
	if tr.settle {
		r.waitViews(t, before, time.Now(), 30*time.Second)
	}
	var during []string
	tr.run(t, func() []string {
		during = r.openClients(t, tr.server, tr.prefix+"-during")
		return during
	})
	after := r.openClients(t, tr.server, tr.prefix+"-after")
	r.renameLabel(t, tr.rename)
	r.waitViews(t, r.live(), time.Now(), tr.timeout)
	r.checkNoClientNotFound(t, append(append(before, during...), after...), mark)
	return before, mark
}

// renameLabel changes a label upstream, so that the views must follow the
// replica after a transition, not only hydrate.
func (r *transitionRig) renameLabel(t *testing.T, name string) {
	t.Helper()
	r.app.exec(t, `UPDATE label SET name = $1 WHERE id = 'l01'`, name)
}

// lockLabels holds an exclusive lock on label, which stops an initial
// sync's copy, until the returned release.
func (r *transitionRig) lockLabels(t *testing.T) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, r.app.upstream)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE label IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	release = func() {
		if conn.IsClosed() {
			return
		}
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
		}
		conn.Close(ctx)
	}
	t.Cleanup(release)
	return release
}

func TestTransitions(t *testing.T) {
	issues := transitionIssues(t)
	app := newCVRApp(t, issues)
	r := &transitionRig{app: app, api: startAPIServer(t, app.node, app.upstream), d: startDriver(t, app.node), closed: map[string]bool{}}

	// The initial sync: clients opened before jetsync listens, while it
	// copies the upstream (the sync endpoint accepts sockets before the
	// replica exists), and right after it is ready.
	t.Run("InitialSync", func(t *testing.T) {
		// A lock on label holds the initial sync's copy, so that the
		// "during" clients surely connect before the replica exists.
		release := r.lockLabels(t)
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
		if body, code := get(t, url+"/"); code != http.StatusServiceUnavailable {
			t.Errorf("GET / before the replica existed = %d %q; want 503", code, body)
		}
		if body, code := get(t, url+"/keepalive"); code != http.StatusOK || body != "OK" {
			t.Errorf("GET /keepalive = %d %q; want 200 OK", code, body)
		}
		release()
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
		// The cluster below replicates the same upstream (and slot) with
		// its own NATS: this server and its clients stop here.
		for _, name := range all {
			r.close(t, name)
		}
	})

	if t.Failed() {
		return
	}

	// The other transitions run on a cluster: a change-streamer and
	// view-syncers sharing a nats-server of their own, which can restart.
	c := newTransitionCluster(t, r)
	vsA := c.startViewSyncer(t, "vs-a")
	vsB := c.startViewSyncer(t, "vs-b")

	// The owner of a group changing: clients of two groups (one per query
	// kind) first served by vs-a, the owner, then through it by vs-b; vs-a
	// dies, and vs-b takes the groups over once the lease expires.
	t.Run("OwnerChange", func(t *testing.T) {
		mark := r.d.mark()
		var first, all []string
		groups := map[string]string{}
		for _, synced := range []bool{false, true} {
			kind := map[bool]string{false: "legacy", true: "synced"}[synced]
			key := "owner-" + kind
			f := r.openClient(t, vsA.url, key+"-first", key, synced)
			r.waitViews(t, []string{f}, time.Now(), 30*time.Second)
			groups[kind] = r.d.groups[f]
			first = append(first, f)
			all = append(all, r.openClient(t, vsB.url, key+"-before", key, synced))
		}
		r.waitViews(t, all, time.Now(), 30*time.Second)
		for kind, g := range groups {
			if o := c.cvr.owner(t, g); o.ID != "vs-a" {
				t.Fatalf("%s group %s owned by %+v; want vs-a", kind, g, o)
			}
		}
		// The clients of the owner go (their socket would retry vs-a).
		for _, f := range first {
			r.close(t, f)
		}
		vsA.kill(t)
		for _, synced := range []bool{false, true} {
			kind := map[bool]string{false: "legacy", true: "synced"}[synced]
			all = append(all, r.openClient(t, vsB.url, "owner-"+kind+"-during", "owner-"+kind, synced))
		}
		for kind, g := range groups {
			polltest.Until(t, 60*time.Second, kind+" group's takeover by vs-b", func() bool { return c.cvr.owner(t, g).ID == "vs-b" })
		}
		for _, synced := range []bool{false, true} {
			kind := map[bool]string{false: "legacy", true: "synced"}[synced]
			all = append(all, r.openClient(t, vsB.url, "owner-"+kind+"-after", "owner-"+kind, synced))
		}
		r.renameLabel(t, "after the owner changed")
		took := r.waitViews(t, r.live(), time.Now(), 60*time.Second)
		for _, name := range all {
			t.Logf("%s: equal %v after the write", name, took[name].Round(time.Millisecond))
		}
		r.checkNoClientNotFound(t, all, mark)
	})
	if t.Failed() {
		return
	}

	// A NATS reconnect: the nats-server restarts under vs-b and the
	// change-streamer, with clients connected before, while it is down and
	// right after.
	t.Run("NATSReconnect", func(t *testing.T) {
		before, mark := r.across(t, transition{server: vsB.url, prefix: "nats", settle: true,
			run: func(t *testing.T, during func() []string) {
				reconnects := countLogs(vsB.p, "nats reconnected")
				c.ns.stop(syscall.SIGKILL)
				during()
				r.renameLabel(t, "while nats was down")
				time.Sleep(time.Second)
				c.ns.start()
				polltest.Until(t, time.Minute, "vs-b to reconnect to nats", func() bool { return countLogs(vsB.p, "nats reconnected") > reconnects })
			},
			rename: "after nats came back", timeout: 60 * time.Second,
		})
		// Nobody could take vs-b's groups over while NATS was away: it
		// keeps them, and their clients are not sent away.
		if n := countLogs(vsB.p, "cvr lease lost"); n > 0 {
			t.Errorf("vs-b lost %d cvr leases across the NATS restart", n)
		}
		for _, name := range before {
			if kinds := r.d.wire(t, name, mark).errorKinds(); len(kinds) > 0 {
				t.Errorf("client %s got %v across the NATS restart", name, kinds)
			}
		}
	})
	if t.Failed() {
		return
	}

	// A restore from a snapshot: a new view-syncer, whose clients are
	// opened before it starts, while it restores the change-streamer's
	// newest snapshot (it listens only after), and once it is ready.
	var vsC *viewSyncer
	outer := t // vs-c outlives the subtest that starts it
	t.Run("Restore", func(t *testing.T) {
		polltest.Until(t, 2*time.Minute, "a restorable snapshot", func() bool { return countLogs(c.cs, "a restorable snapshot exists") > 0 })
		vsC = c.newViewSyncer(t, "vs-c")
		r.across(t, transition{server: vsC.url, prefix: "restore",
			run: func(t *testing.T, during func() []string) {
				vsC.p = start(outer, vsC.env, "view-syncer")
				during()
				waitHealthy(t, vsC.p, vsC.url, 2*time.Minute)
				if !hasLog(vsC.p, "snapshot restored; catching up from the change stream") {
					t.Errorf("vs-c did not restore a snapshot")
				}
			},
			rename: "after the restore", timeout: 60 * time.Second,
		})
	})
	if t.Failed() {
		return
	}

	// A rebuild after a corrupt replica file: vs-c stops, its replica's
	// header is overwritten, and it starts again, drops the file and builds
	// a new replica; its clients reconnect across it.
	t.Run("CorruptReplica", func(t *testing.T) {
		r.across(t, transition{server: vsC.url, prefix: "corrupt", settle: true,
			run: func(t *testing.T, during func() []string) {
				if code := vsC.p.stop(t, 30*time.Second); code != 0 {
					t.Fatalf("vs-c exit code %d after SIGTERM", code)
				}
				file := filepath.Join(c.root, "vs-c", "view-syncer-replica.db")
				f, err := os.OpenFile(file, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt([]byte("not a sqlite database, no"), 0); err != nil {
					t.Fatal(err)
				}
				f.Close()
				vsC.p = start(outer, vsC.env, "view-syncer")
				during()
				waitHealthy(t, vsC.p, vsC.url, 2*time.Minute)
				// With a snapshot to restore, the restore finds the file
				// corrupt and replaces it; without, the replica moves it
				// aside and is rebuilt from the stream.
				if !hasLog(vsC.p, "deleting the local replica") && !hasLog(vsC.p, "replica file is corrupt: moved it aside; starting an empty replica, rebuilt from the change stream") {
					t.Errorf("vs-c did not find its replica corrupt")
				}
			},
			rename: "after the rebuild", timeout: 60 * time.Second,
		})
	})
	if t.Failed() {
		return
	}

	// A resync forced by a schema change: a column name zero-cache
	// rejects makes the change-streamer start a new initial sync, held by
	// the lock on label while the "during" clients connect; vs-b then
	// rebuilds its replica under a new replica version. zero-cache keeps
	// its clients across a newer replica (ClientNotFound is for an older
	// one): they re-hydrate.
	t.Run("Resync", func(t *testing.T) {
		r.across(t, transition{server: vsB.url, prefix: "resync", settle: true,
			run: func(t *testing.T, during func() []string) {
				syncs := countLogs(vsB.p, "initial sync applied")
				release := r.lockLabels(t)
				r.app.exec(t, `ALTER TABLE comment ADD COLUMN "bad name" text`)
				for _, name := range during() {
					r.d.waitState(t, name, "connected", 30*time.Second)
				}
				if countLogs(vsB.p, "initial sync applied") > syncs {
					t.Errorf("vs-b's replica was rebuilt while the lock held the resync's copy")
				}
				release()
				released := time.Now()
				polltest.Until(t, 2*time.Minute, "vs-b's replica to be rebuilt", func() bool { return countLogs(vsB.p, "initial sync applied") > syncs })
				t.Logf("vs-b's replica rebuilt %v after the copy could run", time.Since(released).Round(time.Millisecond))
			},
			rename: "after the resync", timeout: 60 * time.Second,
		})
	})
	if t.Failed() {
		return
	}

	// A rebuild after a gap: while vs-c is down the change stream loses
	// the history its replica needs (purged but for its newest message),
	// so that it must be rebuilt when it starts again: from the next
	// snapshot of the current replica version.
	t.Run("Gap", func(t *testing.T) {
		r.across(t, transition{server: vsC.url, prefix: "gap", settle: true,
			run: func(t *testing.T, during func() []string) {
				if code := vsC.p.stop(t, 30*time.Second); code != 0 {
					t.Fatalf("vs-c exit code %d after SIGTERM", code)
				}
				// A loaded change-streamer may pack the renames into one
				// message, which the purge would keep: one more rename, sent
				// after they went through, is a message of its own.
				for i := range 3 {
					r.renameLabel(t, fmt.Sprintf("during the gap %d", i))
				}
				r.waitViews(t, []string{"nats-before-legacy", "nats-before-synced"}, time.Now(), 30*time.Second)
				r.renameLabel(t, "during the gap 3")
				// Through the stream once vs-b's clients see the last one.
				r.waitViews(t, []string{"nats-before-legacy", "nats-before-synced"}, time.Now(), 30*time.Second)
				ctx := context.Background()
				stream, err := c.cvr.js.Stream(ctx, c.cvr.shard.ChangesStream())
				if err != nil {
					t.Fatal(err)
				}
				if err := stream.Purge(ctx, jetstream.WithPurgeKeep(1)); err != nil {
					t.Fatal(err)
				}
				during()
				vsC.p = start(outer, vsC.env, "view-syncer")
				waitHealthy(t, vsC.p, vsC.url, 2*time.Minute)
				// A replica file that survived is served at once, so the
				// gap may show only once its consumer reads on.
				polltest.Until(t, time.Minute, "vs-c to rebuild its replica after the gap", func() bool {
					return hasLog(vsC.p, "deleting the local replica") || hasLog(vsC.p, "replica missed history; rebuilding it")
				})
			},
			rename: "after the gap", timeout: 90 * time.Second,
		})
	})
}

// transitionCluster is a change-streamer and view-syncers with ZERO_QUERY_URL
// set, on a nats-server child process.
type transitionCluster struct {
	r    *transitionRig
	ns   *natsServer
	cvr  *cvrCluster // for its owner lookup
	root string
	cs   *proc
}

func newTransitionCluster(t *testing.T, r *transitionRig) *transitionCluster {
	t.Helper()
	ns := startNATSServer(t)
	nc, err := nats.Connect(ns.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := &transitionCluster{r: r, ns: ns, root: t.TempDir(), cvr: &cvrCluster{app: r.app, js: js, shard: streams.Shard{App: zeroAppID}}}
	c.cs = start(t, append(c.common(), "JETSYNC_DATA_DIR="+filepath.Join(c.root, "cs"), "ZERO_UPSTREAM_DB="+r.app.upstream,
		"ZERO_APP_PUBLICATIONS="+zeroPublication, "ZERO_PORT=0",
		// A snapshot every 6 s: a replica that lost its history restores
		// the next one (after a resync, the old ones do not fit).
		"ZERO_LITESTREAM_INCREMENTAL_BACKUP_INTERVAL_MINUTES=0.1"), "change-streamer")
	c.cs.logRecord(t, "http listening", 30*time.Second)
	return c
}

func (c *transitionCluster) common() []string {
	return []string{"JETSYNC_NATS_URL=" + c.ns.url, "ZERO_APP_ID=" + zeroAppID, "ZERO_LOG_FORMAT=json"}
}

// startViewSyncer starts view-syncer id on a port of its own, with a short
// lease and the API server for synced queries, and waits until it is ready.
func (c *transitionCluster) startViewSyncer(t *testing.T, id string, extra ...string) *viewSyncer {
	t.Helper()
	vs := c.newViewSyncer(t, id, extra...)
	vs.restart(t)
	return vs
}

// newViewSyncer is startViewSyncer's view-syncer, not started.
func (c *transitionCluster) newViewSyncer(t *testing.T, id string, extra ...string) *viewSyncer {
	t.Helper()
	port := freePort(t)
	vs := &viewSyncer{id: id, url: fmt.Sprintf("http://127.0.0.1:%d", port)}
	vs.env = append(c.common(),
		"JETSYNC_DATA_DIR="+filepath.Join(c.root, id),
		"ZERO_TASK_ID="+id,
		"ZERO_PORT="+strconv.Itoa(port),
		"JETSYNC_ADVERTISE_ADDRESS="+fmt.Sprintf("ws://127.0.0.1:%d", port),
		"JETSYNC_CVR_LEASE_TTL=2s",
		"ZERO_AUTH_SECRET="+zeroSecret,
		"JETSYNC_PEER_SECRET=e2e-peer-secret",
		"ZERO_QUERY_URL="+c.r.api.url+"/query",
	)
	vs.env = append(vs.env, extra...)
	return vs
}
