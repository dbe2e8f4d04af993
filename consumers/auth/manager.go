package auth

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jetsync/jetsync/internal/logkey"
)

// Manager is one client group's connection context manager. Its methods are
// safe for concurrent use; each one is a locked operation that re-arms the
// maintenance timer before it returns.
type Manager[A, Q, M any] struct {
	revalidate  time.Duration
	retransform time.Duration
	clock       Clock
	wake        func()
	log         *slog.Logger

	mu    sync.Mutex
	conns map[string]Conn[A, Q, M] // by clientID: one live socket per client
	group Group
	// retransformReady is zero-cache's "shared retransform ready": the
	// view-syncer's pipelines are synced.
	retransformReady bool
	nextOrder        uint64

	timer   Timer
	timerAt time.Time // the deadline the timer was armed for
	timerID uint64    // identifies the armed timer, so a stopped one that still fires is ignored
	// maintaining suppresses re-arming while Maintain runs; Maintain re-arms when done.
	maintaining bool
	stopped     bool
}

// NewManager returns a Manager. It arms no timer until a deadline exists.
func NewManager[A, Q, M any](cfg ManagerConfig) (*Manager[A, Q, M], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Manager[A, Q, M]{
		revalidate:  cfg.RevalidateInterval,
		retransform: cfg.RetransformInterval,
		clock:       cfg.Clock,
		wake:        cfg.Wake,
		log:         cfg.Logger,
		conns:       make(map[string]Conn[A, Q, M]),
	}, nil
}

// Register creates the record of a newly accepted socket, provisional at
// revision 0, replacing any record of the same client.
func (m *Manager[A, Q, M]) Register(sel Selector, user User, auth A, query Q, mutate M) Conn[A, Q, M] {
	m.mu.Lock()
	defer m.unlock()
	m.removeLocked(sel.ClientID)
	m.nextOrder++
	c := Conn[A, Q, M]{
		Selector: sel,
		State:    Provisional,
		User:     user,
		Auth:     auth,
		Query:    query,
		Mutate:   mutate,
		Order:    m.nextOrder,
	}
	m.conns[sel.ClientID] = c
	m.refreshBackgroundLocked(nil)
	m.updateRetransformLocked(false)
	return c
}

// InitConnection applies the initConnection message's query and mutate
// contexts (user URLs and headers). It is a new revision, provisional until
// validated again.
func (m *Manager[A, Q, M]) InitConnection(sel Selector, query Q, mutate M) (Conn[A, Q, M], error) {
	m.mu.Lock()
	defer m.unlock()
	c, ok := m.getLocked(sel)
	if !ok {
		return c, ErrNoConnection
	}
	c.Revision++
	c.Query, c.Mutate = query, mutate
	return m.demoteLocked(c), nil
}

// UpdateAuth stores the connection's auth after updateAuth. The caller
// resolves the new token and reports whether it changed materially (another
// type or raw string). A change is a new revision, provisional until
// validated; the caller then retransforms with it (RetransformConn). An
// unchanged token keeps the revision and state.
func (m *Manager[A, Q, M]) UpdateAuth(sel Selector, auth A, changed bool) (Conn[A, Q, M], error) {
	m.mu.Lock()
	defer m.unlock()
	c, ok := m.getLocked(sel)
	if !ok {
		return c, ErrNoConnection
	}
	c.Auth = auth
	if !changed {
		m.conns[sel.ClientID] = c
		return c, nil
	}
	c.Revision++
	return m.demoteLocked(c), nil
}

// Validate records a successful auth check of the connection at revision.
// It is a no-op (false) when the socket is gone or the revision is stale.
// The first validation pins the group's user; a different user is refused
// with ErrPinnedUser (or ErrServerUserMismatch), leaving the record as it
// was. The connection becomes validated, due for revalidation after the
// interval, and the background connection if there is none.
func (m *Manager[A, Q, M]) Validate(sel Selector, revision int, v Validation) (Conn[A, Q, M], bool, error) {
	m.mu.Lock()
	defer m.unlock()
	c, ok := m.getLocked(sel)
	if !ok || c.Revision != revision {
		return c, false, nil
	}
	user := c.User
	if v.Server {
		if v.UserID != c.User {
			return c, false, ErrServerUserMismatch
		}
		user = v.UserID
	}
	if m.group.Pinned && m.group.PinnedUser != user {
		return c, false, ErrPinnedUser
	}
	if !m.group.Pinned {
		m.group.PinnedUser, m.group.Pinned = user, true
	}
	c.State = Validated
	c.RevalidateAt = m.after(m.revalidate)
	m.conns[sel.ClientID] = c
	m.refreshBackgroundLocked(&c)
	m.updateRetransformLocked(false)
	return c, true, nil
}

// Fail removes a connection whose auth failed, unless revision is stale
// (the connection changed since the failing work started). It reports
// whether it removed the record; only then should the client be failed.
func (m *Manager[A, Q, M]) Fail(sel Selector, revision int) (Conn[A, Q, M], bool) {
	m.mu.Lock()
	defer m.unlock()
	c, ok := m.getLocked(sel)
	if !ok || c.Revision != revision {
		return c, false
	}
	m.removeLocked(sel.ClientID)
	return c, true
}

// Close removes a disconnected socket's record.
func (m *Manager[A, Q, M]) Close(sel Selector) (Conn[A, Q, M], bool) {
	m.mu.Lock()
	defer m.unlock()
	c, ok := m.getLocked(sel)
	if ok {
		m.removeLocked(sel.ClientID)
	}
	return c, ok
}

// MarkRetransformSuccess starts a new retransform interval after a
// successful background retransform by sel at revision, if that is still
// the background connection at that revision.
func (m *Manager[A, Q, M]) MarkRetransformSuccess(sel Selector, revision int) {
	m.mu.Lock()
	defer m.unlock()
	bg, ok := m.backgroundLocked()
	if !ok || bg.Selector != sel || bg.Revision != revision {
		return
	}
	m.updateRetransformLocked(true)
}

// SetRetransformReady tells whether the view-syncer's pipelines are synced,
// which background retransforms need. A change restarts the interval.
func (m *Manager[A, Q, M]) SetRetransformReady(ready bool) {
	m.mu.Lock()
	defer m.unlock()
	if m.retransformReady == ready {
		return
	}
	m.retransformReady = ready
	m.updateRetransformLocked(true)
}

// Defer postpones all maintenance by kind's interval after a transient failure.
func (m *Manager[A, Q, M]) Defer(kind Kind) {
	m.mu.Lock()
	defer m.unlock()
	m.deferLocked(kind)
}

// Plan reports the maintenance due now.
func (m *Manager[A, Q, M]) Plan() Plan[A, Q, M] {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.planLocked(m.clock.Now())
}

// Conn returns the live record of a socket.
func (m *Manager[A, Q, M]) Conn(sel Selector) (Conn[A, Q, M], bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.getLocked(sel)
}

// MustConn returns the live record of a socket, or ErrNoConnection.
func (m *Manager[A, Q, M]) MustConn(sel Selector) (Conn[A, Q, M], error) {
	c, ok := m.Conn(sel)
	if !ok {
		return c, ErrNoConnection
	}
	return c, nil
}

// Background returns the group's background connection, if any.
func (m *Manager[A, Q, M]) Background() (Conn[A, Q, M], bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.backgroundLocked()
}

// MustBackground returns the background connection, or ErrNoBackground.
func (m *Manager[A, Q, M]) MustBackground() (Conn[A, Q, M], error) {
	c, ok := m.Background()
	if !ok {
		return c, ErrNoBackground
	}
	return c, nil
}

// Group returns the group-level state.
func (m *Manager[A, Q, M]) Group() Group {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.group
}

// Conns returns every live record, in registration order.
func (m *Manager[A, Q, M]) Conns() []Conn[A, Q, M] {
	m.mu.Lock()
	defer m.mu.Unlock()
	cs := make([]Conn[A, Q, M], 0, len(m.conns))
	for _, c := range m.conns {
		cs = append(cs, c)
	}
	slices.SortFunc(cs, byOrder)
	return cs
}

// NextWake returns the deadline the maintenance timer is armed for.
func (m *Manager[A, Q, M]) NextWake() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.timerAt, m.timer != nil
}

// Stop disarms the timer for good, when the view-syncer shuts down.
func (m *Manager[A, Q, M]) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopped = true
	m.disarmLocked()
}

// unlock ends a locked operation: every state change re-arms the timer
// before other goroutines can observe it.
func (m *Manager[A, Q, M]) unlock() {
	m.rearmLocked()
	m.mu.Unlock()
}

func (m *Manager[A, Q, M]) rearmLocked() {
	if m.maintaining || m.stopped {
		return
	}
	now := m.clock.Now()
	at := m.planLocked(now).Earliest
	if m.timer != nil && at.Equal(m.timerAt) {
		return
	}
	m.disarmLocked()
	if at.IsZero() || m.wake == nil {
		return
	}
	m.timerID++
	id := m.timerID
	m.timerAt = at
	m.timer = m.clock.AfterFunc(max(0, at.Sub(now)), func() { m.fire(id) })
	m.log.Debug("auth maintenance scheduled", "at", at, "delay", max(0, at.Sub(now)))
}

func (m *Manager[A, Q, M]) disarmLocked() {
	if m.timer != nil {
		m.timer.Stop()
		m.timer = nil
	}
	m.timerAt = time.Time{}
}

func (m *Manager[A, Q, M]) fire(id uint64) {
	m.mu.Lock()
	if m.stopped || id != m.timerID || m.timer == nil {
		m.mu.Unlock()
		return
	}
	m.timer = nil
	m.timerAt = time.Time{}
	m.mu.Unlock()
	m.wake()
}

func (m *Manager[A, Q, M]) after(d time.Duration) time.Time {
	if d == 0 {
		return time.Time{}
	}
	return m.clock.Now().Add(d)
}

func (m *Manager[A, Q, M]) getLocked(sel Selector) (Conn[A, Q, M], bool) {
	c, ok := m.conns[sel.ClientID]
	if !ok || c.WSID != sel.WSID {
		return Conn[A, Q, M]{}, false
	}
	return c, true
}

func (m *Manager[A, Q, M]) removeLocked(clientID string) {
	if _, ok := m.conns[clientID]; !ok {
		return
	}
	delete(m.conns, clientID)
	m.refreshBackgroundLocked(nil)
	m.updateRetransformLocked(false)
}

func (m *Manager[A, Q, M]) demoteLocked(c Conn[A, Q, M]) Conn[A, Q, M] {
	c.State = Provisional
	c.RevalidateAt = time.Time{}
	m.conns[c.ClientID] = c
	m.refreshBackgroundLocked(nil)
	m.updateRetransformLocked(false)
	return c
}

func (m *Manager[A, Q, M]) backgroundLocked() (Conn[A, Q, M], bool) {
	if !m.group.HasBackground {
		return Conn[A, Q, M]{}, false
	}
	return m.getLocked(m.group.Background)
}

// refreshBackgroundLocked keeps the background connection sticky while it
// stays validated. A newly validated connection takes the role only when
// nobody holds it. Otherwise a lost or demoted background connection is
// replaced by the validated connection registered last (ties: greater wsID).
func (m *Manager[A, Q, M]) refreshBackgroundLocked(validated *Conn[A, Q, M]) {
	if validated != nil && validated.State == Validated {
		if _, ok := m.backgroundLocked(); ok {
			return
		}
		m.setBackgroundLocked(validated.Selector, true)
		return
	}
	if bg, ok := m.backgroundLocked(); ok && bg.State == Validated {
		return
	}
	var next *Conn[A, Q, M]
	for _, c := range m.conns {
		if c.State != Validated {
			continue
		}
		if next == nil || byOrder(c, *next) > 0 {
			next = &c
		}
	}
	if next == nil {
		m.setBackgroundLocked(Selector{}, false)
		return
	}
	m.setBackgroundLocked(next.Selector, true)
}

func (m *Manager[A, Q, M]) setBackgroundLocked(sel Selector, ok bool) {
	if m.group.HasBackground == ok && m.group.Background == sel {
		return
	}
	m.group.Background, m.group.HasBackground = sel, ok
	if ok {
		m.log.Debug("background connection selected", logkey.Client, sel.ClientID, logkey.WSID, sel.WSID)
	}
}

// updateRetransformLocked keeps retransformAt coherent: it exists only while
// there is a background connection, the interval is enabled and pipelines
// are synced. reset starts a new interval; otherwise an existing deadline
// keeps its cadence.
func (m *Manager[A, Q, M]) updateRetransformLocked(reset bool) {
	if _, ok := m.backgroundLocked(); !ok || m.retransform == 0 || !m.retransformReady {
		m.group.RetransformAt = time.Time{}
		return
	}
	if reset || m.group.RetransformAt.IsZero() {
		m.group.RetransformAt = m.clock.Now().Add(m.retransform)
	}
}

func (m *Manager[A, Q, M]) deferLocked(kind Kind) {
	d := m.revalidate
	if kind == Retransformation {
		d = m.retransform
	}
	if d == 0 {
		return
	}
	if at := m.clock.Now().Add(d); at.After(m.group.NotBefore) {
		m.group.NotBefore = at
	}
}

func (m *Manager[A, Q, M]) planLocked(now time.Time) Plan[A, Q, M] {
	var p Plan[A, Q, M]
	p.Earliest = m.group.RetransformAt
	for _, c := range m.conns {
		if c.State != Validated || c.RevalidateAt.IsZero() {
			continue
		}
		if !c.RevalidateAt.After(now) {
			p.DueRevalidations = append(p.DueRevalidations, c)
		}
		p.Earliest = minTime(p.Earliest, c.RevalidateAt)
	}
	p.DueRetransform = !m.group.RetransformAt.IsZero() && !m.group.RetransformAt.After(now)
	if nb := m.group.NotBefore; nb.After(now) && !p.Earliest.IsZero() {
		if nb.After(p.Earliest) {
			p.Earliest = nb
		}
		p.DueRevalidations, p.DueRetransform = nil, false
		return p
	}
	slices.SortFunc(p.DueRevalidations, byOrder)
	return p
}

func byOrder[A, Q, M any](a, b Conn[A, Q, M]) int {
	return cmp.Or(cmp.Compare(a.Order, b.Order), cmp.Compare(a.WSID, b.WSID))
}

// minTime is min over set times; the zero time means unset.
func minTime(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}
