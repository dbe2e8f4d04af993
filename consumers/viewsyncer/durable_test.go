package viewsyncer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// issue7 is one issue and its owner.
const issue7 = `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"i0000007"},"op":"="},"related":[{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"},"system":"client"}]}`

// expectCatchup reads the poke a reconnecting client at base gets and
// checks that it carries exactly the rows want names (by substring), and
// nothing else.
func expectCatchup(t *testing.T, c *tc, base string, want ...string) pokeSummary {
	t.Helper()
	c.expect("connected")
	return catchupPoke(t, c, base, want...)
}

func catchupPoke(t *testing.T, c *tc, base string, want ...string) pokeSummary {
	t.Helper()
	p := c.poke()
	if p.base == nil || *p.base != base || p.cookie <= base {
		t.Fatalf("catch-up poke from %v to %s; want from %s to a later cookie", p.base, p.cookie, base)
	}
	if len(p.patches) != len(want) {
		t.Fatalf("catch-up = %v; want %d patches %v", p.patches, len(want), want)
	}
	for i, w := range want {
		if !strings.Contains(p.patches[i], w) {
			t.Errorf("catch-up patch %d = %s; want one with %s", i, p.patches[i], w)
		}
	}
	return p
}

// dialUntilServed connects until the server stops answering with Rehome;
// it has read the "connected" frame.
func dialUntilServed(t *testing.T, e *env, o dialOpts) *tc {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c := connect(t, e, o)
		tag, body := c.next()
		if tag == "connected" {
			return c
		}
		var pe protocolError
		_ = json.Unmarshal(body, &pe)
		if tag != "error" || pe.Kind != kindRehome {
			t.Fatalf("got %s %s; want connected or Rehome", tag, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("still Rehome after 15s: %s", body)
		}
		c.ws.Close()
	}
}

// checkHistory checks the CVR stream's invariant for a group: every
// update follows the one before it (Prev is the previous message's
// sequence) and advances the version, so no two writers interleaved.
// It returns the writers, in order of first write.
func checkHistory(t *testing.T, e *env, group string) []string {
	t.Helper()
	ctx := context.Background()
	stream, err := e.js.Stream(ctx, e.shard.CVRStream())
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetLastMsgForSubject(ctx, e.shard.CVRSubject(group))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := e.js.OrderedConsumer(ctx, e.shard.CVRStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{e.shard.CVRSubject(group)}})
	if err != nil {
		t.Fatal(err)
	}
	var prevSeq uint64
	var prevVersion string
	var owners []string
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		md, _ := msg.Metadata()
		m, err := streams.DecodeCVR(msg.Data())
		if err != nil {
			t.Fatal(err)
		}
		if m.Prev != prevSeq {
			t.Errorf("seq %d by %s follows %d; want %d", md.Sequence.Stream, m.Owner, m.Prev, prevSeq)
		}
		if m.Version < prevVersion {
			t.Errorf("seq %d by %s goes back from version %s to %s", md.Sequence.Stream, m.Owner, prevVersion, m.Version)
		}
		if len(owners) == 0 || owners[len(owners)-1] != m.Owner {
			owners = append(owners, m.Owner)
		}
		prevSeq, prevVersion = md.Sequence.Stream, m.Version
		if md.Sequence.Stream >= last.Sequence {
			break
		}
	}
	return owners
}

func TestDurable_Restart(t *testing.T) {
	for _, tc := range []struct{ name, next string }{
		{"SameSyncer", "vs-a"},
		// Another syncer has no local projection: it rebuilds from the
		// stream.
		{"Rebuild", "vs-b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := envOptions{issues: 30, durable: true}
			e := newEnv(t, o)
			c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
			first := c.hydrated()
			if countPrefix(first, "row ") != 2 {
				t.Fatalf("hydration = %v; want the issue and its owner", first.patches)
			}
			c.ws.Close()
			e.sy.stop()
			e.execSQL("UPDATE issue SET title = 'while down' WHERE id = 'i0000007'")
			e.execSQL("UPDATE issue SET title = 'elsewhere' WHERE id = 'i0000008'")
			e.use(e.startSyncer(tc.next, o))
			c = connect(t, e, dialOpts{group: "g", client: "c1", base: first.cookie, init: initFrame("")})
			p := expectCatchup(t, c, first.cookie, `while down`)
			// The catch-up's cookie is durable too.
			c.ws.Close()
			e.sy.stop()
			e.use(e.startSyncer("vs-c", o))
			c = connect(t, e, dialOpts{group: "g", client: "c1", base: p.cookie, init: initFrame("")})
			c.expect("connected")
			if q := c.poke(); len(q.patches) != 0 || *q.base != p.cookie {
				t.Errorf("reconnect at the current cookie = %+v; want an empty poke from %s", q, p.cookie)
			}
			checkHistory(t, e, "g")
		})
	}
}

func TestDurable_Takeover(t *testing.T) {
	o := envOptions{issues: 30, durable: true, leaseTTL: 900 * time.Millisecond}
	e := newEnv(t, o)
	a := e.sy
	b := e.startSyncer("vs-b", o)
	c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
	first := c.hydrated()

	// The peer that does not own the group serves its clients through
	// the owner.
	e.use(b)
	d := connect(t, e, dialOpts{group: "g", client: "c2", init: initFrame("")})
	d.expect("connected")
	if p := d.poke(); countPrefix(p, "row ") != 2 {
		t.Fatalf("forwarded client's poke = %v; want the issue and its owner", p.patches)
	}
	e.execSQL("UPDATE issue SET title = 'forwarded' WHERE id = 'i0000007'")
	if p := d.poke(); len(p.patches) != 1 || !strings.Contains(p.patches[0], "forwarded") {
		t.Errorf("forwarded client's poke = %v; want the issue's new title", p.patches)
	}
	first = c.poke()

	// Once the owner is gone and its lease ran out, the peer serves the
	// group from the stream, exactly.
	a.crash()
	e.execSQL("UPDATE issue SET title = 'taken over' WHERE id = 'i0000007'")
	c = dialUntilServed(t, e, dialOpts{group: "g", client: "c1", base: first.cookie, init: initFrame("")})
	catchupPoke(t, c, first.cookie, "taken over")
	e.execSQL("UPDATE issue SET title = 'after' WHERE id = 'i0000007'")
	if p := c.poke(); len(p.patches) != 1 || !strings.Contains(p.patches[0], "after") {
		t.Errorf("poke = %v; want the issue's new title", p.patches)
	}
	if got := checkHistory(t, e, "g"); strings.Join(got, ",") != "vs-a,vs-b" {
		t.Errorf("writers = %v; want vs-a, then vs-b", got)
	}
}

func TestDurable_LeaseLost(t *testing.T) {
	o := envOptions{issues: 30, durable: true, leaseTTL: 600 * time.Millisecond}
	e := newEnv(t, o)
	c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
	first := c.hydrated()

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
	c.expectError(kindRehome, "CVR ownership was transferred to thief at ", closeNormal)

	// The group is not served, nor written, while the thief holds it.
	e.execSQL("UPDATE issue SET title = 'stolen' WHERE id = 'i0000007'")
	d := connect(t, e, dialOpts{group: "g", client: "c1", base: first.cookie, init: initFrame("")})
	d.expectError(kindRehome, "CVR ownership was transferred to thief at ", closeNormal)
	if got := checkHistory(t, e, "g"); strings.Join(got, ",") != "vs-a" {
		t.Errorf("writers = %v; want vs-a alone", got)
	}
}

func TestServer_IdleUnload(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(map[bool]string{false: "Memory", true: "Durable"}[durable], func(t *testing.T) {
			e := newEnv(t, envOptions{issues: 30, durable: durable, groupIdle: 50 * time.Millisecond})
			c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
			first := c.hydrated()
			c.ws.Close()
			waitUnloaded(t, e, "g")
			e.execSQL("UPDATE issue SET title = 'while unloaded' WHERE id = 'i0000007'")
			c = connect(t, e, dialOpts{group: "g", client: "c1", base: first.cookie, init: initFrame("")})
			expectCatchup(t, c, first.cookie, "while unloaded")
		})
	}
}

// waitUnloaded waits until the group left memory and, with a durable
// store, gave its lease up.
func waitUnloaded(t *testing.T, e *env, group string) {
	t.Helper()
	polltest.Until(t, 10*time.Second, "group "+group+" unloaded", func() bool {
		e.srv.mu.Lock()
		_, ok := e.srv.groups[group]
		e.srv.mu.Unlock()
		if ok || e.sy.store == nil {
			return !ok
		}
		o, err := e.sy.store.Owner(context.Background(), group)
		return err == nil && o.ID == ""
	})
}

// The TTL clock stops while a group has no connection (docs/protocol.md
// §12), so an inactive query outlives an unloaded group's absence, and
// expires once its clients are back for the rest of its TTL.
func TestDurable_TTLWhileUnloaded(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30, durable: true, groupIdle: 50 * time.Millisecond})
	c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("a", issue7, 400))})
	c.hydrated()
	c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + del("a") + `]}]`)
	inactive := c.poke()
	if !has(inactive, `desired c1 {"hash":"a","op":"del"}`) {
		t.Fatalf("poke = %v; want desired del a", inactive.patches)
	}
	c.ws.Close()
	gone := time.Now()
	waitUnloaded(t, e, "g")
	// Wall time well past the TTL.
	polltest.Until(t, 10*time.Second, "the TTL to pass in wall time", func() bool { return time.Since(gone) > time.Second })

	c = connect(t, e, dialOpts{group: "g", client: "c1", base: inactive.cookie, init: initFrame("")})
	c.expect("connected")
	back := time.Now()
	if p := c.poke(); len(p.patches) != 0 {
		t.Fatalf("catch-up = %v; want nothing: the query's TTL has not run out on the group's clock", p.patches)
	}
	p := c.poke()
	if !has(p, `got {"hash":"a","op":"del"}`) || countPrefix(p, "row ") != 2 {
		t.Errorf("eviction = %v; want got del a and both rows deleted", p.patches)
	}
	// The rest of the TTL, plus the eviction check's period and slack.
	if waited := time.Since(back); waited > 900*time.Millisecond {
		t.Errorf("evicted %v after the client returned; want within the TTL's rest", waited)
	}
}

// storeReplicaVersion rewrites group g's stored CVR as built from replica
// version rv.
func storeReplicaVersion(t *testing.T, e *env, g, rv string) {
	t.Helper()
	ctx := context.Background()
	st := e.sy.store
	lease, err := st.Acquire(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	w, err := st.Load(ctx, g, lease)
	if err != nil {
		t.Fatal(err)
	}
	s, err := w.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := s.Instance
	in.ReplicaVersion = rv
	if err := w.Publish(ctx, in.Version, []streams.CVREvent{{Op: streams.CVROpInstance, Instance: &in}}); err != nil {
		t.Fatal(err)
	}
	if err := st.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

// TestDurable_ReplicaChanged: a CVR built from a newer replica than this
// view-syncer's cannot be caught up from it (ClientNotFound, as zero-cache).
func TestDurable_ReplicaChanged(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30, durable: true, groupIdle: 50 * time.Millisecond})
	c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
	first := c.hydrated()
	c.ws.Close()
	waitUnloaded(t, e, "g")
	storeReplicaVersion(t, e, "g", "zznew")

	c = connect(t, e, dialOpts{group: "g", client: "c1", base: first.cookie, init: initFrame("")})
	c.expect("connected")
	c.expectError(kindClientNotFound, "Cannot sync from older replica: CVR=zznew, DB="+e.version, closeNormal)
	// The group starts over.
	c = connect(t, e, dialOpts{group: "g", client: "c2", init: initFrame(testSchema, put("a", issue7, 0))})
	if p := c.hydrated(); countPrefix(p, "row ") != 2 {
		t.Errorf("fresh hydration = %v; want the issue and its owner", p.patches)
	}
}

// TestDurable_NewerReplica: a CVR built from an older replica (the replica
// was resynced since) keeps its client, as zero-cache's does: the queries
// re-hydrate from the new replica and the client catches up.
func TestDurable_NewerReplica(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30, durable: true, groupIdle: 50 * time.Millisecond})
	c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
	first := c.hydrated()
	c.ws.Close()
	waitUnloaded(t, e, "g")
	storeReplicaVersion(t, e, "g", "0old")

	c = connect(t, e, dialOpts{group: "g", client: "c1", base: first.cookie, init: initFrame("")})
	c.expect("connected")
	if p := c.poke(); p.base == nil || *p.base != first.cookie {
		t.Fatalf("catch-up poke %+v; want one from the client's cookie %s", p, first.cookie)
	}
	c.ws.Close()
	waitUnloaded(t, e, "g")
	// The CVR now names the replica it was caught up from.
	ctx := context.Background()
	lease, err := e.sy.store.Acquire(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.sy.store.Load(ctx, "g", lease)
	if err != nil {
		t.Fatal(err)
	}
	st, err := w.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Instance.ReplicaVersion != e.version {
		t.Errorf("stored replica version %q; want %q", st.Instance.ReplicaVersion, e.version)
	}
}

func TestServer_Drain(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30, durable: true})
	var clients []*tc
	for _, g := range []string{"g1", "g2", "g3"} {
		c := connect(t, e, dialOpts{group: g, client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
		c.hydrated()
		clients = append(clients, c)
	}
	e.sy.drain()
	// Each client is closed plainly, as zero-cache's drain does, and its
	// group's lease is given up for a peer to take at once.
	for i, c := range clients {
		c.expectClose(closeNormal)
		o, err := e.sy.store.Owner(context.Background(), fmt.Sprintf("g%d", i+1))
		if err != nil || o.ID != "" {
			t.Errorf("g%d owner after the drain = %+v, %v; want none", i+1, o, err)
		}
	}
	// A connection that arrives while the server shuts down goes elsewhere.
	c := connect(t, e, dialOpts{group: "g1", client: "c1", init: initFrame("")})
	c.expectError(kindRehome, "Reconnect required", closeNormal)
}

func TestDurable_Purged(t *testing.T) {
	o := envOptions{issues: 30, durable: true, groupIdle: 50 * time.Millisecond,
		gc: cvrstore.GCConfig{Inactivity: 100 * time.Millisecond, Interval: 50 * time.Millisecond, BatchSize: 25}}
	e := newEnv(t, o)
	c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
	first := c.hydrated()
	c.ws.Close()
	polltest.Until(t, 10*time.Second, "garbage collection to purge the group", func() bool {
		st, err := e.sy.store.Load(context.Background(), "g", nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := st.State(context.Background())
		return err == nil && s.Instance.Deleted
	})
	// Whether it has a cookie or not, a client of the purged group is
	// told so as zero-cache tells it.
	for _, base := range []string{first.cookie, ""} {
		c = connect(t, e, dialOpts{group: "g", client: "c2", base: base, init: initFrame("")})
		c.expectError(kindClientNotFound, "Client has been purged due to inactivity", closeNormal)
	}
}
