package auth

import (
	"context"
	"fmt"

	"github.com/jetsync/jetsync/internal/logkey"
)

// Effects is the work the Manager asks of the view-syncer. The Manager
// calls these methods outside its lock, so they may call back into it.
// Revalidate and Retransform classify their errors with AuthError and
// TransientError; any other error is fatal for the group.
type Effects[A, Q, M any] interface {
	// Revalidate checks c's credentials: the empty ["transform", []]
	// request, or a client-fallback Validation when no query URL is configured.
	Revalidate(ctx context.Context, c Conn[A, Q, M]) (Validation, error)
	// Retransform re-transforms every custom query of the group with c's
	// credentials and replaces the pipelines whose AST changed. It returns
	// the Validation of an uncached transform response, or nil when every
	// query came from the cache (which validates nothing).
	Retransform(ctx context.Context, c Conn[A, Q, M]) (*Validation, error)
	// FailConnection sends err to the client of c and closes its socket.
	// The Manager has already removed c's record.
	FailConnection(c Conn[A, Q, M], err error)
}

// Maintain runs the maintenance that is due; the view-syncer calls it after
// Wake, without its group lock, which its Effects take as they need. Each due connection is revalidated: an auth
// failure fails that connection only, a transient one defers all
// maintenance and ends the round. Then, if a background retransform is due,
// it runs with the background connection's credentials: an auth failure
// fails that connection and retries at once with its replacement, a
// transient one defers. Maintain re-arms the timer when it returns. A
// non-nil error is fatal for the group (zero-cache fails the view-syncer):
// call Stop.
func (m *Manager[A, Q, M]) Maintain(ctx context.Context, eff Effects[A, Q, M]) error {
	m.mu.Lock()
	if m.maintaining || m.stopped {
		m.mu.Unlock()
		return nil
	}
	m.maintaining = true
	p := m.planLocked(m.clock.Now())
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.maintaining = false
		m.unlock()
	}()

	if len(p.DueRevalidations) == 0 && !p.DueRetransform {
		return nil
	}
	for _, c := range p.DueRevalidations {
		err := m.revalidate1(ctx, eff, c)
		switch {
		case err == nil:
		case IsAuthError(err):
			m.log.Warn("auth revalidation failed; failing connection", logkey.Client, c.ClientID, logkey.WSID, c.WSID, "err", err)
			m.fail(eff, c, err)
		case IsTransientError(err):
			m.log.Warn("auth revalidation failed; deferring auth maintenance", logkey.Client, c.ClientID, logkey.WSID, c.WSID, "err", err)
			m.Defer(Revalidation)
			return nil
		default:
			return fmt.Errorf("revalidate %s/%s: %w", c.ClientID, c.WSID, err)
		}
	}
	if !m.Plan().DueRetransform {
		return nil
	}
	return m.retransformBackground(ctx, eff)
}

func (m *Manager[A, Q, M]) revalidate1(ctx context.Context, eff Effects[A, Q, M], c Conn[A, Q, M]) error {
	v, err := eff.Revalidate(ctx, c)
	if err != nil {
		return err
	}
	_, _, err = m.Validate(c.Selector, c.Revision, v)
	return err
}

func (m *Manager[A, Q, M]) retransformBackground(ctx context.Context, eff Effects[A, Q, M]) error {
	bg, ok := m.Background()
	for ok {
		err := m.retransformWith(ctx, eff, bg)
		switch {
		case err == nil:
			m.MarkRetransformSuccess(bg.Selector, bg.Revision)
			return nil
		case IsAuthError(err):
			m.log.Warn("background retransform auth failed; trying a replacement", logkey.Client, bg.ClientID, logkey.WSID, bg.WSID, "err", err)
			m.fail(eff, bg, err)
		case IsTransientError(err):
			m.log.Warn("background retransform failed; deferring auth maintenance", logkey.Client, bg.ClientID, logkey.WSID, bg.WSID, "err", err)
			m.Defer(Retransformation)
			return nil
		default:
			return fmt.Errorf("retransform with %s/%s: %w", bg.ClientID, bg.WSID, err)
		}
		prev := bg
		bg, ok = m.Background()
		// A stale-revision failure keeps the record; retrying the very same
		// credentials could loop, so only a different connection or revision is tried.
		if ok && bg.Selector == prev.Selector && bg.Revision == prev.Revision {
			return nil
		}
	}
	return nil
}

func (m *Manager[A, Q, M]) retransformWith(ctx context.Context, eff Effects[A, Q, M], c Conn[A, Q, M]) error {
	v, err := eff.Retransform(ctx, c)
	if err != nil || v == nil {
		return err
	}
	_, _, err = m.Validate(c.Selector, c.Revision, *v)
	return err
}

// RetransformConn runs what a changed token (UpdateAuth with changed=true)
// triggers: every custom query is re-transformed with c's new credentials,
// after an explicit revalidation when pipelines are not synced yet. Any
// failure, auth or transient, fails c. It reports whether c survived.
func (m *Manager[A, Q, M]) RetransformConn(ctx context.Context, eff Effects[A, Q, M], c Conn[A, Q, M]) bool {
	m.mu.Lock()
	ready := m.retransformReady
	m.mu.Unlock()
	if !ready {
		if err := m.revalidate1(ctx, eff, c); err != nil {
			m.fail(eff, c, err)
			return false
		}
	}
	if err := m.retransformWith(ctx, eff, c); err != nil {
		m.fail(eff, c, err)
		return false
	}
	return true
}

// fail removes c unless its revision is stale, and only then fails its client.
func (m *Manager[A, Q, M]) fail(eff Effects[A, Q, M], c Conn[A, Q, M], err error) {
	if removed, ok := m.Fail(c.Selector, c.Revision); ok {
		eff.FailConnection(removed, err)
	}
}
