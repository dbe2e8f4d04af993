package viewsyncer

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/zql"
)

// patchOps is a desiredQueriesPatch for the CVR, with the ASTs parsed: a
// put without an AST but with a name is a synced query's.
func patchOps(ops []queryPatchOp, asts map[string]*zql.AST) []cvrstore.PatchOp {
	out := make([]cvrstore.PatchOp, len(ops))
	for i, op := range ops {
		out[i] = cvrstore.PatchOp{Op: op.Op, Hash: op.Hash, TTL: op.TTL, AST: asts[op.Hash]}
		if op.Name != nil && len(op.AST) == 0 {
			out[i].Name, out[i].Args = op.Name, op.Args
		}
	}
	return out
}

// attach registers c as its client's connection; an older one is closed
// (the newest wins, docs/protocol.md §2.4).
func (g *group) attach(c *conn, authenticated bool, authData map[string]any) *protocolError {
	unlock := g.lock()
	defer unlock()
	if g.unloaded {
		return errUnloaded
	}
	if g.cvr.UserID != "" && c.userID != g.cvr.UserID {
		return authError(kindUnauthorized, "Client groups are pinned to a single userID. Client group "+g.id+
			" is pinned to userID "+g.cvr.UserID+", but this connection is for userID "+c.userID+".")
	}
	if authenticated && g.cvr.UserID == "" {
		g.cvr.UserID = c.userID
	}
	if old := g.conns[c.clientID]; old != nil {
		old.ready = false
		old.closeQuietly()
	}
	if len(g.conns) == 0 {
		// The TTL clock runs while the group has connections.
		g.cvr.StartClock()
	}
	g.conns[c.clientID] = c
	g.setAuth(authData)
	g.cc.Register(c.selector(), userOf(c.userID), connAuth{token: c.token, claims: c.claims}, endpoint{}, endpoint{})
	return nil
}

// errUnloaded tells a connection that the group it found left memory
// before it attached: it looks the group up again.
var errUnloaded = newProtocolError(kindRehome, "Reconnect required")

// setAuth makes authData the claims the group's legacy queries are bound
// to. All connections of a group are pinned to one user, so the newest
// connection's claims stand for the group's background work too.
func (g *group) setAuth(authData map[string]any) {
	if g.authGen > 0 && reflect.DeepEqual(g.authData, authData) {
		return
	}
	g.authData = authData
	g.authGen++
}

// updateAuth applies a connection's new token (docs/protocol.md §4.4): a
// changed token is a new auth revision, which re-transforms the synced
// queries with it and re-binds the legacy queries to its claims
// (docs/protocol.md §13). A failure fails the connection. The
// re-transform runs as the maintenance round's does: the API server is
// called without the group's lock.
func (g *group) updateAuth(ctx context.Context, c *conn, token string, claims map[string]any) error {
	ac, retransform, err := g.applyAuth(ctx, c, token, claims)
	if err != nil || !retransform {
		return err
	}
	eff := &effects{g: g}
	g.cc.RetransformConn(ctx, eff, ac)
	unlock := g.lock()
	defer unlock()
	g.dropIfBroken()
	return eff.err
}

// applyAuth is updateAuth's work under g's lock; true means the token
// changed on a ready connection, whose record ac is to re-transform with.
func (g *group) applyAuth(ctx context.Context, c *conn, token string, claims map[string]any) (authConn, bool, error) {
	unlock := g.lock()
	defer unlock()
	if !g.current(c) {
		return authConn{}, false, nil
	}
	ac, err := g.cc.MustConn(c.selector())
	if err != nil {
		return ac, false, err
	}
	prev := ac.Auth
	if token == "" && prev.token != "" {
		return ac, false, authError(kindUnauthorized, "No token provided. An unauthenticated client cannot connect to an authenticated client group.")
	}
	if (prev.claims == nil) != (claims == nil) && prev.token != "" {
		return ac, false, authError(kindUnauthorized, "Cannot change auth type between JWT and opaque tokens.")
	}
	changed := token != prev.token
	if changed && prev.claims != nil && claims != nil {
		pi, pok := prev.claims["iat"].(float64)
		ni, nok := claims["iat"].(float64)
		switch {
		case pok != nok:
			return ac, false, authError(kindUnauthorized, "Cannot mix tokens with and without an iat claim.")
		case pok && ni < pi:
			// An older token than the one in use: keep the newer one.
			return ac, false, nil
		}
	}
	ac, err = g.cc.UpdateAuth(c.selector(), connAuth{token: token, claims: claims}, changed)
	if err != nil {
		return ac, false, err
	}
	gen := g.authGen
	g.setAuth(authMap(claims))
	if !c.ready {
		return ac, false, nil
	}
	if !changed {
		if gen == g.authGen {
			return ac, false, nil
		}
		snap, err := g.openSnapshot(ctx)
		if err != nil || snap == nil {
			return ac, false, err
		}
		defer snap.close()
		return ac, false, g.syncAt(ctx, snap)
	}
	return ac, true, nil
}

// authMap is what the legacy read rules bind authData to: a JWT's claims,
// else an empty object.
func authMap(claims map[string]any) map[string]any {
	if claims == nil {
		return map[string]any{}
	}
	return claims
}

func (g *group) detach(c *conn) {
	unlock := g.lock()
	defer unlock()
	if g.conns[c.clientID] == c {
		delete(g.conns, c.clientID)
		// A newer socket of the client has its own record, maybe under
		// the same wsid.
		g.cc.Close(c.selector())
	}
	if len(g.conns) == 0 {
		now := time.Now()
		g.cvr.StopClock(now)
		g.idleSince = now
		g.dropViews()
	}
	g.wakeMaintenance()
}

// dropViews turns an idle group cold: it keeps its CVR but not its
// pipelines, nor the row values they share, as after a load from the
// store. A returning client's catch-up re-hydrates them first
// (catchUpTo), which it mostly would anyway: a group without connections
// does not follow the replica, and re-hydrates all its queries once it
// missed an advance. So a whole-table query's rows are not held for
// GroupIdle after its clients left.
func (g *group) dropViews() {
	if g.cvr == nil || g.cvr.Version == "" || g.broken || g.unloaded {
		return
	}
	g.dropped(len(g.cvr.Rows))
	g.pipelines, g.at = map[string]*pipeline{}, ""
	for _, rec := range g.cvr.Rows {
		rec.Value = zql.RowValue{}
	}
	g.cold = true
}

// current reports whether c is still its client's connection.
func (g *group) current(c *conn) bool { return g.conns[c.clientID] == c }

// initConnection registers the client and its queries, then catches it up
// (docs/protocol.md §4.1).
func (g *group) initConnection(ctx context.Context, c *conn, body *initConnectionBody) error {
	pre := g.prefetchInit(ctx, c, body)
	unlock := g.lock()
	defer unlock()
	if !g.current(c) {
		return nil
	}
	if c.ready {
		return newProtocolError(kindInvalidMessage, "initConnection already received")
	}
	snap, err := g.openSnapshotAt(ctx, g.pipelinesAt())
	if err != nil {
		return err
	}
	if snap != nil {
		defer snap.close()
		if rv := g.cvr.ReplicaVersion; rv != "" && snap.replicaVersion < rv {
			// Rows from a newer replica cannot be caught up from this
			// older one: the group starts over. A newer replica (a
			// resync) re-hydrates the group instead (syncLocked).
			g.log.Info("resetting a cvr built from a newer replica", "cvr_replica", rv, "replica", snap.replicaVersion)
			if err := g.reset(ctx); err != nil {
				return err
			}
			if c.hasBase {
				return replicaChanged(rv, snap.replicaVersion)
			}
		}
	}
	if v := g.cvr.Version; c.hasBase {
		switch {
		case (v == "" || v == cvrstore.InitialStateVersion) && c.base > cvrstore.InitialStateVersion:
			return newProtocolError(kindClientNotFound, "Client not found")
		case c.base > v:
			return newProtocolError(kindInvalidConnectionBaseCookie, "CVR is at version %s", v)
		case c.base < g.cvr.PrunedThrough:
			return errPruned
		}
	}
	schemaRaw := body.ClientSchema
	switch {
	case g.cvr.ClientSchema == nil && len(schemaRaw) == 0:
		return newProtocolError(kindInvalidConnectionRequest, "The initConnection message for a new client group must include client schema.")
	case g.cvr.ClientSchema != nil && len(schemaRaw) > 0 && !sameJSON(g.cvr.ClientSchema, schemaRaw):
		return newProtocolError(kindInvalidConnectionRequest, "Provided schema does not match previous schema.")
	case len(schemaRaw) == 0:
		schemaRaw = g.cvr.ClientSchema
	}
	if snap != nil {
		if err := checkClientSchema(schemaRaw, snap.schema); err != nil {
			return err
		}
	}
	if pre == nil {
		if _, err := g.cc.InitConnection(c.selector(), endpoint{body.UserQueryURL, body.UserQueryHeaders},
			endpoint{body.UserPushURL, body.UserPushHeaders}); err != nil {
			return err
		}
	}
	// Auth is checked before any data is sent (docs/protocol.md §13).
	if err := g.validateConn(ctx, c, pre); err != nil {
		return err
	}
	missing, err := g.viaConn(c, false)
	if err != nil {
		return err
	}
	if pre != nil {
		missing.pre = pre.transform
	}
	release, perr := g.checkQueries(c.clientID, body.DesiredQueriesPatch, g.ttlClock(time.Now()))
	if perr != nil {
		return perr
	}
	defer release()
	asts, err := parseASTs(body.DesiredQueriesPatch, snap)
	if err != nil {
		return err
	}
	if err := g.catchUpTo(ctx, snap, missing); err != nil {
		return err
	}
	now := g.ttlClock(time.Now())
	u := g.beginConfig()
	if g.cvr.ClientSchema == nil {
		u.SetClientSchema(schemaRaw)
	}
	u.PutClient(c.clientID)
	u.ApplyPatch(c.clientID, patchOps(body.DesiredQueriesPatch, asts), now)
	if body.ActiveClients != nil {
		for id := range g.cvr.Clients {
			if id != c.clientID && !slices.Contains(body.ActiveClients, id) {
				u.DeleteClient(id, now)
			}
		}
	}
	var deleted []string
	if body.Deleted != nil {
		deleted = body.Deleted.ClientIDs
		for _, id := range deleted {
			if id != c.clientID {
				u.DeleteClient(id, now)
			}
		}
	}
	c.ready = true
	all := *missing
	all.all = true
	if err := g.finishConfig(ctx, u, snap, &all); err != nil {
		return err
	}
	if snap != nil {
		// The pipelines are synced: background retransforms may run.
		g.cc.SetRetransformReady(true)
	}
	g.ackDeletes(deleted)
	return nil
}

// initPrefetch is what initConnection asks the API server, asked before it
// takes the group's lock: the validation of the connection's credentials
// and, if they passed, the transform of the group's synced queries and the
// patch's. The connection's endpoints are applied to its record first
// (auth.Manager.InitConnection), which the locked work then skips.
type initPrefetch struct {
	ac        authConn
	val       appapi.Validation
	valErr    error
	transform *prefetch
}

// prefetchInit makes initConnection's API calls without g's lock; nil when
// there is no API server, or c is not waiting for its initConnection (the
// locked work then finds out why).
func (g *group) prefetchInit(ctx context.Context, c *conn, body *initConnectionBody) *initPrefetch {
	if g.s.api == nil {
		return nil
	}
	unlock := g.lock()
	if !g.current(c) || c.ready || g.unloaded {
		unlock()
		return nil
	}
	ac, err := g.cc.InitConnection(c.selector(), endpoint{body.UserQueryURL, body.UserQueryHeaders},
		endpoint{body.UserPushURL, body.UserPushHeaders})
	if err != nil {
		unlock()
		return nil
	}
	v := &via{c: c, ac: ac, all: true}
	// A patch the query bound refuses is validated first, as the locked
	// work does, but not sent to the API server.
	tooMany := g.tooManyQueries(c.clientID, body.DesiredQueriesPatch, g.ttlClock(time.Now()))
	qs := g.transformQueries(v, g.ttlClock(time.Now()))
	ids := map[string]bool{}
	for _, q := range qs {
		ids[q.ID] = true
	}
	for _, op := range body.DesiredQueriesPatch {
		if op.Op == "put" && op.Name != nil && len(op.AST) == 0 && !ids[op.Hash] {
			ids[op.Hash] = true
			qs = append(qs, appapi.Query{ID: op.Hash, Name: *op.Name, Args: op.Args})
		}
	}
	unlock()
	pre := &initPrefetch{ac: ac}
	pre.val, pre.valErr = g.s.api.Validate(ctx, c.apiConn(ac), ac.Query.url, ac.Query.headers)
	// Without a replica the locked work transforms nothing: the queries
	// wait for the first advance.
	if pre.valErr != nil || tooMany || len(qs) == 0 || !g.s.api.QueryConfigured() || g.s.cfg.Replica.State().Watermark == "" {
		return pre
	}
	res, err := g.callTransform(ctx, appapi.TransformRequest{
		Conn: c.apiConn(ac), URL: ac.Query.url, Headers: ac.Query.headers, Queries: qs,
	})
	pre.transform = &prefetch{sel: ac.Selector, revision: ac.Revision, ids: ids, res: res, err: err}
	return pre
}

// catchUpTo brings an existing group's rows to snap before a config change,
// as zero-cache's view-syncer keeps advancing while loaded: a returning
// client's catch-up then carries the config and row changes in one poke.
func (g *group) catchUpTo(ctx context.Context, snap *snapshot, v *via) error {
	if snap == nil || g.cvr.Version == "" || !g.cold && snap.version <= g.pipelinesAt() {
		return nil
	}
	return g.syncForClient(ctx, snap, v)
}

// syncForClient syncs the group at snap for a config change of v's client,
// transforming the synced queries with its credentials. A transform
// failure is the client's: an auth failure also invalidates its
// connection (docs/protocol.md §13).
func (g *group) syncForClient(ctx context.Context, snap *snapshot, v *via) error {
	val, err := g.syncVia(ctx, snap, v)
	if err != nil {
		if appapi.IsAuth(err) {
			g.cc.Fail(v.ac.Selector, v.ac.Revision)
		}
		return err
	}
	return g.validateVia(v, val)
}

// finishConfig flushes a config update, poking only if it changed
// something, then syncs the queries, which pokes every connection that
// still needs one. So a reconnecting client gets one catch-up poke.
func (g *group) finishConfig(ctx context.Context, u *update, snap *snapshot, v *via) error {
	changed := u.Changed()
	if changed {
		if err := g.flush(ctx, u); err != nil {
			return err
		}
	}
	if snap != nil {
		// Config syncs hydrate the group's new queries: their time paces
		// the drain (Server.drain).
		start := time.Now()
		defer func() { g.timeSync(time.Since(start)) }()
		return g.syncForClient(ctx, snap, v)
	}
	if !changed {
		g.poke(u)
	}
	return nil
}

func (g *group) changeDesiredQueries(ctx context.Context, c *conn, ops []queryPatchOp) error {
	pre := g.prefetchTransform(ctx, c, ops)
	unlock := g.lock()
	defer unlock()
	if !g.current(c) {
		return nil
	}
	if !c.ready {
		return newProtocolError(kindInvalidMessage, "changeDesiredQueries before initConnection")
	}
	snap, err := g.openSnapshot(ctx)
	if err != nil {
		return err
	}
	if snap != nil {
		defer snap.close()
	}
	release, perr := g.checkQueries(c.clientID, ops, g.ttlClock(time.Now()))
	if perr != nil {
		return perr
	}
	defer release()
	asts, err := parseASTs(ops, snap)
	if err != nil {
		return err
	}
	v, err := g.viaConn(c, false)
	if err != nil {
		return err
	}
	v.pre = pre
	if err := g.catchUpTo(ctx, snap, v); err != nil {
		return err
	}
	u := g.beginConfig()
	u.ApplyPatch(c.clientID, patchOps(ops, asts), g.ttlClock(time.Now()))
	return g.finishConfig(ctx, u, snap, v)
}

func (g *group) deleteClients(ctx context.Context, c *conn, ids []string) error {
	pre := g.prefetchTransform(ctx, c, nil)
	unlock := g.lock()
	defer unlock()
	if !g.current(c) {
		return nil
	}
	snap, err := g.openSnapshot(ctx)
	if err != nil {
		return err
	}
	if snap != nil {
		defer snap.close()
	}
	v, err := g.viaConn(c, false)
	if err != nil {
		return err
	}
	v.pre = pre
	if err := g.catchUpTo(ctx, snap, v); err != nil {
		return err
	}
	u := g.beginConfig()
	now := g.ttlClock(time.Now())
	for _, id := range ids {
		if id != c.clientID {
			u.DeleteClient(id, now)
		}
	}
	if err := g.finishConfig(ctx, u, snap, v); err != nil {
		return err
	}
	g.ackDeletes(ids)
	return nil
}

// ackDeletes tells every client of the group which clients are gone.
func (g *group) ackDeletes(ids []string) {
	if len(ids) == 0 {
		return
	}
	b, err := encodeFrame("deleteClients", deletedClients{ClientIDs: ids})
	if err != nil {
		return
	}
	for _, c := range g.conns {
		if c.ready {
			c.enqueue(b)
		}
	}
}

// parseASTs parses the ASTs of a patch's puts, and compiles them against
// the replica when there is one, so that a bad query is refused up front.
func parseASTs(ops []queryPatchOp, snap *snapshot) (map[string]*zql.AST, error) {
	asts := map[string]*zql.AST{}
	for _, op := range ops {
		if op.Op != "put" || len(op.AST) == 0 {
			continue
		}
		ast, err := zql.ParseAST(op.AST)
		if err != nil {
			return nil, newProtocolError(kindInvalidMessage, "query %s: %v", op.Hash, err)
		}
		if snap != nil {
			if _, err := zql.Compile(snap.schema.zql, ast); err != nil {
				return nil, compileError(op.Hash, err)
			}
		}
		asts[op.Hash] = ast
	}
	return asts, nil
}

// compileError is the error frame for a query that does not compile:
// zero-cache's Internal error for one it fails to hydrate (an unknown table
// or column, what its engine refuses), InvalidMessage for a malformed one.
func compileError(hash string, err error) *protocolError {
	var r *zql.Refusal
	if errors.As(err, &r) {
		return newProtocolError(kindInternal, "%s", r.Message)
	}
	return newProtocolError(kindInvalidMessage, "query %s: %v", hash, err)
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// How long, and how often, a connection waits for this replica to reach
// the state its group's CVR was written at (zero-cache: 10 × 500 ms).
const (
	replicaWait = 5 * time.Second
	replicaPoll = 50 * time.Millisecond
)

// openSnapshotAt opens a replica snapshot at state version min or later: a
// CVR written by a view-syncer whose replica was ahead of this one's must
// not be served older rows (docs/protocol.md §11). A snapshot of another
// replica is returned at once, for the caller to reset the group.
func (g *group) openSnapshotAt(ctx context.Context, min string) (*snapshot, error) {
	deadline := time.Now().Add(replicaWait)
	t := time.NewTicker(replicaPoll)
	defer t.Stop()
	for {
		snap, err := g.openSnapshot(ctx)
		if err != nil || snap == nil || snap.version >= min || snap.replicaVersion != g.cvr.ReplicaVersion {
			return snap, err
		}
		snap.close()
		if time.Now().After(deadline) {
			return nil, newProtocolError(kindRehome, "Reconnect required")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
