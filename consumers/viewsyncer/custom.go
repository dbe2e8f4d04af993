package viewsyncer

import (
	"context"
	"errors"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/auth"
	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/internal/logkey"
)

// via is the connection whose credentials transform the group's synced
// queries (docs/protocol.md §14): all of them (initConnection, updateAuth,
// the background retransform), or only those without a pipeline.
type via struct {
	c   *conn
	ac  authConn
	all bool
	// pre, if not nil, is a transform made without the group's lock,
	// which transform uses in place of calling the API server.
	pre *prefetch
}

// viaConn is c's current record, for a config change c asked for.
func (g *group) viaConn(c *conn, all bool) (*via, error) {
	ac, err := g.cc.MustConn(c.selector())
	if err != nil {
		return nil, err
	}
	return &via{c: c, ac: ac, all: all}, nil
}

// syncVia transforms the synced queries through v, then syncs the group at
// snap. It returns the validation an uncached transform response gave, nil
// when there was none. A failed transform leaves the group as it was: its
// error (a *appapi.Failure) is for v's client, not the group's.
func (g *group) syncVia(ctx context.Context, snap *snapshot, v *via) (*auth.Validation, error) {
	val, err := g.transform(ctx, v, g.ttlClock(time.Now()))
	if err != nil {
		return nil, err
	}
	if err := g.checkTransformed(snap); err != nil {
		return nil, err
	}
	return val, g.syncAt(ctx, snap)
}

// checkTransformed fails a synced query about to be hydrated whose AST,
// as the API server gave it, does not compile on snap: zero-cache fails
// its hydration, and the connection that asked, with an Internal error.
// Without this the query would never be got, and its client would wait.
func (g *group) checkTransformed(snap *snapshot) error {
	if snap == nil {
		return nil
	}
	for _, h := range sortedKeys(g.cvr.Queries) {
		q := g.cvr.Queries[h]
		if _, ok := g.pipelines[h]; ok || q.Name == "" || q.AST == nil {
			continue
		}
		if _, err := zql.Compile(snap.schema.zql, q.AST); err != nil {
			g.log.Warn("synced query does not compile", logkey.Query, h, "name", q.Name, "err", err)
			return compileError(h, err)
		}
	}
	return nil
}

// transform resolves the group's synced queries through the query endpoint
// with v's credentials, as zero-cache's #syncQueryPipelineSet does: an AST
// replaces the query's, a per-query error removes the query's pipeline
// (on the next sync) and goes to the clients that want it as transformError.
// The API server is called under g's lock only when v.pre, the answer
// asked for before the lock was taken, does not cover the request.
func (g *group) transform(ctx context.Context, v *via, clock float64) (*auth.Validation, error) {
	req, ok := g.transformRequest(v, clock)
	if !ok {
		return nil, nil
	}
	res, ok, err := v.pre.answer(v.ac, req)
	if !ok {
		res, err = g.callTransform(ctx, req)
	}
	if err != nil {
		return nil, err
	}
	return g.applyTransform(res), nil
}

// prefetch is the transform a connection's config change needs, made
// before the change takes the group's lock (prefetchTransform): the
// locked work then uses its answer, and the API server is called under
// the lock only for a query the prefetch did not cover, or when the
// connection's credentials changed meanwhile.
type prefetch struct {
	sel      auth.Selector
	revision int
	ids      map[string]bool
	res      appapi.TransformResult
	err      error
	used     bool
}

// answer is p's answer to req, made with ac's credentials; false when p
// does not cover it. A second answer is marked cached, as the API client's
// cache would answer a repeated request: it validates nothing.
func (p *prefetch) answer(ac authConn, req appapi.TransformRequest) (appapi.TransformResult, bool, error) {
	if p == nil || p.sel != ac.Selector || p.revision != ac.Revision {
		return appapi.TransformResult{}, false, nil
	}
	want := map[string]bool{}
	for _, q := range req.Queries {
		if !p.ids[q.ID] {
			return appapi.TransformResult{}, false, nil
		}
		want[q.ID] = true
	}
	if p.err != nil {
		return appapi.TransformResult{}, true, p.err
	}
	res := appapi.TransformResult{Cached: p.used || p.res.Cached, Validation: p.res.Validation}
	for _, r := range p.res.Queries {
		if want[r.ID] {
			res.Queries = append(res.Queries, r)
		}
	}
	p.used = true
	return res, true, nil
}

// prefetchTransform transforms, without g's lock, what a config change of
// c adding ops would transform under it: the synced queries waiting for
// their AST and the patch's new synced queries. nil when there is nothing
// to transform or c is not ready, and without a replica, which config
// changes wait for before they transform.
func (g *group) prefetchTransform(ctx context.Context, c *conn, ops []queryPatchOp) *prefetch {
	if !g.s.api.QueryConfigured() || g.s.cfg.Replica.State().Watermark == "" {
		return nil
	}
	unlock := g.lock()
	if !g.current(c) || !c.ready || g.unloaded {
		unlock()
		return nil
	}
	v, err := g.viaConn(c, false)
	if err != nil || g.tooManyQueries(c.clientID, ops, g.ttlClock(time.Now())) {
		// A patch the bound refuses is not sent to the API server.
		unlock()
		return nil
	}
	qs := g.transformQueries(v, g.ttlClock(time.Now()))
	ids := map[string]bool{}
	for _, q := range qs {
		ids[q.ID] = true
	}
	for _, op := range ops {
		if op.Op != "put" || op.Name == nil || len(op.AST) != 0 || ids[op.Hash] {
			continue
		}
		if q := g.cvr.Queries[op.Hash]; q != nil && q.AST != nil {
			if _, ok := g.pipelines[op.Hash]; ok {
				continue
			}
		}
		ids[op.Hash] = true
		qs = append(qs, appapi.Query{ID: op.Hash, Name: *op.Name, Args: op.Args})
	}
	unlock()
	if len(qs) == 0 {
		return nil
	}
	res, err := g.callTransform(ctx, appapi.TransformRequest{
		Conn: c.apiConn(v.ac), URL: v.ac.Query.url, Headers: v.ac.Query.headers, Queries: qs,
	})
	return &prefetch{sel: v.ac.Selector, revision: v.ac.Revision, ids: ids, res: res, err: err}
}

// transformRequest is the request that transforms the group's synced
// queries with v's credentials; false when there is nothing to ask. g's
// lock is held.
func (g *group) transformRequest(v *via, clock float64) (appapi.TransformRequest, bool) {
	if v == nil {
		return appapi.TransformRequest{}, false
	}
	qs := g.transformQueries(v, clock)
	if len(qs) == 0 {
		return appapi.TransformRequest{}, false
	}
	if !g.s.api.QueryConfigured() {
		g.log.Warn("Custom/named queries were requested but no `ZERO_QUERY_URL` is configured for Zero Cache.")
		return appapi.TransformRequest{}, false
	}
	return appapi.TransformRequest{
		Conn: v.c.apiConn(v.ac), URL: v.ac.Query.url, Headers: v.ac.Query.headers, Queries: qs,
	}, true
}

// transformQueries are the synced queries a transform through v sends:
// all the live ones, or (!v.all) those without a pipeline. g's lock is
// held.
func (g *group) transformQueries(v *via, clock float64) []appapi.Query {
	var qs []appapi.Query
	for _, h := range sortedKeys(g.cvr.Queries) {
		q := g.cvr.Queries[h]
		if q.Name == "" || g.queryExpired(h, clock) {
			continue
		}
		if _, ok := g.pipelines[h]; ok && q.AST != nil && !v.all {
			continue
		}
		qs = append(qs, appapi.Query{ID: h, Name: q.Name, Args: q.Args})
	}
	return qs
}

// callTransform sends req to the query endpoint; it reads nothing of g.
func (g *group) callTransform(ctx context.Context, req appapi.TransformRequest) (appapi.TransformResult, error) {
	m := g.s.metrics
	start := time.Now()
	res, err := g.s.api.Transform(ctx, req)
	m.transformTime.Observe(time.Since(start).Seconds())
	if err != nil {
		m.transformations.WithLabelValues("error").Inc()
		return res, err
	}
	m.transformations.WithLabelValues("success").Inc()
	return res, nil
}

// applyTransform records a transform's ASTs and per-query errors in the
// CVR, skipping the queries that left it meanwhile, and returns the
// validation an uncached response gave. g's lock is held.
func (g *group) applyTransform(res appapi.TransformResult) *auth.Validation {
	m := g.s.metrics
	byClient := map[string][]*appapi.QueryError{}
	for _, r := range res.Queries {
		q := g.cvr.Queries[r.ID]
		if q == nil || q.Name == "" {
			continue
		}
		if r.Error != nil {
			g.log.Warn("Error transforming custom query "+q.Name+": "+r.Error.Kind, logkey.Query, r.ID, "message", r.Error.Message)
			g.cvr.Refused(r.ID, r.Error)
			for id, cr := range g.cvr.Clients {
				if _, ok := cr.Desired[r.ID]; ok {
					byClient[id] = append(byClient[id], r.Error)
				}
			}
			continue
		}
		if q.TransformationHash != "" {
			if q.TransformationHash != r.TransformationHash {
				g.log.Info("query transformation changed", logkey.Query, r.ID, "from", q.TransformationHash, "to", r.TransformationHash)
				m.transformHashChanges.Inc()
			} else {
				m.transformNoOps.Inc()
			}
		}
		g.cvr.Transformed(r.ID, r.AST, r.TransformationHash)
	}
	for id, errs := range byClient {
		if c := g.conns[id]; c != nil && c.ready {
			if b, err := encodeFrame("transformError", errs); err == nil {
				c.enqueue(b)
			}
		}
	}
	if res.Cached {
		return nil
	}
	val := validation(res.Validation)
	return &val
}

// syncTransformed is syncVia with the transform already made, without
// g's lock: res, if not nil, is applied, then the group syncs at snap.
// g's lock is held.
func (g *group) syncTransformed(ctx context.Context, snap *snapshot, res *appapi.TransformResult) (*auth.Validation, error) {
	var val *auth.Validation
	if res != nil {
		val = g.applyTransform(*res)
	}
	if err := g.checkTransformed(snap); err != nil {
		return nil, err
	}
	return val, g.syncAt(ctx, snap)
}

// validateVia records the validation a transform through v gave. A
// refusal (another user than the group's) fails v's connection.
func (g *group) validateVia(v *via, val *auth.Validation) error {
	if v == nil || val == nil {
		return nil
	}
	if _, _, err := g.cc.Validate(v.ac.Selector, v.ac.Revision, *val); err != nil {
		g.cc.Fail(v.ac.Selector, v.ac.Revision)
		return err
	}
	return nil
}

// errorFrame is the error frame for err and the close code after it: a
// protocol error as it is, an API server failure as TransformFailed or
// PushFailed, a connection context refusal as its kind.
func errorFrame(err error) (body any, code int, message string) {
	var perr *protocolError
	if errors.As(err, &perr) {
		return perr, perr.closeCode, perr.Message
	}
	var f *appapi.Failure
	if errors.As(err, &f) {
		code := closeNormal
		if f.Auth() {
			code = closeAuth
		}
		return f, code, f.Message
	}
	var ce *auth.Error
	if errors.As(err, &ce) {
		if ce.Kind == auth.KindUnauthorized {
			return authError(ce.Kind, ce.Message), closeAuth, ce.Message
		}
		p := newProtocolError(ce.Kind, "%s", ce.Message)
		return p, p.closeCode, p.Message
	}
	p := newProtocolError(kindInternal, "%v", err)
	return p, p.closeCode, p.Message
}

// failErr sends err's error frame and closes.
func (c *conn) failErr(err error) {
	body, code, msg := errorFrame(err)
	c.log.Debug("closing with error", "err", err)
	if b, e := encodeFrame("error", body); e == nil {
		c.enqueue(b)
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	c.setClosingLocked(code, msg)
}
