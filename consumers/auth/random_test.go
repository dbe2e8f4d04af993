package auth_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/auth"
)

// TestManager_Random runs random operations on a fake clock and checks the
// scheduling invariants after each one.
func TestManager_Random(t *testing.T) {
	intervals := []time.Duration{0, 50 * sec, 100 * sec, 300 * sec}
	for seed := range uint64(200) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0))
			h := newHarness(t, intervals[r.IntN(4)], intervals[r.IntN(4)])
			failed := map[auth.Selector]bool{}
			ws := 0
			pick := func() auth.Selector {
				cs := h.m.Conns()
				if len(cs) == 0 || r.IntN(10) == 0 {
					return auth.Selector{ClientID: fmt.Sprint("c", r.IntN(5)), WSID: "gone"}
				}
				return cs[r.IntN(len(cs))].Selector
			}
			errs := []error{nil, nil, nil, errUnauthorized, errUnavailable}
			for step := range 300 {
				s := pick()
				c, _ := h.m.Conn(s)
				var op string
				switch r.IntN(12) {
				case 0, 1:
					ws++
					s = auth.Selector{ClientID: fmt.Sprint("c", r.IntN(5)), WSID: fmt.Sprint("ws", ws)}
					user := []string{"u1", "u1", "u1", "u2"}[r.IntN(4)]
					h.m.Register(s, auth.UserOf(user), "t", "q", "m")
					op = "register " + s.WSID + " " + user
				case 2:
					h.m.InitConnection(s, "q", "m")
					op = "init"
				case 3:
					h.m.UpdateAuth(s, fmt.Sprint("t", step), r.IntN(2) == 0)
					op = "updateAuth"
				case 4, 5:
					v := auth.Validation{}
					if r.IntN(4) == 0 {
						v = auth.Validation{Server: true, UserID: auth.UserOf("u1")}
					}
					h.m.Validate(s, c.Revision-r.IntN(2), v)
					op = "validate"
				case 6:
					if _, ok := h.m.Fail(s, c.Revision-r.IntN(2)); ok {
						failed[s] = true
					}
					op = "fail"
				case 7:
					h.m.Close(s)
					op = "close"
				case 8:
					h.m.SetRetransformReady(r.IntN(3) != 0)
					op = "ready"
				case 9:
					h.m.Defer(auth.Kind(r.IntN(2)))
					op = "defer"
				case 10:
					h.eff.revalidate[s.ClientID] = errs[r.IntN(len(errs))]
					h.eff.retransform[s.ClientID] = errs[r.IntN(len(errs))]
					if r.IntN(8) == 0 {
						h.eff.serverUser[s.ClientID] = auth.UserOf("u2")
					} else {
						delete(h.eff.serverUser, s.ClientID)
					}
					if ok := c.Selector == s; ok && c.State == auth.Provisional {
						h.m.RetransformConn(t.Context(), h.eff, c)
					}
					op = "effects"
				case 11:
					h.clock.Advance(time.Duration(r.IntN(400)) * sec)
					op = "advance"
				}
				h.eff.mu.Lock()
				for _, f := range h.eff.failedSel {
					failed[f] = true
				}
				h.eff.mu.Unlock()
				checkInvariants(t, h, failed, fmt.Sprintf("step %d (%s)", step, op))
			}
		})
	}
}

func checkInvariants(t *testing.T, h *harness, failed map[auth.Selector]bool, at string) {
	t.Helper()
	now := h.clock.Now()
	p := h.m.Plan()
	pending := h.clock.Pending()
	wake, armed := h.m.NextWake()
	switch {
	case len(pending) > 1:
		t.Fatalf("%s: %d timers pending", at, len(pending))
	case p.Earliest.IsZero() && (armed || len(pending) != 0):
		t.Fatalf("%s: timer armed at %v with no deadline", at, wake)
	case !p.Earliest.IsZero() && (!armed || !wake.Equal(p.Earliest) || len(pending) != 1 || !pending[0].Equal(p.Earliest)):
		t.Fatalf("%s: timer %v (armed %v, pending %v); earliest deadline %v", at, wake, armed, pending, p.Earliest)
	case len(p.DueRevalidations) > 0 || p.DueRetransform:
		t.Fatalf("%s: work overdue at %v: %+v", at, now, p)
	}
	g := h.m.Group()
	bg, hasBG := h.m.Background()
	if g.HasBackground != hasBG {
		t.Fatalf("%s: group background %v resolves to nothing", at, g.Background)
	}
	if hasBG && (bg.State != auth.Validated || failed[bg.Selector]) {
		t.Fatalf("%s: background %+v is not a live validated connection", at, bg)
	}
	for _, c := range h.m.Conns() {
		if failed[c.Selector] {
			t.Fatalf("%s: failed connection %v still has a record", at, c.Selector)
		}
		if c.State == auth.Provisional && !c.RevalidateAt.IsZero() {
			t.Fatalf("%s: provisional %v has a revalidation deadline", at, c.Selector)
		}
	}
}

// TestManager_Concurrent drives one Manager from several goroutines on the
// real clock, with millisecond intervals so that maintenance runs
// throughout; run it under -race.
func TestManager_Concurrent(t *testing.T) {
	wake := make(chan struct{}, 1)
	m, err := auth.NewManager[string, string, string](auth.ManagerConfig{
		RevalidateInterval:  time.Millisecond,
		RetransformInterval: 2 * time.Millisecond,
		Logger:              quiet,
		Wake: func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	eff := &randomEffects{r: rand.New(rand.NewPCG(1, 2))}

	done := make(chan struct{})
	var maintainer sync.WaitGroup
	maintainer.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-wake:
				if err := m.Maintain(t.Context(), eff); err != nil {
					t.Errorf("Maintain: %v", err)
				}
			}
		}
	})

	// Run at least 2000 operations per worker, and on until maintenance has
	// done some work, since that depends on timing.
	deadline := time.Now().Add(10 * time.Second)
	var workers sync.WaitGroup
	for w := range 4 {
		workers.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < 2000 || (eff.count() < 30 && time.Now().Before(deadline)); i++ {
				// Workers share clients but rarely sockets, so most operations are live.
				s := auth.Selector{ClientID: fmt.Sprint("c", r.IntN(6)), WSID: fmt.Sprint("w", w%2, "-", r.IntN(2))}
				c, _ := m.Conn(s)
				switch r.IntN(9) {
				case 0:
					c = m.Register(s, auth.UserOf("u1"), "t", "q", "m")
					m.Validate(s, c.Revision, auth.Validation{})
				case 1:
					m.InitConnection(s, "q", "m")
				case 2:
					m.UpdateAuth(s, fmt.Sprint("t", i), r.IntN(2) == 0)
				case 3, 4:
					m.Validate(s, c.Revision, auth.Validation{})
				case 5:
					m.Fail(s, c.Revision)
				case 6:
					m.Close(s)
				case 7:
					m.SetRetransformReady(r.IntN(4) != 0)
				case 8:
					if err := m.Maintain(t.Context(), eff); err != nil {
						t.Errorf("Maintain: %v", err)
					}
				}
				m.Plan()
				m.Background()
			}
		})
	}
	workers.Wait()
	m.Stop()
	close(done)
	maintainer.Wait()

	if _, armed := m.NextWake(); armed {
		t.Error("timer armed after Stop")
	}
	if bg, ok := m.Background(); ok && bg.State != auth.Validated {
		t.Errorf("background %+v not validated", bg)
	}
	eff.mu.Lock()
	defer eff.mu.Unlock()
	if eff.calls < 30 {
		t.Errorf("maintenance made %d effect calls; want 30", eff.calls)
	}
}

type randomEffects struct {
	mu     sync.Mutex
	r      *rand.Rand
	calls  int
	failed map[auth.Selector]bool
}

func (e *randomEffects) result() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls++
	return []error{nil, nil, nil, nil, nil, nil, errUnauthorized, errUnavailable}[e.r.IntN(8)]
}

func (e *randomEffects) Revalidate(_ context.Context, c conn) (auth.Validation, error) {
	return auth.Validation{}, e.result()
}

func (e *randomEffects) Retransform(_ context.Context, c conn) (*auth.Validation, error) {
	return &auth.Validation{}, e.result()
}

func (e *randomEffects) FailConnection(c conn, _ error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed == nil {
		e.failed = map[auth.Selector]bool{}
	}
	e.failed[c.Selector] = true
}

func (e *randomEffects) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}
