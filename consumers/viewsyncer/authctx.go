package viewsyncer

import (
	"context"
	"errors"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/auth"
)

// authKeys are c's token settings.
func (c Config) authKeys() auth.Keys {
	return auth.Keys{
		Secret: c.AuthSecret, JWK: c.AuthJWK, JWKSURL: c.AuthJWKSURL,
		Issuer: c.AuthIssuer, Audience: c.AuthAudience,
		JWKSStale: c.AuthJWKSStale, JWKSAllowHTTP: c.AuthJWKSAllowHTTP,
		Logger: c.Logger,
	}
}

// errNoAuthConfigured is zero-cache's answer to a token on a connection
// when none of the three key settings is set.
const errNoAuthConfigured = "Exactly one of jwk, secret, or jwksUrl must be set in order to verify tokens but actually the following were set: []. " +
	"You may also set both ZERO_MUTATE_URL and ZERO_QUERY_URL to enable custom mutations and queries without passing token verification options."

// authenticate resolves a connection's token as zero-cache's resolveAuth
// does (docs/protocol.md §13): no token is a logged-out connection; with a
// key configured a token must be a valid JWT for userID; without one it is
// opaque and passed through to the API server when both its query and
// mutate URLs are configured; otherwise zero-cache refuses it on connect
// (connecting). It returns a verified JWT's claims, nil for an opaque token
// or none.
func (s *Server) authenticate(ctx context.Context, token, userID string, connecting bool) (map[string]any, *protocolError) {
	if token == "" {
		return nil, nil
	}
	if s.auth == nil && connecting && !s.opaqueTokens() {
		// zero-cache throws here, outside its protocol errors, and the
		// unhandled rejection takes its syncer down; one failed
		// connection is the useful part of that.
		s.log.Error("token sent but no ZERO_AUTH_SECRET, ZERO_AUTH_JWK or ZERO_AUTH_JWKS_URL is set")
		return nil, newProtocolError(kindInternal, "%s", errNoAuthConfigured)
	}
	if userID == "" {
		return nil, authError(kindUnauthorized, "Authenticated connections require a userID.")
	}
	if s.auth == nil {
		return nil, nil
	}
	claims, err := s.auth.Verify(ctx, token, userID)
	if err != nil {
		return nil, authError(kindAuthInvalidated, "Failed to decode auth token: "+auth.JoseMessage(err))
	}
	return claims, nil
}

// opaqueTokens reports whether tokens may be opaque without a key: the API
// server, at both endpoints, is then their authority (docs/protocol.md §13).
func (s *Server) opaqueTokens() bool {
	return s.api.QueryConfigured() && s.api.MutateConfigured()
}

func authError(kind, msg string) *protocolError {
	e := newProtocolError(kind, "%s", msg)
	e.closeCode = closeAuth
	return e
}

// connAuth is a connection's resolved token: the raw string forwarded to
// the API server, and a verified JWT's claims (nil for an opaque token).
type connAuth struct {
	token  string
	claims map[string]any
}

// endpoint is a connection's context for one API endpoint: the client's
// own URL (userQueryURL/userPushURL, "" for the configured one) and headers.
type endpoint struct {
	url     string
	headers map[string]string
}

type (
	authManager = auth.Manager[connAuth, endpoint, endpoint]
	authConn    = auth.Conn[connAuth, endpoint, endpoint]
)

// newAuthManager returns a group's connection context manager. Its timer
// only signals g.maint; the group's next maintenance round (Run's evict
// loop) then runs the maintenance.
func (s *Server) newAuthManager(g *group) *authManager {
	m, err := auth.NewManager[connAuth, endpoint, endpoint](auth.ManagerConfig{
		RevalidateInterval:  s.cfg.RevalidateInterval,
		RetransformInterval: s.cfg.RetransformInterval,
		Clock:               s.cfg.Clock,
		Wake: func() {
			select {
			case g.maint <- struct{}{}:
			default:
			}
		},
		Logger: g.log,
	})
	if err != nil {
		panic(err) // the intervals were validated with the server's Config
	}
	return m
}

// selector is the connection's key in the group's auth manager.
func (c *conn) selector() auth.Selector {
	return auth.Selector{ClientID: c.clientID, WSID: c.wsID}
}

func userOf(id string) auth.User {
	if id == "" {
		return auth.User{}
	}
	return auth.UserOf(id)
}

// apiConn is what a request to the API server carries for the connection
// with record ac.
func (c *conn) apiConn(ac authConn) appapi.Conn {
	r := c.upgrade
	r.UserID, r.Token = c.userID, ac.Auth.token
	return r
}

// validation converts the API server's vouching into the manager's.
func validation(v appapi.Validation) auth.Validation {
	out := auth.Validation{Server: v.Server}
	if v.UserID != nil {
		out.UserID = auth.UserOf(*v.UserID)
	}
	return out
}

// classify marks an API failure for the manager: 401/403 is an auth
// failure, any other Failure transient; other errors stay fatal.
func classify(err error) error {
	var f *appapi.Failure
	switch {
	case err == nil:
		return nil
	case errors.As(err, &f) && f.Auth():
		return auth.AuthError(err)
	case errors.As(err, &f):
		return auth.TransientError(err)
	}
	var ce *auth.Error
	if errors.As(err, &ce) && ce.Kind == auth.KindUnauthorized {
		return auth.AuthError(err)
	}
	return err
}

// validateConn checks c's credentials with the empty transform (or a
// client-fallback success without a query URL) and records the result.
// An auth failure removes c's record; the caller fails c with the error.
// pre, if it validated c's current credentials, answers in place of the
// API server.
func (g *group) validateConn(ctx context.Context, c *conn, pre *initPrefetch) error {
	ac, err := g.cc.MustConn(c.selector())
	if err != nil {
		return err
	}
	v := auth.Validation{}
	if g.s.api != nil {
		var av appapi.Validation
		var err error
		if pre != nil && pre.ac.Selector == ac.Selector && pre.ac.Revision == ac.Revision {
			av, err = pre.val, pre.valErr
		} else {
			av, err = g.s.api.Validate(ctx, c.apiConn(ac), ac.Query.url, ac.Query.headers)
		}
		if err != nil {
			if appapi.IsAuth(err) {
				g.cc.Fail(ac.Selector, ac.Revision)
			}
			return err
		}
		v = validation(av)
	}
	if _, _, err := g.cc.Validate(ac.Selector, ac.Revision, v); err != nil {
		g.cc.Fail(ac.Selector, ac.Revision)
		return err
	}
	return nil
}

// connOf returns the live connection of a manager record.
func (g *group) connOf(ac authConn) *conn {
	c := g.conns[ac.ClientID]
	if c == nil || c.wsID != ac.WSID {
		return nil
	}
	return c
}

// effects are the manager's Effects, which it runs outside its own lock
// (Maintain, from the maintenance round; RetransformConn, from updateAuth).
// Each takes the group's lock for its own steps and calls the API server
// without it; a result is applied only if the connection and its auth
// revision are still current.
type effects struct {
	g   *group
	err error // a sync error that is not the API server's: fatal
}

// errGone defers maintenance for a connection or group that went away
// while its API call ran.
var errGone = auth.TransientError(errors.New("connection gone"))

// currentConn is ac's connection if it is still live at ac's revision in a
// group that is still served; g's lock is held.
func (g *group) currentConn(ac authConn) *conn {
	if g.unloaded || g.broken {
		return nil
	}
	c := g.connOf(ac)
	if c == nil {
		return nil
	}
	if cur, ok := g.cc.Conn(ac.Selector); !ok || cur.Revision != ac.Revision {
		return nil
	}
	return c
}

func (e *effects) Revalidate(ctx context.Context, ac authConn) (auth.Validation, error) {
	g := e.g
	unlock := g.lock()
	c := g.currentConn(ac)
	unlock()
	if c == nil {
		return auth.Validation{}, errGone
	}
	if g.s.api == nil {
		return auth.Validation{}, nil
	}
	v, err := g.s.api.Validate(ctx, c.apiConn(ac), ac.Query.url, ac.Query.headers)
	if err != nil {
		return auth.Validation{}, classify(err)
	}
	return validation(v), nil
}

func (e *effects) Retransform(ctx context.Context, ac authConn) (*auth.Validation, error) {
	g := e.g
	unlock := g.lock()
	defer func() { unlock() }()
	c := g.currentConn(ac)
	if c == nil {
		return nil, errGone
	}
	var res *appapi.TransformResult
	if req, ok := g.transformRequest(&via{c: c, ac: ac, all: true}, g.ttlClock(time.Now())); ok {
		unlock()
		r, err := g.callTransform(ctx, req)
		unlock = g.lock()
		if err != nil {
			return nil, classify(err)
		}
		if g.currentConn(ac) != c {
			return nil, errGone
		}
		res = &r
	}
	snap, err := g.openSnapshot(ctx)
	if err != nil || snap == nil {
		return nil, err
	}
	defer snap.close()
	val, err := g.syncTransformed(ctx, snap, res)
	g.dropIfBroken()
	if err != nil {
		if c := classify(err); c != err {
			return nil, c
		}
		var perr *protocolError
		if errors.As(err, &perr) {
			return nil, err
		}
		e.err = err
		return nil, err
	}
	return val, nil
}

func (e *effects) FailConnection(ac authConn, err error) {
	unlock := e.g.lock()
	defer unlock()
	if c := e.g.connOf(ac); c != nil {
		c.ready = false
		c.failErr(err)
	}
}

// maintain runs the group's due auth maintenance (Run's evict loop calls it
// after the manager's timer fired). The API server is called without the
// group's lock. An error other than the API server's is fatal for the
// group: its clients are sent away.
func (g *group) maintain(ctx context.Context) {
	unlock := g.lock()
	gone := g.unloaded || g.broken
	unlock()
	if gone {
		return
	}
	eff := &effects{g: g}
	err := g.cc.Maintain(ctx, eff)
	if err == nil {
		return
	}
	unlock = g.lock()
	defer unlock()
	if g.unloaded {
		return
	}
	g.log.Error("auth maintenance", "err", err)
	g.cc.Stop()
	g.broken = true
	g.dropIfBroken()
}

// maintenanceDue reports whether the manager's timer fired for g.
func (g *group) maintenanceDue() bool {
	select {
	case <-g.maint:
		return true
	default:
		return false
	}
}
