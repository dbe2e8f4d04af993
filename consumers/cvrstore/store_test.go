package cvrstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/projections/cvr"
	"github.com/jetsync/jetsync/streams"
)

var shard = streams.Shard{App: "zero"}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openStore opens a store on ns with its projection in file ("" for a new
// one); adjust changes its config.
func openStore(t *testing.T, ns *server.Server, owner, file string, adjust ...func(*Config)) *Store {
	t.Helper()
	_, js := natstest.Connect(t, ns)
	if file == "" {
		file = filepath.Join(t.TempDir(), "cvr.db")
	}
	cfg := Config{JS: js, Shard: shard, File: file, OwnerID: owner, Address: "ws://" + owner + ":4848", CompactAfter: -1}
	for _, f := range adjust {
		f(&cfg)
	}
	s, err := Open(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func load(t *testing.T, s *Store, group string) *Group {
	t.Helper()
	g, err := s.Load(testCtx(t), group, nil)
	if err != nil {
		t.Fatalf("Load(%q): %v", group, err)
	}
	return g
}

func state(t *testing.T, g *Group) *cvr.State {
	t.Helper()
	st, err := g.State(testCtx(t))
	if err != nil {
		t.Fatalf("State: %v", err)
	}
	return st
}

var ignoreProgress = cmpopts.IgnoreFields(cvr.State{}, "Progress")

// history makes deterministic CVR updates for one group.
type history struct {
	r *rand.Rand
	n int
}

func newHistory(seed uint64) *history { return &history{r: rand.New(rand.NewPCG(seed, 7))} }

// next is the next update: its version and events. rows sets how many row
// records it touches.
func (h *history) next(rows int) (string, []streams.CVREvent) {
	h.n++
	v := fmt.Sprintf("v%05d", h.n)
	in := streams.CVRInstance{Version: v, ReplicaVersion: "r1", TTLClockMs: float64(h.n) * 10.5, LastActiveMs: int64(h.n), Owner: "x"}
	evs := []streams.CVREvent{{Op: streams.CVROpInstance, Instance: &in}}
	if h.n == 1 {
		evs = append(evs, streams.CVREvent{Op: streams.CVROpClientSchema, ClientSchema: json.RawMessage(`{"tables":{"issue":{}}}`)})
	}
	c, q := fmt.Sprintf("c%d", h.r.IntN(3)), fmt.Sprintf("q%d", h.r.IntN(4))
	evs = append(evs,
		streams.CVREvent{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: c}},
		streams.CVREvent{Op: streams.CVROpPutQuery, Query: &streams.CVRQuery{Hash: q, AST: json.RawMessage(`{"table":"issue"}`), Got: true, PatchVersion: v}},
		streams.CVREvent{Op: streams.CVROpPutDesire, Desire: &streams.CVRDesire{ClientID: c, Hash: q, TTLMs: 300000, PatchVersion: v}},
	)
	for range rows {
		r := streams.CVRRow{Table: "issue", Key: json.RawMessage(fmt.Sprintf(`{"id":"i%04d"}`, h.r.IntN(2000))), RowVersion: v, PatchVersion: v}
		switch h.r.IntN(5) {
		case 0: // tombstone
		case 1:
			evs = append(evs, streams.CVREvent{Op: streams.CVROpDelRow, Row: &streams.CVRRow{Table: r.Table, Key: r.Key}})
			continue
		default:
			r.Refs = map[string]int{q: 1}
		}
		evs = append(evs, streams.CVREvent{Op: streams.CVROpPutRow, Row: &r})
	}
	return v, evs
}

func publishN(t *testing.T, g *Group, h *history, n, rows int) {
	t.Helper()
	for range n {
		v, evs := h.next(rows)
		if err := g.Publish(testCtx(t), v, evs); err != nil {
			t.Fatalf("Publish(%s): %v", v, err)
		}
	}
}

func subjectMsgs(t *testing.T, s *Store, group string) uint64 {
	t.Helper()
	info, err := s.stream.Info(testCtx(t), jetstream.WithSubjectFilter(shard.CVRSubject(group)))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[shard.CVRSubject(group)]
}

func TestStore_RebuildEqualsIncremental(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxBytes int
		rows     int
	}{
		{"OneMessagePerUpdate", 0, 20},
		{"AtomicBatches", 4096, 120},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := natstest.Start(t)
			setMax := func(c *Config) { c.MaxMessageBytes = tc.maxBytes }
			file := filepath.Join(t.TempDir(), "a.db")
			a := openStore(t, ns, "a", file, setMax)
			ga := load(t, a, "cg/1 ")  // escaped on the subject
			other := load(t, a, "cg2") // interleaved on the stream
			h, h2 := newHistory(1), newHistory(2)
			for range 15 {
				publishN(t, ga, h, 1, tc.rows)
				publishN(t, other, h2, 1, 3)
			}
			want := state(t, ga)
			if want.Instance.Version != "v00015" || len(want.Rows) == 0 {
				t.Fatalf("state at %q with %d rows", want.Instance.Version, len(want.Rows))
			}
			if tc.maxBytes > 0 && subjectMsgs(t, a, "cg/1 ") <= 15 {
				t.Errorf("updates did not span several messages")
			}

			// Rebuilt from the stream alone.
			b := openStore(t, ns, "b", "", setMax)
			gb := load(t, b, "cg/1 ")
			if d := cmp.Diff(want, state(t, gb), ignoreProgress); d != "" {
				t.Errorf("rebuild differs (-incremental +rebuilt):\n%s", d)
			}
			if info := gb.Info(); info.FromSeq != 0 || info.Replayed != int(subjectMsgs(t, a, "cg/1 ")) {
				t.Errorf("rebuild info = %+v", info)
			}

			// B writes next, then A reopens its file and replays only that.
			publishN(t, gb, h, 2, tc.rows)
			a.Close()
			a2 := openStore(t, ns, "a", file, setMax)
			ga2 := load(t, a2, "cg/1 ")
			if info := ga2.Info(); info.FromSeq != ga.Seq() || info.Replayed == 0 || info.Replayed > 2*(1+tc.rows/20) || info.Rebuilt {
				t.Errorf("reload info = %+v; want a replay of B's two updates from seq %d", info, ga.Seq())
			}
			if d := cmp.Diff(state(t, gb), state(t, ga2), ignoreProgress); d != "" {
				t.Errorf("local file plus events differs (-rebuilt +reloaded):\n%s", d)
			}
			// Loading again redelivers nothing.
			if info := load(t, a2, "cg/1 ").Info(); info.Replayed != 0 {
				t.Errorf("second load replayed %d", info.Replayed)
			}
		})
	}
}

func TestStore_Compaction(t *testing.T) {
	ns := natstest.Start(t)
	file := filepath.Join(t.TempDir(), "a.db")
	compact := func(c *Config) { c.CompactAfter = 10 }
	a := openStore(t, ns, "a", file, compact)
	ga := load(t, a, "cg")
	h := newHistory(3)
	publishN(t, ga, h, 8, 5)

	// B keeps a local projection from before the compaction.
	bfile := filepath.Join(t.TempDir(), "b.db")
	b := openStore(t, ns, "b", bfile)
	load(t, b, "cg")

	publishN(t, ga, h, 37, 5)
	want := state(t, ga)
	n := subjectMsgs(t, a, "cg")
	if n >= 20 {
		t.Errorf("subject holds %d messages after 45 updates; want compaction below 20", n)
	}
	fresh := openStore(t, ns, "c", "")
	gc := load(t, fresh, "cg")
	if d := cmp.Diff(want, state(t, gc), ignoreProgress); d != "" {
		t.Errorf("rebuild after compaction differs (-want +got):\n%s", d)
	}
	if r := gc.Info().Replayed; r >= 20 || r != int(n) {
		t.Errorf("rebuild replayed %d messages; want the %d left", r, n)
	}
	// B's local projection missed purged history: the first message it
	// finds is a snapshot, which replaces its state.
	gb := load(t, b, "cg")
	if info := gb.Info(); info.FromSeq == 0 || info.Replayed != int(n) {
		t.Errorf("stale reload info = %+v; want a replay of the %d messages left", info, n)
	}
	if d := cmp.Diff(want, state(t, gb), ignoreProgress); d != "" {
		t.Errorf("stale reload differs (-want +got):\n%s", d)
	}
	// An explicit compaction leaves one snapshot message.
	if err := ga.Compact(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if n := subjectMsgs(t, a, "cg"); n != 1 {
		t.Errorf("after Compact the subject holds %d messages; want 1", n)
	}
	if d := cmp.Diff(want, state(t, load(t, openStore(t, ns, "d", ""), "cg")), ignoreProgress); d != "" {
		t.Errorf("rebuild from the snapshot differs (-want +got):\n%s", d)
	}
}

func TestStore_RacingWriters(t *testing.T) {
	for _, tc := range []struct {
		name string
		rows int
	}{
		{"OneMessage", 2},
		{"AtomicBatch", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := natstest.Start(t)
			small := func(c *Config) { c.MaxMessageBytes = 4096 }
			a, b := openStore(t, ns, "a", "", small), openStore(t, ns, "b", "", small)
			ga := load(t, a, "cg")
			publishN(t, ga, newHistory(4), 3, tc.rows)
			ga, gb := load(t, a, "cg"), load(t, b, "cg")

			// Both advance from the same sequence at once.
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i, g := range []*Group{ga, gb} {
				wg.Go(func() {
					v, evs := newHistory(uint64(10 + i)).next(tc.rows)
					errs[i] = g.Publish(testCtx(t), "w"+v, evs)
				})
			}
			wg.Wait()
			var won, lost int
			for _, err := range errs {
				switch {
				case err == nil:
					won++
				case errors.Is(err, ErrConflict):
					lost++
				default:
					t.Errorf("Publish = %v; want nil or ErrConflict", err)
				}
			}
			if won != 1 || lost != 1 {
				t.Fatalf("won %d, lost %d: %v", won, lost, errs)
			}
			loser := ga
			if errs[1] != nil {
				loser = gb
			}
			v, evs := newHistory(20).next(1)
			if err := loser.Publish(testCtx(t), v, evs); !errors.Is(err, ErrBroken) {
				t.Errorf("Publish after a conflict = %v; want ErrBroken", err)
			}
			// The loser's store reloads and sees the winner's update.
			other := map[*Group]*Store{ga: a, gb: b}[loser]
			if st := state(t, load(t, other, "cg")); !strings.HasPrefix(st.Instance.Version, "w") {
				t.Errorf("reloaded version %q; want the winner's", st.Instance.Version)
			}
		})
	}
}

func TestStore_Leases(t *testing.T) {
	ns := natstest.Start(t)
	ttl := func(c *Config) { c.LeaseTTL = 300 * time.Millisecond }
	var mu sync.Mutex
	var lostGroups []string
	onLost := func(c *Config) {
		c.LeaseLost = func(g string) { mu.Lock(); lostGroups = append(lostGroups, g); mu.Unlock() }
	}
	a := openStore(t, ns, "a", "", ttl, onLost)
	b := openStore(t, ns, "b", "", ttl)
	ctx := testCtx(t)
	group := "cg.1 *"

	t.Run("AcquireReleaseAcquire", func(t *testing.T) {
		la, err := a.Acquire(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.Acquire(ctx, group)
		var owned *OwnedError
		if !errors.As(err, &owned) || owned.Owner.ID != "a" || owned.Owner.Address != "ws://a:4848" {
			t.Fatalf("Acquire by b = %v; want OwnedError naming a", err)
		}
		if err := la.Renew(ctx); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if err := a.Release(ctx, la); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(la.Err(), ErrReleased) {
			t.Errorf("Err after Release = %v", la.Err())
		}
		lb, err := b.Acquire(ctx, group)
		if err != nil {
			t.Fatalf("Acquire after release: %v", err)
		}
		if err := b.Release(ctx, lb); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ExpiredUntakenPublishes", func(t *testing.T) {
		// A lease that expired while nobody took the group (NATS was
		// unreachable) is renewed by the next publish, not lost.
		const g = "cg-expired"
		la, err := a.Acquire(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		ga, err := a.Load(ctx, g, la)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(400 * time.Millisecond)
		if la.check() == nil {
			t.Fatal("lease not expired after its TTL")
		}
		v, evs := newHistory(5).next(1)
		if err := ga.Publish(ctx, v, evs); err != nil {
			t.Fatalf("Publish under an expired, untaken lease: %v", err)
		}
		var owned *OwnedError
		if _, err := b.Acquire(ctx, g); !errors.As(err, &owned) || owned.Owner.ID != "a" {
			t.Errorf("Acquire by b after the renewing publish = %v; want OwnedError naming a", err)
		}
		if err := a.Release(ctx, la); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("UnreachableKeepsLease", func(t *testing.T) {
		// Renewals that fail to reach NATS past the lease's expiry do not
		// end it; the next one that reaches it does renew it.
		const g = "cg-unreachable"
		lb, err := b.Acquire(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(400 * time.Millisecond)
		down, cancel := context.WithCancel(ctx)
		cancel()
		if err := lb.Renew(down); err == nil || errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Renew without NATS = %v; want a transient error", err)
		}
		if err := lb.Err(); err != nil {
			t.Fatalf("lease ended by an unreachable renewal: %v", err)
		}
		if err := lb.Renew(ctx); err != nil {
			t.Fatalf("Renew once reachable = %v", err)
		}
		if err := b.Release(ctx, lb); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("RenewAfterLostAnswer", func(t *testing.T) {
		// A renewal applied but unanswered (NATS went away meanwhile)
		// moved the record on; the next renewal finds it still its own.
		const g = "cg-lost-answer"
		lb, err := b.Acquire(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.kv.Put(ctx, lb.key, lb.record(time.Now())); err != nil {
			t.Fatal(err)
		}
		if err := lb.Renew(ctx); err != nil {
			t.Fatalf("Renew after an unanswered renewal = %v; want nil", err)
		}
		// A record of another grant is a takeover: lost.
		other := &Lease{s: b, groupID: g, key: lb.key, granted: lb.granted - 1}
		if _, err := b.kv.Put(ctx, lb.key, other.record(time.Now())); err != nil {
			t.Fatal(err)
		}
		if err := lb.Renew(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("Renew after another grant's record = %v; want ErrLeaseLost", err)
		}
	})

	t.Run("ExpireTakeoverLost", func(t *testing.T) {
		la, err := a.Acquire(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		ga, err := a.Load(ctx, group, la)
		if err != nil {
			t.Fatal(err)
		}
		v, evs := newHistory(5).next(1)
		if err := ga.Publish(ctx, v, evs); err != nil {
			t.Fatalf("Publish under the lease: %v", err)
		}
		// a stops renewing: b takes over once the lease expires.
		var lb *Lease
		polltest.UntilNil(t, 5*time.Second, "b to acquire the expired lease", func() error {
			var err error
			lb, err = b.Acquire(ctx, group)
			return err
		})
		if err := la.Renew(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("Renew after takeover = %v; want ErrLeaseLost", err)
		}
		select {
		case <-la.Done():
		default:
			t.Error("Done not closed after the lease was lost")
		}
		mu.Lock()
		if len(lostGroups) != 1 || lostGroups[0] != group {
			t.Errorf("LeaseLost calls = %q", lostGroups)
		}
		mu.Unlock()
		if err := ga.Publish(ctx, "x", nil); !errors.Is(err, ErrLeaseLost) {
			t.Errorf("Publish after losing the lease = %v; want ErrLeaseLost", err)
		}
		gb, err := b.Load(ctx, group, lb)
		if err != nil {
			t.Fatal(err)
		}
		if err := gb.Publish(ctx, "v9", nil); err != nil {
			t.Errorf("new owner's Publish = %v", err)
		}
		if err := b.Release(ctx, lb); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("RunRenewsAndReportsLoss", func(t *testing.T) {
		la, err := a.Acquire(ctx, "cg-run")
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- a.Run(rctx) }()
		defer func() { cancel(); <-done }()
		// Over several TTLs, a's renewals keep b out.
		end := time.Now().Add(4 * 300 * time.Millisecond)
		for time.Now().Before(end) {
			_, err := b.Acquire(ctx, "cg-run")
			var owned *OwnedError
			if !errors.As(err, &owned) {
				t.Fatalf("Acquire by b while a renews = %v; want OwnedError", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// Someone deletes a's record (a purge, an operator): a's next
		// renewal reports the loss.
		if err := b.kv.Delete(ctx, streams.OwnerKey("cg-run")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-la.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("lost lease not reported")
		}
		if !errors.Is(la.Err(), ErrLeaseLost) {
			t.Errorf("Err = %v; want ErrLeaseLost", la.Err())
		}
	})
}

// TestStore_HistoryReplaced checks a local projection whose history the
// stream no longer holds (the group was purged and written anew): Load
// notices the gap and rebuilds from the stream.
func TestStore_HistoryReplaced(t *testing.T) {
	ns := natstest.Start(t)
	a := openStore(t, ns, "a", "")
	b := openStore(t, ns, "b", "")
	ctx := testCtx(t)
	publishN(t, load(t, a, "cg"), newHistory(6), 5, 3)
	if gb := load(t, b, "cg"); gb.Info().Replayed != 5 {
		t.Fatalf("b replayed %d", gb.Info().Replayed)
	}
	if err := a.stream.Purge(ctx, jetstream.WithPurgeSubject(shard.CVRSubject("cg"))); err != nil {
		t.Fatal(err)
	}
	ga := load(t, a, "cg")
	if ga.Info().Rebuilt != true {
		t.Errorf("a's projection ahead of the purged stream: info %+v; want Rebuilt", ga.Info())
	}
	publishN(t, ga, newHistory(7), 2, 3)
	gb := load(t, b, "cg")
	if info := gb.Info(); !info.Rebuilt || info.Replayed != 2 {
		t.Errorf("b's reload info = %+v; want a rebuild from 2 messages", info)
	}
	if d := cmp.Diff(state(t, ga), state(t, gb), ignoreProgress); d != "" {
		t.Errorf("rebuilt state differs (-a +b):\n%s", d)
	}
}

// A peer's record is Signed only when it checks with the reader's peer
// secret; a record written by anyone else, or altered, is not.
func TestLease_SignedRecords(t *testing.T) {
	ns := natstest.Start(t)
	secret := func(s string) func(*Config) { return func(c *Config) { c.PeerSecret = []byte(s) } }
	a := openStore(t, ns, "a", "", secret("deployment"))
	b := openStore(t, ns, "b", "", secret("deployment"))
	other := openStore(t, ns, "c", "", secret("another deployment"))
	none := openStore(t, ns, "d", "")
	ctx := testCtx(t)
	ownedBy := func(s *Store, group string) *OwnedError {
		t.Helper()
		_, err := s.Acquire(ctx, group)
		var owned *OwnedError
		if !errors.As(err, &owned) {
			t.Fatalf("Acquire(%q) = %v; want OwnedError", group, err)
		}
		return owned
	}

	if _, err := a.Acquire(ctx, "g1"); err != nil {
		t.Fatal(err)
	}
	if o := ownedBy(b, "g1"); !o.Signed || o.Owner.Address != "ws://a:4848" {
		t.Errorf("b reads a's record as %+v; want it signed", o)
	}
	if o := ownedBy(other, "g1"); o.Signed {
		t.Errorf("a store with another secret trusts a's record: %+v", o)
	}
	if o := ownedBy(none, "g1"); o.Signed {
		t.Errorf("a store without a secret trusts a's record: %+v", o)
	}

	// Forgeries in the bucket: unsigned, a's record with its address
	// changed, and a's record copied to another group.
	e, err := a.kv.Get(ctx, streams.OwnerKey("g1"))
	if err != nil {
		t.Fatal(err)
	}
	var genuine streams.CVROwner
	if err := json.Unmarshal(e.Value(), &genuine); err != nil || genuine.Sig == "" {
		t.Fatalf("a's record %s: %v; want a signature", e.Value(), err)
	}
	moved := genuine
	moved.Address = "ws://attacker:80"
	unsigned := moved
	unsigned.Sig = ""
	for group, rec := range map[string]streams.CVROwner{"g2": unsigned, "g3": moved, "g4": genuine} {
		v, _ := json.Marshal(rec)
		if _, err := a.kv.Put(ctx, streams.OwnerKey(group), v); err != nil {
			t.Fatal(err)
		}
		if o := ownedBy(b, group); o.Signed {
			t.Errorf("%s: b trusts the forged record %+v", group, o.Owner)
		}
	}
}

// TestStore_ApplyPanicContained makes one group's background apply panic:
// the process goes on, the group reports itself broken, another group
// is unaffected, and a new Load rebuilds the group from the stream.
func TestStore_ApplyPanicContained(t *testing.T) {
	ns := natstest.Start(t)
	hook := func(group string) {
		if group == "victim" {
			panic("injected for the test")
		}
	}
	applyHook.Store(&hook)
	t.Cleanup(func() { applyHook.Store(nil) })
	s := openStore(t, ns, "a", filepath.Join(t.TempDir(), "a.db"))
	victim, other := load(t, s, "victim"), load(t, s, "other")
	h, h2 := newHistory(1), newHistory(2)
	publishN(t, victim, h, 1, 5) // durable: the panic is in the apply after it
	publishN(t, other, h2, 3, 5)
	if _, err := victim.State(testCtx(t)); !errors.Is(err, ErrBroken) {
		t.Fatalf("victim's State after a panicked apply = %v; want ErrBroken", err)
	}
	if got := state(t, other); got.Instance.Version != "v00003" {
		t.Errorf("other's state at %q; want v00003", got.Instance.Version)
	}
	applyHook.Store(nil)
	if got := state(t, load(t, s, "victim")); got.Instance.Version != "v00001" || len(got.Rows) == 0 {
		t.Errorf("victim reloaded at %q with %d rows; want v00001 from the stream", got.Instance.Version, len(got.Rows))
	}
}

// TestStore_BatchedApplies queues many groups' updates behind a blocked
// apply, so that they are applied in one transaction, one of them
// panicking: the others are all applied, each group's updates in order,
// and only the victim is broken until its next Load.
func TestStore_BatchedApplies(t *testing.T) {
	ns := natstest.Start(t)
	release := make(chan struct{})
	hook := func(group string) {
		switch group {
		case "gate":
			<-release
		case "victim":
			panic("injected for the test")
		}
	}
	applyHook.Store(&hook)
	t.Cleanup(func() { applyHook.Store(nil) })
	s := openStore(t, ns, "a", filepath.Join(t.TempDir(), "a.db"))
	// Load reads the projection, which the gate's apply is to block.
	gate := load(t, s, "gate")
	groups := []*Group{load(t, s, "victim")}
	for i := range 10 {
		groups = append(groups, load(t, s, fmt.Sprint("g", i)))
	}
	publishN(t, gate, newHistory(9), 1, 1) // its apply waits for release
	polltest.Until(t, 10*time.Second, "the gate's apply to start", func() bool { return s.applies.batches.Load() == 1 })
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() {
			h := newHistory(uint64(i))
			for range 3 {
				if v, evs := h.next(5); g.Publish(testCtx(t), v, evs) != nil {
					t.Errorf("%s: Publish(%s) failed", g.ID(), v)
				}
			}
		})
	}
	wg.Wait()
	close(release)
	for _, g := range groups[1:] {
		if got := state(t, g); got.Instance.Version != "v00003" || got.Progress.Seq != g.Seq() {
			t.Errorf("%s's state at %q, seq %d; want v00003 at seq %d", g.ID(), got.Instance.Version, got.Progress.Seq, g.Seq())
		}
	}
	if _, err := groups[0].State(testCtx(t)); !errors.Is(err, ErrBroken) {
		t.Fatalf("victim's State after a panicked apply = %v; want ErrBroken", err)
	}
	// The gate's transaction, then one for the 33 updates queued behind
	// it; then the retry of each on its own, since one failed.
	if n := s.applies.batches.Load(); n != 2 {
		t.Errorf("%d batches of applies; want 2", n)
	}
	applyHook.Store(nil)
	if got := state(t, load(t, s, "victim")); got.Instance.Version != "v00003" || len(got.Rows) == 0 {
		t.Errorf("victim reloaded at %q with %d rows; want v00003 from the stream", got.Instance.Version, len(got.Rows))
	}
}
