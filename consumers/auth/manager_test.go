package auth_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/jetsync/jetsync/consumers/auth"
	"github.com/jetsync/jetsync/consumers/auth/authtest"
)

const (
	sec  = time.Second
	none = time.Duration(-1)
)

func TestManager_EarliestDeadlineWins(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		revalidate, retransform time.Duration
		ready                   bool
		want                    time.Duration
	}{
		{"RevalidateOnly", 300 * sec, 0, true, 300 * sec},
		{"RetransformSooner", 300 * sec, 100 * sec, true, 100 * sec},
		{"RevalidateSooner", 60 * sec, 100 * sec, true, 60 * sec},
		{"RetransformNotReady", 300 * sec, 100 * sec, false, 300 * sec},
		{"RetransformOnly", 0, 100 * sec, true, 100 * sec},
		{"BothDisabled", 0, 0, true, none},
		{"Defaults", auth.DefaultRevalidateInterval, auth.DefaultRetransformInterval, true, 300 * sec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.revalidate, tc.retransform)
			h.connect("a", "u1")
			h.m.SetRetransformReady(tc.ready)
			if got := h.wake(); got != tc.want {
				t.Errorf("wake = %v; want %v", got, tc.want)
			}
		})
	}

	t.Run("AcrossConnections", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		h.clock.Advance(10 * sec)
		h.connect("a", "u1") // due at 310 s
		h.clock.Advance(10 * sec)
		h.connect("b", "u1") // due at 320 s
		if got := h.wake(); got != 310*sec {
			t.Fatalf("wake = %v; want 310s", got)
		}
		// Closing the earliest moves the timer to the next deadline.
		h.m.Close(sel("a"))
		if got := h.wake(); got != 320*sec {
			t.Fatalf("wake after Close(a) = %v; want 320s", got)
		}
		// Firing revalidates b alone and re-arms one interval later.
		h.clock.Advance(300 * sec)
		if diff := cmp.Diff([]string{"revalidate b@1"}, h.eff.takeCalls()); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
		if got := h.wake(); got != 620*sec {
			t.Errorf("wake after revalidation = %v; want 620s", got)
		}
	})
}

func TestManager_StaleRevision(t *testing.T) {
	t.Run("Validate", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		s := sel("a")
		c0 := h.m.Register(s, auth.UserOf("u1"), "tok", "q", "m")
		c1, _ := h.m.InitConnection(s, "q", "m")
		if _, ok, err := h.m.Validate(s, c0.Revision, auth.Validation{}); ok || err != nil {
			t.Fatalf("Validate(stale rev %d) = %v, %v; want ignored", c0.Revision, ok, err)
		}
		if c, _ := h.m.Conn(s); c.State != auth.Provisional {
			t.Fatalf("state after stale Validate = %v; want provisional", c.State)
		}
		if _, ok, err := h.m.Validate(s, c1.Revision, auth.Validation{}); !ok || err != nil {
			t.Fatalf("Validate(rev %d) = %v, %v; want applied", c1.Revision, ok, err)
		}
		// Another socket of the same client is a different record.
		if _, ok, _ := h.m.Validate(auth.Selector{ClientID: "a", WSID: "old"}, c1.Revision, auth.Validation{}); ok {
			t.Fatal("Validate with another wsID was applied")
		}
	})

	t.Run("RevalidationOverlapsAuthChange", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		h.connect("a", "u1")
		// The token changes while the revalidation of the old one is in
		// flight; its failure must not fail the new credentials.
		h.eff.revalidate["a"] = errUnauthorized
		h.eff.during = func(c conn) {
			if _, err := h.m.UpdateAuth(c.Selector, "new-token", true); err != nil {
				t.Errorf("UpdateAuth: %v", err)
			}
		}
		h.clock.Advance(300 * sec)
		if got := h.eff.failures(); len(got) != 0 {
			t.Fatalf("failed %v; want none", got)
		}
		c, ok := h.m.Conn(sel("a"))
		if !ok || c.State != auth.Provisional || c.Revision != 2 || c.Auth != "new-token" {
			t.Fatalf("Conn(a) = %+v, %v; want provisional rev 2 with the new token", c, ok)
		}
		if got := h.wake(); got != none {
			t.Errorf("wake = %v; want none (nothing validated)", got)
		}
	})

	t.Run("RevalidationSuccessAfterAuthChange", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		h.connect("a", "u1")
		h.eff.during = func(c conn) { h.m.UpdateAuth(c.Selector, "new-token", true) }
		h.clock.Advance(300 * sec)
		if c, _ := h.m.Conn(sel("a")); c.State != auth.Provisional {
			t.Fatalf("state = %v; the old revision's validation was applied", c.State)
		}
	})

	t.Run("Fail", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		c := h.connect("a", "u1")
		h.m.InitConnection(c.Selector, "q2", "m2")
		if _, ok := h.m.Fail(c.Selector, c.Revision); ok {
			t.Fatal("Fail(stale revision) removed the record")
		}
		if _, ok := h.m.Conn(c.Selector); !ok {
			t.Fatal("record gone")
		}
	})
}

func TestManager_DeferPushesDeadlines(t *testing.T) {
	// Revalidation every 100 s, retransform every 150 s, both armed at 0.
	for _, tc := range []struct {
		name      string
		failAt    time.Duration // when the failing round runs
		setup     func(e *effects)
		wantCalls []string // in the failing round
		wantWake  time.Duration
	}{
		{
			// Its transient failure defers everything by the revalidate
			// interval: the retransform due at 150 s waits until 200 s.
			name:      "Revalidation",
			failAt:    100 * sec,
			setup:     func(e *effects) { e.revalidate["a"] = errUnavailable },
			wantCalls: []string{"revalidate a@1"},
			wantWake:  200 * sec,
		},
		{
			// Revalidation passed at 100 s (next due 200 s); the retransform's
			// transient failure at 150 s defers everything by 150 s.
			name:      "Retransform",
			failAt:    150 * sec,
			setup:     func(e *effects) { e.retransform["a"] = errUnavailable },
			wantCalls: []string{"retransform a@1"},
			wantWake:  300 * sec,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 100*sec, 150*sec)
			h.connect("a", "u1")
			h.m.SetRetransformReady(true)
			h.clock.Advance(tc.failAt - time.Nanosecond)
			h.eff.takeCalls()
			tc.setup(h.eff)
			h.clock.Advance(time.Nanosecond)
			if diff := cmp.Diff(tc.wantCalls, h.eff.takeCalls()); diff != "" {
				t.Errorf("calls at %v (-want +got):\n%s", tc.failAt, diff)
			}
			if got := h.m.Group().NotBefore.Sub(t0); got != tc.wantWake {
				t.Errorf("NotBefore = %v; want %v", got, tc.wantWake)
			}
			if got := h.wake(); got != tc.wantWake {
				t.Errorf("wake = %v; want %v", got, tc.wantWake)
			}
			if p := h.m.Plan(); len(p.DueRevalidations) != 0 || p.DueRetransform {
				t.Errorf("Plan during deferral = %+v; want nothing due", p)
			}
			if got := h.eff.failures(); len(got) != 0 {
				t.Errorf("failed %v; a transient failure fails nobody", got)
			}

			// Once the deferral ends, everything overdue runs in one round.
			h.eff.revalidate["a"], h.eff.retransform["a"] = nil, nil
			h.clock.Advance(tc.wantWake - h.clock.Now().Sub(t0))
			if diff := cmp.Diff([]string{"revalidate a@1", "retransform a@1"}, h.eff.takeCalls()); diff != "" {
				t.Errorf("calls after the deferral (-want +got):\n%s", diff)
			}
			if got, want := h.wake(), tc.wantWake+100*sec; got != want {
				t.Errorf("wake after the deferral = %v; want %v", got, want)
			}
		})
	}

	t.Run("NeverShortens", func(t *testing.T) {
		h := newHarness(t, 100*sec, 10*sec)
		h.connect("a", "u1")
		h.m.Defer(auth.Revalidation)
		h.m.Defer(auth.Retransformation)
		if got := h.m.Group().NotBefore.Sub(t0); got != 100*sec {
			t.Errorf("NotBefore = %v; want 100s (the later of the two)", got)
		}
	})

	t.Run("DisabledKindIsNoOp", func(t *testing.T) {
		h := newHarness(t, 100*sec, 0)
		h.m.Defer(auth.Retransformation)
		if nb := h.m.Group().NotBefore; !nb.IsZero() {
			t.Errorf("NotBefore = %v; want none", nb)
		}
	})
}

func TestManager_BackgroundReplacement(t *testing.T) {
	// Registered in the order a, b, c; validated in the order a, c, b.
	setup := func(t *testing.T) *harness {
		h := newHarness(t, 300*sec, 300*sec)
		for _, c := range []string{"a", "b", "c"} {
			h.m.Register(sel(c), auth.UserOf("u1"), "tok", "q", "m")
		}
		for _, c := range []string{"a", "c", "b"} {
			if _, ok, err := h.m.Validate(sel(c), 0, auth.Validation{}); !ok || err != nil {
				t.Fatalf("Validate(%s) = %v, %v", c, ok, err)
			}
		}
		return h
	}
	for _, tc := range []struct {
		name string
		ops  func(h *harness)
		want string // background after ops ("" none)
	}{
		{"FirstValidatedIsSticky", func(h *harness) {}, "a"},
		// The newest registration wins, not the newest validation (b).
		{"FailedReplacedByNewestRegistered", func(h *harness) { h.m.Fail(sel("a"), 0) }, "c"},
		{"ClosedReplaced", func(h *harness) { h.m.Close(sel("a")) }, "c"},
		{"DemotedByAuthChange", func(h *harness) { h.m.UpdateAuth(sel("a"), "new", true) }, "c"},
		{"DemotedByInitConnection", func(h *harness) { h.m.InitConnection(sel("a"), "q", "m") }, "c"},
		{"UnchangedAuthKeepsIt", func(h *harness) { h.m.UpdateAuth(sel("a"), "tok", false) }, "a"},
		{"ReplacementIsStickyToo", func(h *harness) {
			h.m.Fail(sel("a"), 0)
			h.m.Register(sel("d"), auth.UserOf("u1"), "tok", "q", "m")
			h.m.Validate(sel("d"), 0, auth.Validation{})
		}, "c"},
		{"ProvisionalSkipped", func(h *harness) {
			h.m.UpdateAuth(sel("c"), "new", true)
			h.m.Close(sel("a"))
		}, "b"},
		{"SecondChoice", func(h *harness) { h.m.Fail(sel("a"), 0); h.m.Fail(sel("c"), 0) }, "b"},
		{"ReRegisteredClientIsNewest", func(h *harness) {
			h.m.Register(auth.Selector{ClientID: "b", WSID: "ws-b2"}, auth.UserOf("u1"), "tok", "q", "m")
			h.m.Validate(auth.Selector{ClientID: "b", WSID: "ws-b2"}, 0, auth.Validation{})
			h.m.Close(sel("a"))
		}, "b"},
		{"NoneLeft", func(h *harness) {
			for _, c := range []string{"a", "b", "c"} {
				h.m.Close(sel(c))
			}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := setup(t)
			tc.ops(h)
			if got := h.background(); got != tc.want {
				t.Errorf("background = %q; want %q", got, tc.want)
			}
			_, err := h.m.MustBackground()
			if tc.want == "" && !errors.Is(err, auth.ErrNoBackground) {
				t.Errorf("MustBackground() error = %v; want ErrNoBackground", err)
			}
		})
	}
}

func TestManager_RetransformRetriesWithReplacement(t *testing.T) {
	for _, tc := range []struct {
		name       string
		errs       map[string]error
		wantCalls  []string
		wantFailed []string
		wantBG     string
		wantWake   time.Duration
	}{
		{
			name:       "ReplacementSucceeds",
			errs:       map[string]error{"a": errUnauthorized},
			wantCalls:  []string{"retransform a@0", "retransform c@0"},
			wantFailed: []string{"a"},
			wantBG:     "c",
			wantWake:   200 * sec, // the next retransform interval
		},
		{
			name:       "ReplacementTransient",
			errs:       map[string]error{"a": errUnauthorized, "c": errUnavailable},
			wantCalls:  []string{"retransform a@0", "retransform c@0"},
			wantFailed: []string{"a"},
			wantBG:     "c",
			wantWake:   200 * sec, // deferred by the retransform interval
		},
		{
			name:       "AllFail",
			errs:       map[string]error{"a": errUnauthorized, "b": errUnauthorized, "c": errUnauthorized},
			wantCalls:  []string{"retransform a@0", "retransform c@0", "retransform b@0"},
			wantFailed: []string{"a", "c", "b"},
			wantWake:   none,
		},
		{
			// A pinned-user mismatch in the transform response is an auth failure too.
			name:       "ServerNamesOtherUser",
			errs:       map[string]error{},
			wantCalls:  []string{"retransform a@0", "retransform c@0"},
			wantFailed: []string{"a"},
			wantBG:     "c",
			wantWake:   200 * sec,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0, 100*sec)
			for _, c := range []string{"a", "b", "c"} {
				h.m.Register(sel(c), auth.UserOf("u1"), "tok", "q", "m")
				h.m.Validate(sel(c), 0, auth.Validation{})
			}
			h.m.SetRetransformReady(true)
			h.eff.retransform = tc.errs
			if tc.name == "ServerNamesOtherUser" {
				h.eff.serverUser["a"] = auth.UserOf("u2")
			}
			h.clock.Advance(100 * sec)
			// The replacement is tried at once, in the same round.
			if h.wakes != 1 {
				t.Errorf("%d maintenance rounds; want 1", h.wakes)
			}
			if diff := cmp.Diff(tc.wantCalls, h.eff.takeCalls()); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantFailed, h.eff.failures()); diff != "" {
				t.Errorf("failed (-want +got):\n%s", diff)
			}
			if got := h.background(); got != tc.wantBG {
				t.Errorf("background = %q; want %q", got, tc.wantBG)
			}
			if got := h.wake(); got != tc.wantWake {
				t.Errorf("wake = %v; want %v", got, tc.wantWake)
			}
		})
	}
}

func TestManager_NoTimerWithoutValidatedConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(h *harness)
	}{
		{"Closed", func(h *harness) { h.m.Close(sel("a")); h.m.Close(sel("b")) }},
		{"Failed", func(h *harness) { h.m.Fail(sel("a"), 1); h.m.Fail(sel("b"), 1) }},
		{"Demoted", func(h *harness) { h.m.UpdateAuth(sel("a"), "x", true); h.m.InitConnection(sel("b"), "q", "m") }},
		{"RevalidationRejectsAll", func(h *harness) {
			h.eff.revalidate["a"], h.eff.revalidate["b"] = errUnauthorized, errUnauthorized
			h.clock.Advance(300 * sec)
		}},
		{"RevalidationRejectsOneRetransformTheOther", func(h *harness) {
			h.eff.revalidate["a"], h.eff.retransform["b"] = errUnauthorized, errUnauthorized
			h.clock.Advance(300 * sec)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 300*sec, 300*sec)
			h.connect("a", "u1")
			h.connect("b", "u1")
			h.m.SetRetransformReady(true)
			if got := h.wake(); got != 300*sec {
				t.Fatalf("wake = %v; want 300s", got)
			}
			tc.end(h)
			if got := h.wake(); got != none {
				t.Errorf("wake = %v; want no timer", got)
			}
			if g := h.m.Group(); g.HasBackground || !g.RetransformAt.IsZero() {
				t.Errorf("Group() = %+v; want no background, no retransform deadline", g)
			}
		})
	}
}

func TestManager_PinnedUser(t *testing.T) {
	for _, tc := range []struct {
		name    string
		first   auth.User
		second  auth.User
		v       auth.Validation
		wantErr error
	}{
		{"SameUser", auth.UserOf("u1"), auth.UserOf("u1"), auth.Validation{}, nil},
		{"OtherUser", auth.UserOf("u1"), auth.UserOf("u2"), auth.Validation{}, auth.ErrPinnedUser},
		{"LoggedOutThenUser", auth.User{}, auth.UserOf("u1"), auth.Validation{}, auth.ErrPinnedUser},
		{"EmptyIsNotNull", auth.UserOf(""), auth.User{}, auth.Validation{}, auth.ErrPinnedUser},
		{"ServerAgrees", auth.UserOf("u1"), auth.UserOf("u1"), auth.Validation{Server: true, UserID: auth.UserOf("u1")}, nil},
		{"ServerDisagrees", auth.UserOf("u1"), auth.UserOf("u1"), auth.Validation{Server: true, UserID: auth.UserOf("u3")}, auth.ErrServerUserMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 300*sec, 0)
			h.m.Register(sel("a"), tc.first, "t", "q", "m")
			h.m.Validate(sel("a"), 0, auth.Validation{})
			h.m.Register(sel("b"), tc.second, "t", "q", "m")
			_, ok, err := h.m.Validate(sel("b"), 0, tc.v)
			if !errors.Is(err, tc.wantErr) || ok != (tc.wantErr == nil) {
				t.Fatalf("Validate(b) = %v, %v; want %v", ok, err, tc.wantErr)
			}
			if err != nil {
				if !auth.IsAuthError(err) {
					t.Errorf("IsAuthError(%v) = false", err)
				}
				if c, _ := h.m.Conn(sel("b")); c.State != auth.Provisional {
					t.Errorf("refused connection is %v", c.State)
				}
			}
			if g := h.m.Group(); !g.Pinned || g.PinnedUser != tc.first {
				t.Errorf("pinned %v %v; want %v", g.Pinned, g.PinnedUser, tc.first)
			}
		})
	}

	t.Run("SurvivesEmptyGroup", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		h.connect("a", "u1")
		h.m.Close(sel("a"))
		h.m.Register(sel("b"), auth.UserOf("u2"), "t", "q", "m")
		if _, _, err := h.m.Validate(sel("b"), 0, auth.Validation{}); !errors.Is(err, auth.ErrPinnedUser) {
			t.Errorf("Validate(b) error = %v; want ErrPinnedUser", err)
		}
	})

	t.Run("RevalidationForOtherUserFails", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		h.connect("a", "u1")
		h.connect("b", "u1")
		h.eff.serverUser["b"] = auth.UserOf("u2")
		h.clock.Advance(300 * sec)
		if diff := cmp.Diff([]string{"b"}, h.eff.failures()); diff != "" {
			t.Errorf("failed (-want +got):\n%s", diff)
		}
	})
}

func TestManager_UpdateAuth(t *testing.T) {
	t.Run("Changed", func(t *testing.T) {
		h := newHarness(t, 300*sec, 300*sec)
		before := h.connect("a", "u1")
		h.m.SetRetransformReady(true)
		c, err := h.m.UpdateAuth(sel("a"), "token-2", true)
		if err != nil {
			t.Fatal(err)
		}
		if c.Revision != before.Revision+1 || c.State != auth.Provisional || !c.RevalidateAt.IsZero() || c.Auth != "token-2" {
			t.Fatalf("UpdateAuth = %+v; want revision %d, provisional, no revalidation", c, before.Revision+1)
		}
		if got := h.wake(); got != none {
			t.Errorf("wake = %v; want none while provisional", got)
		}
		h.clock.Advance(10 * sec)
		if !h.m.RetransformConn(t.Context(), h.eff, c) {
			t.Fatalf("RetransformConn failed: %v", h.eff.failures())
		}
		// Pipelines are synced: the retransform alone validates.
		if diff := cmp.Diff([]string{"retransform a@2"}, h.eff.takeCalls()); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
		c, _ = h.m.Conn(sel("a"))
		if c.State != auth.Validated || c.RevalidateAt.Sub(t0) != 310*sec || h.background() != "a" {
			t.Errorf("after RetransformConn: %+v, background %q", c, h.background())
		}
	})

	t.Run("Unchanged", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		before := h.connect("a", "u1")
		c, _ := h.m.UpdateAuth(sel("a"), "same-token", false)
		if c.Revision != before.Revision || c.State != auth.Validated || !c.RevalidateAt.Equal(before.RevalidateAt) {
			t.Errorf("UpdateAuth(unchanged) = %+v; want %+v", c, before)
		}
	})

	t.Run("NotSyncedValidatesFirst", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		h.connect("a", "u1")
		c, _ := h.m.UpdateAuth(sel("a"), "token-2", true)
		h.eff.cached = true
		h.m.RetransformConn(t.Context(), h.eff, c)
		if diff := cmp.Diff([]string{"revalidate a@2", "retransform a@2"}, h.eff.takeCalls()); diff != "" {
			t.Errorf("calls (-want +got):\n%s", diff)
		}
		if c, _ := h.m.Conn(sel("a")); c.State != auth.Validated {
			t.Errorf("state = %v; want validated", c.State)
		}
	})

	for _, tc := range []struct {
		name   string
		ready  bool
		revErr error
		trErr  error
		wantOK bool
	}{
		{"RetransformAuthFails", true, nil, errUnauthorized, false},
		{"RetransformTransientFails", true, nil, errUnavailable, false},
		{"ValidationAuthFails", false, errUnauthorized, nil, false},
		{"ValidationTransientFails", false, errUnavailable, nil, false},
		{"CachedKeepsProvisional", true, nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 300*sec, 0)
			h.connect("a", "u1")
			h.m.SetRetransformReady(tc.ready)
			c, _ := h.m.UpdateAuth(sel("a"), "token-2", true)
			h.eff.revalidate["a"], h.eff.retransform["a"] = tc.revErr, tc.trErr
			h.eff.cached = tc.name == "CachedKeepsProvisional"
			if ok := h.m.RetransformConn(t.Context(), h.eff, c); ok != tc.wantOK {
				t.Fatalf("RetransformConn = %v; want %v", ok, tc.wantOK)
			}
			c, alive := h.m.Conn(sel("a"))
			if alive && c.State != auth.Provisional {
				t.Errorf("state = %v; a cached retransform validates nothing", c.State)
			}
			if alive != tc.wantOK || (len(h.eff.failures()) == 0) != tc.wantOK {
				t.Errorf("alive %v, failed %v; want alive %v", alive, h.eff.failures(), tc.wantOK)
			}
		})
	}

	t.Run("Missing", func(t *testing.T) {
		h := newHarness(t, 300*sec, 0)
		if _, err := h.m.UpdateAuth(sel("x"), "t", true); !errors.Is(err, auth.ErrNoConnection) {
			t.Errorf("UpdateAuth(missing) error = %v; want ErrNoConnection", err)
		}
	})
}

func TestManager_TransientFailuresFailNobody(t *testing.T) {
	h := newHarness(t, 100*sec, 100*sec)
	for _, c := range []string{"a", "b", "c"} {
		h.connect(c, "u1")
	}
	h.m.SetRetransformReady(true)
	for _, c := range []string{"a", "b", "c"} {
		h.eff.revalidate[c] = errUnavailable
		h.eff.retransform[c] = errUnavailable
	}
	for range 5 {
		h.clock.Advance(100 * sec)
	}
	if got := h.eff.failures(); len(got) != 0 {
		t.Errorf("failed %v; want none", got)
	}
	if got := len(h.m.Conns()); got != 3 {
		t.Errorf("%d connections left; want 3", got)
	}
	// Only one attempt per interval: the first round's failure deferred the rest.
	calls := h.eff.takeCalls()
	if n := len(calls); n == 0 || n > 5 {
		t.Errorf("calls %v; want one per round", calls)
	}
	// The group recovers when the API server does.
	for _, c := range []string{"a", "b", "c"} {
		h.eff.revalidate[c], h.eff.retransform[c] = nil, nil
	}
	h.clock.Advance(100 * sec)
	calls = h.eff.takeCalls()
	if !slices.Contains(calls, "retransform a@1") || !slices.Contains(calls, "revalidate c@1") {
		t.Errorf("calls after recovery %v; want every revalidation and the retransform", calls)
	}
}

func TestManager_Stop(t *testing.T) {
	h := newHarness(t, 300*sec, 0)
	h.connect("a", "u1")
	h.m.Stop()
	h.connect("b", "u1")
	if got := h.wake(); got != none {
		t.Errorf("wake after Stop = %v; want none", got)
	}
	if n := h.clock.Advance(time.Hour); n != 0 || h.wakes != 0 {
		t.Errorf("timers fired after Stop: %d, wakes %d", n, h.wakes)
	}
	if err := h.m.Maintain(t.Context(), h.eff); err != nil || len(h.eff.takeCalls()) != 0 {
		t.Errorf("Maintain after Stop ran work")
	}
}

func TestManager_FatalEffectError(t *testing.T) {
	// No Wake: the test runs Maintain itself.
	eff := newEffects()
	clock := authtest.NewClock(t0)
	m, err := auth.NewManager[string, string, string](auth.ManagerConfig{RevalidateInterval: 300 * sec, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	m.Register(sel("a"), auth.UserOf("u1"), "t", "q", "m")
	m.Validate(sel("a"), 0, auth.Validation{})
	boom := errors.New("boom")
	eff.revalidate["a"] = boom
	clock.Advance(300 * sec)
	if err := m.Maintain(t.Context(), eff); !errors.Is(err, boom) {
		t.Errorf("Maintain error = %v; want %v", err, boom)
	}
	if got := eff.failures(); len(got) != 0 {
		t.Errorf("failed %v; a fatal error is the group's, not a connection's", got)
	}
}
