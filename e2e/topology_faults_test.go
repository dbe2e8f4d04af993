package e2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
)

// newTopologyRig is a fresh upstream loaded with setupSQL and the topology
// on it, nothing started.
func newTopologyRig(t *testing.T, setupSQL string) (*topology, *pgx.Conn, string) {
	t.Helper()
	pgBin(t)
	url := pgtest.NewDB(t, pgtest.Start(t))
	pg, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	if setupSQL != "" {
		if _, err := pg.Exec(context.Background(), setupSQL); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return newTopology(t, url), pg, url
}

// checkR3 checks that the change-streamer's streams and buckets, and the
// view-syncers' ones once they run, are replicated on three nodes.
func (tp *topology) checkR3() {
	tp.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names := []string{tp.shard.ChangesStream(), "KV_" + tp.shard.StateBucket()}
	if tp.procs["view-syncer-1"] != nil {
		names = append(names, tp.shard.CVRStream(), "KV_"+tp.shard.OwnersBucket())
	}
	for _, name := range names {
		s, err := tp.js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			tp.t.Errorf("stream %s missing", name)
			continue
		}
		if err != nil {
			tp.t.Fatal(err)
		}
		if info := s.CachedInfo(); info.Config.Replicas != 3 {
			tp.t.Errorf("stream %s R%d on the cluster; want R3", name, info.Config.Replicas)
		}
	}
}

// TestTopology_ProducerHandoff is issue 8 acceptance point 3: under a
// write workload, the change-streamer is SIGKILLed and a second one, on
// another data dir and task ID (another host), takes over from the stream
// and its snapshot: replication resumes with no gap, no duplicate and no
// new initial sync.
func TestTopology_ProducerHandoff(t *testing.T) {
	seed, tp, url, c, replicaVersion := startProducerRig(t, 8)
	cw := startWriter(t, url, seed)
	first := tp.procs["change-streamer"]
	runFor(t, first, c.randDuration(time.Second, 2*time.Second))
	tp.kill("change-streamer")
	t.Logf("killed the change-streamer after %d transactions", cw.w.seq)

	second := tp.svcs["change-streamer"]
	second.name = "change-streamer-2"
	p := tp.startJetsync(tp.svcs["change-streamer"], second)
	runFor(t, p, c.randDuration(time.Second, 2*time.Second))
	if err := cw.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("the writer committed %d transactions, %d of them big", len(cw.changes), cw.big)
	c.file = filepath.Join(tp.r.root, "change-streamer-2", "backup-replica.db")
	c.waitCaughtUp(2 * time.Minute)
	c.checkReplicaEqualsPostgres()
	if u := c.upstreamRecord(); u.ReplicaVersion != replicaVersion {
		t.Errorf("replica version %s after the handoff; was %s: a resync", u.ReplicaVersion, replicaVersion)
	}
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Errorf("the second change-streamer's exit code %d after SIGTERM; want 0", code)
	}
	c.checkStreamExactlyOnce(cw, replicaVersion)
}

// issueWriter updates issue titles until stopped, as a client app would.
type issueWriter struct {
	stop func()
	n    int
	err  error
}

func startIssueWriter(t *testing.T, pg *pgx.Conn, ids []string) *issueWriter {
	// The writer stops between writes: pgx closes a connection whose
	// query is cancelled, and pg is shared with the test.
	done := make(chan struct{})
	w := &issueWriter{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := pg.Exec(context.Background(), `UPDATE issue SET title = $1 WHERE id = $2`, fmt.Sprintf("write %d", w.n), ids[w.n%len(ids)]); err != nil {
				w.err = err
				return
			}
			w.n++
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	w.stop = sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(w.stop)
	return w
}

// checkIssuesEqual compares a replica's issue table with Postgres's.
func checkIssuesEqual(t *testing.T, pg *pgx.Conn, file string) {
	t.Helper()
	rows, err := pg.Query(context.Background(), `SELECT id, title, open FROM issue ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for rows.Next() {
		var id, title string
		var open bool
		if err := rows.Scan(&id, &title, &open); err != nil {
			t.Fatal(err)
		}
		want[id] = fmt.Sprint(title, open)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	db := openReplica(t, file)
	defer db.Close()
	got := map[string]string{}
	polltest.Until(t, time.Minute, "the replica "+file+" to equal Postgres", func() bool {
		clear(got)
		r, err := db.Query(`SELECT id, title, open FROM issue ORDER BY id`)
		if err != nil {
			return false
		}
		defer r.Close()
		for r.Next() {
			var id, title string
			var open sql.NullInt64
			if r.Scan(&id, &title, &open) != nil {
				return false
			}
			got[id] = fmt.Sprint(title, open.Int64 == 1)
		}
		return len(got) == len(want) && fmt.Sprint(got) == fmt.Sprint(want)
	})
}

// newTopologyApp is the Zero client suite's app (the bench data, with
// docker-compose.yml's demo read permissions) on the topology's upstream,
// for app ID zero.
func newTopologyApp(t *testing.T, issues int) (*topology, *cvrApp) {
	t.Helper()
	bin := pgBin(t)
	node := nodeBin(t)
	tp, pg, url := newTopologyRig(t, "")
	seedBench(t, bin, url, issues)
	// docker-compose.yml's own demo permissions.
	if _, err := pg.Exec(context.Background(), readCompose(t).Configs["demo-permissions"].Content); err != nil {
		t.Fatalf("demo permissions: %v", err)
	}
	return tp, &cvrApp{upstream: url, node: node, pg: pg}
}

// openThroughProxy opens a wired client through the proxy and runs the
// suite's window query.
func (tp *topology) openThroughProxy(t *testing.T, d *zeroDriver, client string) {
	t.Helper()
	d.do(t, map[string]any{"cmd": "open", "client": client, "server": tp.url("proxy", 4848), "userID": "u000001",
		"auth": signToken(t, topoAuthSecret, "u000001", time.Hour), "storageKey": "k", "wire": true})
	ack, _ := d.find(func(ev driverEvent) bool { return ev.Event == "ack" && ev.Cmd == "open" && ev.Client == client })
	if d.groups[client] == "" {
		d.groups[client] = ack.ClientGroupID
	}
	d.do(t, map[string]any{"cmd": "query", "client": client, "id": "open10", "table": "issue",
		"where": openIssuesQuery["where"], "orderBy": openIssuesQuery["orderBy"], "limit": 10})
}

// streamLeader is the node leading the change stream.
func (tp *topology) streamLeader() string {
	tp.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := tp.js.Stream(ctx, tp.shard.ChangesStream())
	if err != nil {
		tp.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
		tp.t.Fatalf("change stream leader: %+v, %v", info, err)
	}
	return info.Cluster.Leader
}

// topologyAll is every service the processes run, in start order.
var topologyAll = []string{"nats1", "nats2", "nats3", "change-streamer", "demo-api", "view-syncer-1", "view-syncer-2", "proxy"}

// replicas are the topology's SQLite replicas.
func (tp *topology) replicas() []string {
	return []string{
		filepath.Join(tp.r.root, "change-streamer", "backup-replica.db"),
		filepath.Join(tp.r.root, "view-syncer-1", "view-syncer-replica.db"),
		filepath.Join(tp.r.root, "view-syncer-2", "view-syncer-replica.db"),
	}
}

// runAll lets the jetsync processes run for d, failing if one exits.
func (tp *topology) runAll(d time.Duration) {
	tp.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for _, n := range []string{"change-streamer", "view-syncer-1", "view-syncer-2", "proxy"} {
			if p := tp.procs[n]; p != nil && p.exited() {
				tp.t.Fatalf("%s exited (%v):\n%s", n, p.err, p.stderr.String())
			}
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
}

// checkNoReload fails if the client reloaded (lost its state) since mark.
func checkNoReload(t *testing.T, d *zeroDriver, client string, mark int) {
	t.Helper()
	w := d.wire(t, client, mark)
	if w.notFound > 0 {
		t.Errorf("client %s got client-state-not-found %d times", client, w.notFound)
	}
	for i, b := range w.opens {
		if b == nil {
			t.Errorf("client %s: socket %d connected without a baseCookie: a full reload", client, i)
		}
	}
	for _, k := range w.errorKinds() {
		t.Logf("client %s got error %s", client, k)
	}
}

// TestTopology_NodeLoss is issue 8 acceptance point 1: while a workload
// writes and the real Zero client syncs through the proxy, the NATS node
// leading the change stream is SIGKILLed and later restarted. Nothing is
// lost: the client keeps syncing, before and after the restart, and every
// replica equals Postgres.
func TestTopology_NodeLoss(t *testing.T) {
	tp, app := newTopologyApp(t, 200)
	tp.start(topologyAll...)
	tp.checkR3()
	d := startDriver(t, app.node)
	tp.openThroughProxy(t, d, "a")
	d.waitRowsEqual(t, "a", "open10", app.want(t))
	mark := d.mark()
	ids := app.windowIDs(t)

	w := startIssueWriter(t, app.pg, ids)
	tp.runAll(time.Second)
	leader := tp.streamLeader()
	killed := time.Now()
	tp.kill(leader)
	t.Logf("killed %s, the change stream's leader, after %d writes", leader, w.n)
	tp.runAll(2 * time.Second)
	w.stop()
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
	d.waitRowsEqual(t, "a", "open10", app.want(t))
	t.Logf("the client caught up %v after %s died, %d writes in all", time.Since(killed).Round(time.Millisecond), leader, w.n)

	tp.restart(leader)
	w = startIssueWriter(t, app.pg, ids)
	tp.runAll(2 * time.Second)
	w.stop()
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
	d.waitRowsEqual(t, "a", "open10", app.want(t))
	checkNoReload(t, d, "a", mark)
	for _, f := range tp.replicas() {
		checkIssuesEqual(t, app.pg, f)
	}
	tp.checkR3()
}

// TestTopology_Failover is issue 8 acceptance point 2: the view-syncer
// owning the client's group is SIGKILLed; the client's next connection,
// through the proxy, is served by the other one with an exact catch-up.
// Then both view-syncers restart in turn, gracefully, under load, and the
// client never reloads.
func TestTopology_Failover(t *testing.T) {
	tp, app := newTopologyApp(t, 200)
	tp.start(topologyAll...)
	leases := &cvrCluster{js: tp.js, shard: tp.shard}
	d := startDriver(t, app.node)
	tp.openThroughProxy(t, d, "a")
	d.waitRowsEqual(t, "a", "open10", app.want(t))
	group := d.groups["a"]
	owner := leases.owner(t, group).ID
	if _, ok := tp.svcs[owner]; !ok {
		t.Fatalf("group %s owned by %q; want a view-syncer", group, owner)
	}

	t.Run("OwnerKilled", func(t *testing.T) {
		base := d.lastCookie(t, "a")
		mark := d.mark()
		tp.kill(owner)
		ids := app.windowIDs(t)
		app.exec(t, `UPDATE issue SET title = 'while the owner was dead' WHERE id = $1`, ids[1])
		d.waitRowsEqual(t, "a", "open10", app.want(t))
		checkCatchup(t, d.wire(t, "a", mark), base, []string{"put:issue:" + ids[1]})
		polltest.Until(t, 30*time.Second, "the survivor to own the group", func() bool {
			o := leases.owner(t, group).ID
			return o != owner && o != ""
		})
	})
	if t.Failed() {
		return
	}
	tp.restart(owner)

	t.Run("RollingRestart", func(t *testing.T) {
		mark := d.mark()
		w := startIssueWriter(t, app.pg, app.windowIDs(t))
		for _, vs := range []string{"view-syncer-1", "view-syncer-2"} {
			tp.runAll(time.Second)
			if code := tp.procs[vs].stop(t, 30*time.Second); code != 0 {
				t.Errorf("%s exit code %d after SIGTERM; want 0", vs, code)
			}
			tp.restart(vs)
		}
		tp.runAll(time.Second)
		w.stop()
		if w.err != nil {
			t.Fatalf("writer: %v", w.err)
		}
		d.waitRowsEqual(t, "a", "open10", app.want(t))
		checkNoReload(t, d, "a", mark)
		t.Logf("%d writes during the rolling restart; group now owned by %s", w.n, leases.owner(t, group).ID)
	})
}

// startProducerRig starts the cluster and one change-streamer over the
// spine schema with seed rows, and waits for its initial sync. stream
// picks the random stream of the test's seed.
func startProducerRig(t *testing.T, stream uint64) (seed uint64, tp *topology, url string, c *crashRig, replicaVersion string) {
	t.Helper()
	seed = crashSeed(t)
	tp, pg, url := newTopologyRig(t, spineSchema+`
		INSERT INTO every (id, t, j, ai) SELECT g, 'seed ' || g, '{"seed": true}', '{1,2}' FROM generate_series(1, 2000) g;
		INSERT INTO pair SELECT 'seed-' || g, g % 5, 'v' FROM generate_series(1, 100) g;`)
	tp.start("nats1", "nats2", "nats3", "change-streamer")
	tp.checkR3()
	c = &crashRig{
		spine: &spine{t: t, pg: pg, url: url, js: tp.js, shard: tp.shard},
		root:  tp.r.root,
		r:     rand.New(rand.NewPCG(seed, stream)),
	}
	polltest.Until(t, 2*time.Minute, "the initial sync", func() bool {
		u := c.upstreamRecord()
		return u != nil && u.Complete
	})
	return seed, tp, url, c, c.upstreamRecord().ReplicaVersion
}
