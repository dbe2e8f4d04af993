package cvrstore

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
)

// queueHeld makes the next publishes of s queue as if a batch were in
// flight, and returns a function that waits until n are queued and then
// lets them go out together, as the leader of a batch would.
func queueHeld(t *testing.T, s *Store) (release func(n int)) {
	return holdQueue(t, &s.commits)
}

// holdQueue is queueHeld for any of a store's committers.
func holdQueue(t *testing.T, q *committer) (release func(n int)) {
	q.mu.Lock()
	q.busy = true
	q.mu.Unlock()
	return func(n int) {
		polltest.Until(t, 30*time.Second, "publishes queued", func() bool {
			q.mu.Lock()
			defer q.mu.Unlock()
			return len(q.queue) == n
		})
		q.mu.Lock()
		q.queue[0].lead = true
		close(q.queue[0].wake)
		q.mu.Unlock()
	}
}

func TestStore_GroupCommit(t *testing.T) {
	t.Run("SharedBatchesKeepEachGroupExact", func(t *testing.T) {
		ns := natstest.Start(t, natstest.SyncAlways())
		small := func(c *Config) { c.MaxMessageBytes = 4096 }
		a := openStore(t, ns, "a", "", small)
		const groups, updates = 24, 6
		gs := make([]*Group, groups)
		hs := make([]*history, groups)
		for i := range gs {
			gs[i], hs[i] = load(t, a, fmt.Sprintf("cg%02d", i)), newHistory(uint64(100+i))
		}
		release := queueHeld(t, a)
		var wg sync.WaitGroup
		errs := make([]error, groups)
		for i, g := range gs {
			wg.Go(func() {
				for range updates {
					// Every third group's updates span several messages.
					rows := 2
					if i%3 == 0 {
						rows = 120
					}
					v, evs := hs[i].next(rows)
					if err := g.Publish(testCtx(t), v, evs); err != nil {
						errs[i] = err
						return
					}
				}
			})
		}
		release(groups)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		trips := a.commits.trips.Load()
		if trips >= groups*updates/2 {
			t.Errorf("%d publishes took %d round trips; want them batched", groups*updates, trips)
		}
		fresh := openStore(t, ns, "b", "")
		for i, g := range gs {
			last, err := a.lastSeq(testCtx(t), g.subject)
			if err != nil {
				t.Fatal(err)
			}
			if g.Seq() != last {
				t.Errorf("group %d at seq %d; the stream's last for it is %d", i, g.Seq(), last)
			}
			st := state(t, g)
			if want := fmt.Sprintf("v%05d", updates); st.Instance.Version != want {
				t.Errorf("group %d at version %q; want %q", i, st.Instance.Version, want)
			}
			if d := cmp.Diff(st, state(t, load(t, fresh, g.id)), ignoreProgress); d != "" {
				t.Errorf("group %d: rebuilt from the stream differs (-local +rebuilt):\n%s", i, d)
			}
			// Its expected last sequence is right: a publish alone goes in.
			v, evs := hs[i].next(1)
			if err := g.Publish(testCtx(t), v, evs); err != nil {
				t.Errorf("group %d: publish after the batches: %v", i, err)
			}
		}
	})

	// An atomic batch costs a file-backed stream a store of its own, some
	// ms more than a few fsyncs: up to maxPipelined one-message updates
	// go as publishes of their own, in one round trip; more, or one
	// update of several messages, as a batch.
	t.Run("FewGoWithoutAnAtomicBatch", func(t *testing.T) {
		ns := natstest.Start(t, natstest.SyncAlways())
		a := openStore(t, ns, "a", "", func(c *Config) { c.MaxMessageBytes = 4096 })
		gs := make([]*Group, maxPipelined+1)
		hs := make([]*history, len(gs))
		for i := range gs {
			gs[i], hs[i] = load(t, a, fmt.Sprintf("cg%02d", i)), newHistory(uint64(i))
		}
		for _, tc := range []struct {
			name        string
			groups      int
			rows        func(i int) int
			wantBatches int64
		}{
			{"pipelined", maxPipelined, func(int) int { return 2 }, 0},
			{"too many", maxPipelined + 1, func(int) int { return 2 }, 1},
			{"one of several messages", 3, func(i int) int { return 1 + 119*(i%3/2) }, 1},
		} {
			trips0, batches0 := a.commits.trips.Load(), a.commits.batches.Load()
			release := queueHeld(t, a)
			var wg sync.WaitGroup
			errs := make([]error, tc.groups)
			for i, g := range gs[:tc.groups] {
				v, evs := hs[i].next(tc.rows(i))
				wg.Go(func() { errs[i] = g.Publish(testCtx(t), v, evs) })
			}
			release(tc.groups)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if trips, batches := a.commits.trips.Load()-trips0, a.commits.batches.Load()-batches0; trips != 1 || batches != tc.wantBatches {
				t.Errorf("%s: %d updates took %d round trips, %d of them atomic batches; want 1 and %d", tc.name, tc.groups, trips, batches, tc.wantBatches)
			}
		}
		fresh := openStore(t, ns, "b", "")
		for i, g := range gs {
			if last, _ := a.lastSeq(testCtx(t), g.subject); g.Seq() != last {
				t.Errorf("group %d at seq %d; the stream's last for it is %d", i, g.Seq(), last)
			}
			if d := cmp.Diff(state(t, g), state(t, load(t, fresh, g.id)), ignoreProgress); d != "" {
				t.Errorf("group %d: rebuilt from the stream differs (-local +rebuilt):\n%s", i, d)
			}
		}
	})

	// Few groups go as pipelined publishes, many as one atomic batch: a
	// stale group fails alone either way.
	for _, groups := range []int{maxPipelined, 2 * maxPipelined} {
		t.Run(fmt.Sprint("ConflictFailsOnlyItsGroup/groups=", groups), func(t *testing.T) {
			conflictFailsOnlyItsGroup(t, groups)
		})
	}
}

func conflictFailsOnlyItsGroup(t *testing.T, groups int) {
	ns := natstest.Start(t, natstest.SyncAlways())
	a, b := openStore(t, ns, "a", ""), openStore(t, ns, "b", "")
	gs := make([]*Group, groups)
	for i := range gs {
		gs[i] = load(t, a, fmt.Sprintf("cg%02d", i))
		publishN(t, gs[i], newHistory(uint64(i)), 1, 2)
	}
	// Another writer advances group 4 behind a's back.
	publishN(t, load(t, b, "cg04"), newHistory(99), 1, 2)

	release := queueHeld(t, a)
	var wg sync.WaitGroup
	errs := make([]error, groups)
	for i, g := range gs {
		wg.Go(func() {
			v, evs := newHistory(uint64(50 + i)).next(3)
			errs[i] = g.Publish(testCtx(t), "w"+v, evs)
		})
	}
	release(groups)
	wg.Wait()
	for i, err := range errs {
		switch {
		case i == 4 && !errors.Is(err, ErrConflict):
			t.Errorf("group 4's publish = %v; want ErrConflict", err)
		case i != 4 && err != nil:
			t.Errorf("group %d's publish = %v; want it stored despite group 4", i, err)
		}
	}
	for i, g := range gs {
		if i == 4 {
			continue
		}
		if st := state(t, g); st.Instance.Version != "wv00001" {
			t.Errorf("group %d at %q; want wv00001", i, st.Instance.Version)
		}
		if last, _ := a.lastSeq(testCtx(t), g.subject); g.Seq() != last {
			t.Errorf("group %d at seq %d; the stream's last for it is %d", i, g.Seq(), last)
		}
	}
}
