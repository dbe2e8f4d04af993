package auth_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/auth"
	"github.com/jetsync/jetsync/consumers/auth/authtest"
)

// The tests use strings for the caller's auth, query and mutate contexts.
type (
	manager = auth.Manager[string, string, string]
	conn    = auth.Conn[string, string, string]
)

var quiet = slog.New(slog.DiscardHandler)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

var (
	errUnauthorized = auth.AuthError(errors.New("TransformFailed: http 401"))
	errUnavailable  = auth.TransientError(errors.New("TransformFailed: http 503"))
)

// effects is a scripted auth.Effects: results come from per-client maps
// (nil error and a client-fallback validation by default) and every call is
// recorded.
type effects struct {
	mu          sync.Mutex
	revalidate  map[string]error
	retransform map[string]error
	serverUser  map[string]auth.User // a server-validated userID, when set
	cached      bool                 // Retransform answers from the cache
	// during, when set, runs inside every Revalidate and Retransform call,
	// where the view-syncer's lock is held but the Manager's is not.
	during func(c conn)

	calls     []string
	failed    []string // clientIDs
	failedSel []auth.Selector
}

func newEffects() *effects {
	return &effects{
		revalidate:  map[string]error{},
		retransform: map[string]error{},
		serverUser:  map[string]auth.User{},
	}
}

func (e *effects) validation(c conn) auth.Validation {
	if u, ok := e.serverUser[c.ClientID]; ok {
		return auth.Validation{Server: true, UserID: u}
	}
	return auth.Validation{}
}

func (e *effects) Revalidate(_ context.Context, c conn) (auth.Validation, error) {
	e.mu.Lock()
	e.calls = append(e.calls, fmt.Sprintf("revalidate %s@%d", c.ClientID, c.Revision))
	err, v, during := e.revalidate[c.ClientID], e.validation(c), e.during
	e.mu.Unlock()
	if during != nil {
		during(c)
	}
	return v, err
}

func (e *effects) Retransform(_ context.Context, c conn) (*auth.Validation, error) {
	e.mu.Lock()
	e.calls = append(e.calls, fmt.Sprintf("retransform %s@%d", c.ClientID, c.Revision))
	err, v, during, cached := e.retransform[c.ClientID], e.validation(c), e.during, e.cached
	e.mu.Unlock()
	if during != nil {
		during(c)
	}
	if err != nil || cached {
		return nil, err
	}
	return &v, nil
}

func (e *effects) FailConnection(c conn, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failed = append(e.failed, c.ClientID)
	e.failedSel = append(e.failedSel, c.Selector)
}

func (e *effects) takeCalls() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	cs := e.calls
	e.calls = nil
	return cs
}

func (e *effects) failures() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.failed...)
}

// harness drives a Manager on a fake clock; the timer's Wake runs Maintain
// synchronously inside Clock.Advance.
type harness struct {
	t     *testing.T
	clock *authtest.Clock
	eff   *effects
	m     *manager
	wakes int
}

func newHarness(t *testing.T, revalidate, retransform time.Duration) *harness {
	t.Helper()
	h := &harness{t: t, clock: authtest.NewClock(t0), eff: newEffects()}
	m, err := auth.NewManager[string, string, string](auth.ManagerConfig{
		RevalidateInterval:  revalidate,
		RetransformInterval: retransform,
		Clock:               h.clock,
		Logger:              quiet,
		Wake: func() {
			h.wakes++
			if err := h.m.Maintain(t.Context(), h.eff); err != nil {
				t.Errorf("Maintain: %v", err)
			}
		},
	})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	h.m = m
	t.Cleanup(m.Stop)
	return h
}

func sel(client string) auth.Selector {
	return auth.Selector{ClientID: client, WSID: "ws-" + client}
}

// connect registers client for user, applies its initConnection and
// validates it, as the view-syncer's initConnection does.
func (h *harness) connect(client, user string) conn {
	h.t.Helper()
	s := sel(client)
	h.m.Register(s, auth.UserOf(user), "token-"+client, "q", "m")
	c, err := h.m.InitConnection(s, "q-init", "m-init")
	if err != nil {
		h.t.Fatalf("InitConnection(%v): %v", s, err)
	}
	c, ok, err := h.m.Validate(s, c.Revision, auth.Validation{})
	if err != nil || !ok {
		h.t.Fatalf("Validate(%v) = %v, %v", s, ok, err)
	}
	return c
}

// wake returns the armed timer's deadline as an offset from t0 (-1: none),
// after checking that the fake clock holds exactly that one timer.
func (h *harness) wake() time.Duration {
	h.t.Helper()
	at, armed := h.m.NextWake()
	pending := h.clock.Pending()
	if !armed {
		if len(pending) != 0 {
			h.t.Fatalf("no timer armed, but the clock holds %v", pending)
		}
		return -1
	}
	if len(pending) != 1 {
		h.t.Fatalf("clock holds %d timers %v; want 1", len(pending), pending)
	}
	return at.Sub(t0)
}

func (h *harness) background() string {
	h.t.Helper()
	c, ok := h.m.Background()
	if !ok {
		return ""
	}
	return c.ClientID
}
