package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

// cvrCluster is a change-streamer and view-syncers sharing one NATS
// server, which runs in the test so that killing a view-syncer leaves it.
type cvrCluster struct {
	app   *cvrApp
	ns    *server.Server
	js    jetstream.JetStream
	root  string
	shard streams.Shard
}

func newCVRCluster(t *testing.T, app *cvrApp) *cvrCluster {
	t.Helper()
	ns := natstest.Start(t)
	_, js := natstest.Connect(t, ns)
	c := &cvrCluster{app: app, ns: ns, js: js, root: t.TempDir(), shard: streams.Shard{App: zeroAppID}}
	cs := start(t, append(c.common(), "JETSYNC_DATA_DIR="+filepath.Join(c.root, "cs"), "ZERO_UPSTREAM_DB="+app.upstream,
		"ZERO_APP_PUBLICATIONS="+zeroPublication, "ZERO_PORT=0"), "change-streamer")
	cs.logRecord(t, "http listening", 30*time.Second)
	return c
}

func (c *cvrCluster) common() []string {
	return []string{"JETSYNC_NATS_URL=" + c.ns.ClientURL(), "ZERO_APP_ID=" + zeroAppID, "ZERO_LOG_FORMAT=json"}
}

// viewSyncer is a `jetsync view-syncer` on a fixed port, so that a
// restarted one is found where its clients left it.
type viewSyncer struct {
	id, url string
	env     []string
	p       *proc
}

// startViewSyncer starts view-syncer id with a short lease, extra env
// added.
func (c *cvrCluster) startViewSyncer(t *testing.T, id string, extra ...string) *viewSyncer {
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
	)
	vs.env = append(vs.env, extra...)
	vs.restart(t)
	return vs
}

func (vs *viewSyncer) restart(t *testing.T) {
	t.Helper()
	vs.p = start(t, vs.env, "view-syncer")
	waitHealthy(t, vs.p, vs.url, 90*time.Second)
}

// kill SIGKILLs the view-syncer's process group.
func (vs *viewSyncer) kill(t *testing.T) {
	t.Helper()
	_ = syscall.Kill(-vs.p.cmd.Process.Pid, syscall.SIGKILL)
	<-vs.p.done
}

// owner reads a group's lease record.
func (c *cvrCluster) owner(t *testing.T, group string) streams.CVROwner {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var o streams.CVROwner
	kv, err := c.js.KeyValue(ctx, c.shard.OwnersBucket())
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, streams.OwnerKey(group))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return o
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(e.Value(), &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// cvrMsg is one message of a group's CVR subject, as read from the stream.
type cvrMsg struct {
	seq     uint64
	deleted bool
	m       *streams.CVRMessage
}

// history reads a group's CVR subject from the stream.
func (c *cvrCluster) history(t *testing.T, group string) []cvrMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := c.shard.CVRSubject(group)
	s, err := c.js.Stream(ctx, c.shard.CVRStream())
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	cons, err := c.js.OrderedConsumer(ctx, c.shard.CVRStream(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		t.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	var out []cvrMsg
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			t.Fatalf("read %s: %v", subj, err)
		}
		md, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		m, err := streams.DecodeCVR(msg.Data())
		if err != nil {
			t.Fatalf("decode %s seq %d: %v", subj, md.Sequence.Stream, err)
		}
		out = append(out, cvrMsg{seq: md.Sequence.Stream, deleted: msg.Headers().Get(streams.CVRHeaderDeleted) != "", m: m})
		if md.Sequence.Stream >= last.Sequence {
			return out
		}
	}
}

// checkOneWriter asserts the CVR stream's invariant for a group: the
// messages form one chain (each names the one before it as Prev, so no
// writer appended to a history it had not read), the versions never go
// back and strictly increase from one writer's update to the next
// writer's, and every version has exactly one writer. A writer may repeat
// its own version: a snapshot, or the TTL clock written on unload.
func checkOneWriter(t *testing.T, h []cvrMsg) (writers map[string]int) {
	t.Helper()
	writers = map[string]int{}
	versionWriter := map[string]string{}
	for i, e := range h {
		m := e.m
		writers[m.Owner]++
		if w, ok := versionWriter[m.Version]; ok && w != m.Owner {
			t.Errorf("seq %d: version %s written by %s and by %s", e.seq, m.Version, w, m.Owner)
		}
		versionWriter[m.Version] = m.Owner
		if i == 0 {
			continue
		}
		prev := h[i-1]
		if m.Part == 0 && m.Prev != prev.seq && !(len(m.Events) > 0 && m.Events[0].Op == streams.CVROpSnapshot) {
			t.Errorf("seq %d names prev %d; the message before it is %d: a forked history", e.seq, m.Prev, prev.seq)
		}
		switch {
		case m.Version < prev.m.Version:
			t.Errorf("seq %d (%s): version %s after %s: went back", e.seq, m.Owner, m.Version, prev.m.Version)
		case m.Version == prev.m.Version && m.Owner != prev.m.Owner:
			t.Errorf("seq %d: %s wrote version %s again after %s", e.seq, m.Owner, m.Version, prev.m.Owner)
		}
	}
	return writers
}

// TestCVR_Takeover is issue 5's acceptance point 2: two view-syncers share
// one NATS. A client of the non-owner is served through the owner; the
// owner is SIGKILLed and the client reconnects through the survivor, which
// takes the group over once the lease expires and catches the client up
// exactly. Then one is killed while both take connections for the group,
// and the CVR stream shows that only one ever advanced it at a time.
func TestCVR_Takeover(t *testing.T) {
	app := newCVRApp(t, 200)
	c := newCVRCluster(t, app)
	vsA := c.startViewSyncer(t, "vs-a")
	vsB := c.startViewSyncer(t, "vs-b")
	d := startDriver(t, app.node)
	query := func(client string) {
		d.do(t, map[string]any{"cmd": "query", "client": client, "id": "open10", "table": "issue",
			"where": openIssuesQuery["where"], "orderBy": openIssuesQuery["orderBy"], "limit": 10})
	}

	d.openWired(t, "a", vsA.url, "u000001", "k")
	query("a")
	d.waitRowsEqual(t, "a", "open10", app.want(t))
	group := d.groups["a"]
	if o := c.owner(t, group); o.ID != "vs-a" {
		t.Fatalf("group %s owned by %+v after a client of vs-a; want vs-a", group, o)
	}

	t.Run("ServedThroughOwner", func(t *testing.T) {
		// Same user and storage: a second client of the same group.
		ack := d.openWired(t, "b", vsB.url, "u000001", "k")
		if ack.ClientGroupID != group {
			t.Fatalf("b's client group %s; want a's %s", ack.ClientGroupID, group)
		}
		query("b")
		d.waitRowsEqual(t, "b", "open10", app.want(t))
		ids := app.windowIDs(t)
		app.exec(t, `UPDATE issue SET title = 'seen through the owner' WHERE id = $1`, ids[0])
		d.waitRowsEqual(t, "a", "open10", app.want(t))
		d.waitRowsEqual(t, "b", "open10", app.want(t))
		if o := c.owner(t, group); o.ID != "vs-a" {
			t.Errorf("group owned by %+v after b was served; want vs-a still", o)
		}
		for _, e := range c.history(t, group) {
			if e.m.Owner != "vs-a" {
				t.Errorf("seq %d written by %s; want only the owner vs-a", e.seq, e.m.Owner)
			}
		}
	})
	if t.Failed() {
		return
	}

	t.Run("OwnerKilled", func(t *testing.T) {
		before := d.lastCookie(t, "b")
		d.do(t, map[string]any{"cmd": "close", "client": "a"})
		// a's query goes inactive, and b is poked about it: the catch-up
		// starts from that poke's cookie.
		polltest.Until(t, 10*time.Second, "b's poke about a's closed query", func() bool {
			return d.lastCookie(t, "b") != before
		})
		base := d.lastCookie(t, "b")
		mark := d.mark()
		killed := time.Now()
		vsA.kill(t)
		ids := app.windowIDs(t)
		app.exec(t, `UPDATE issue SET title = 'while the owner was dead' WHERE id = $1`, ids[1])
		d.waitRowsEqual(t, "b", "open10", app.want(t))
		t.Logf("b caught up through vs-b %v after the owner died", time.Since(killed).Round(time.Millisecond))
		checkCatchup(t, d.wire(t, "b", mark), base, []string{"put:issue:" + ids[1]})
		if o := c.owner(t, group); o.ID != "vs-b" {
			t.Errorf("group owned by %+v after the takeover; want vs-b", o)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("KillWhileBothServe", func(t *testing.T) {
		vsA.restart(t)
		// Clients of the same group on both view-syncers, all syncing
		// while Postgres changes under them.
		for i, vs := range []*viewSyncer{vsA, vsB, vsA, vsB} {
			name := fmt.Sprintf("c%d", i)
			d.openWired(t, name, vs.url, "u000001", "k")
			query(name)
		}
		// The writes have their own connection, and finish the one in
		// flight when told to stop: a cancelled query closes a pgx conn.
		writer, err := pgx.Connect(context.Background(), app.upstream)
		if err != nil {
			t.Fatal(err)
		}
		defer writer.Close(context.Background())
		ids := app.windowIDs(t)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			tick := time.NewTicker(30 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				if _, err := writer.Exec(context.Background(), `UPDATE issue SET title = $1 WHERE id = $2`, fmt.Sprintf("write %d", n), ids[n%len(ids)]); err != nil {
					t.Errorf("write %d: %v", n, err)
					return
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		})
		stopWrites := sync.OnceFunc(func() { close(stop); wg.Wait() })
		defer stopWrites()
		for _, name := range []string{"c0", "c1", "c2", "c3"} {
			d.waitState(t, name, "connected", 30*time.Second)
		}
		// The owner dies while all four sync.
		vsB.kill(t)
		// Clients of vs-b retry it; vs-b comes back while vs-a may
		// already be taking over, and both get connections again.
		vsB.restart(t)
		stopWrites()
		for _, name := range []string{"c0", "c1", "c2", "c3", "b"} {
			d.waitRowsEqual(t, name, "open10", app.want(t))
		}
		h := c.history(t, group)
		writers := checkOneWriter(t, h)
		t.Logf("%d CVR messages for the group; writers %v", len(h), writers)
		if writers["vs-a"] == 0 || writers["vs-b"] == 0 {
			t.Errorf("writers %v; want both view-syncers to have owned the group in turn", writers)
		}
	})
}
