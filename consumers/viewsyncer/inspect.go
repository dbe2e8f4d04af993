package viewsyncer

import (
	"context"
	"crypto/subtle"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/consumers/zql/permissions"
)

// The inspector protocol: the client's zero.inspector sends ["inspect",
// {op, id, ...}] and waits, without a timeout, for ["inspect", {op, id,
// value}] with the same id. Every op is answered, an unknown one with op
// "error", or the client hangs.

// Inspect ops.
const (
	inspectAuthenticate = "authenticate"
	inspectVersion      = "version"
	inspectQueries      = "queries"
	inspectMetrics      = "metrics"
	inspectAnalyze      = "analyze-query"
)

// inspectBody is the inspect up-message's body; which fields are set
// depends on Op.
type inspectBody struct {
	Op       string          `json:"op"`
	ID       string          `json:"id"`
	ClientID string          `json:"clientID,omitempty"`
	Value    json.RawMessage `json:"value,omitempty"`
	AST      *zql.AST        `json:"ast,omitempty"`
	Name     string          `json:"name,omitempty"`
	Args     json.RawMessage `json:"args,omitempty"`
	Options  *struct {
		SyncedRows bool `json:"syncedRows"`
		VendedRows bool `json:"vendedRows"`
		JoinPlans  bool `json:"joinPlans"`
	} `json:"options,omitempty"`
}

type inspectDown struct {
	Op    string `json:"op"`
	ID    string `json:"id"`
	Value any    `json:"value"`
}

// digestCompression is the compression zero-cache's TDigest reports; the
// client rebuilds its digest from our centroids with it.
const digestCompression = 1000

// maxCentroids bounds a digest's memory: past it, neighbours merge.
const maxCentroids = 200

// digest is a histogram of durations in ms, sent as zero-cache's TDigest
// JSON: [compression, mean, weight, mean, weight, ...].
type digest struct {
	c [][2]float64 // mean, weight; sorted by mean after compact
}

func (d *digest) add(ms float64) {
	d.c = append(d.c, [2]float64{ms, 1})
	if len(d.c) > 2*maxCentroids {
		d.compact()
	}
}

// compact sorts the centroids and merges neighbouring pairs.
func (d *digest) compact() {
	sort.Slice(d.c, func(i, j int) bool { return d.c[i][0] < d.c[j][0] })
	out := d.c[:0]
	for i := 0; i < len(d.c); i += 2 {
		if i+1 == len(d.c) {
			out = append(out, d.c[i])
			break
		}
		a, b := d.c[i], d.c[i+1]
		w := a[1] + b[1]
		out = append(out, [2]float64{(a[0]*a[1] + b[0]*b[1]) / w, w})
	}
	d.c = out
}

func (d *digest) json() []float64 {
	out := make([]float64, 1, 1+2*len(d.c))
	out[0] = digestCompression
	cs := append([][2]float64(nil), d.c...)
	sort.Slice(cs, func(i, j int) bool { return cs[i][0] < cs[j][0] })
	for _, c := range cs {
		out = append(out, c[0], c[1])
	}
	return out
}

// queryTiming is one query's server timings, kept by its group under
// group.mu: zero-cache's per-query inspector metrics.
type queryTiming struct {
	hydrationMs float64
	hydrated    bool
	updates     digest
}

// inspectStats are the server-wide histograms of the metrics op. Its lock
// is a leaf.
type inspectStats struct {
	mu              sync.Mutex
	materialization digest
	update          digest
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// timeHydration records a query's (re)hydration, under g.mu.
func (g *group) timeHydration(hash string, d time.Duration) {
	t := g.timing(hash)
	t.hydrationMs, t.hydrated = ms(d), true
	st := &g.s.inspect
	st.mu.Lock()
	st.materialization.add(ms(d))
	st.mu.Unlock()
}

// timeUpdate records an incremental update of a query, under g.mu.
func (g *group) timeUpdate(hash string, d time.Duration) {
	g.timing(hash).updates.add(ms(d))
	st := &g.s.inspect
	st.mu.Lock()
	st.update.add(ms(d))
	st.mu.Unlock()
}

func (g *group) timing(hash string) *queryTiming {
	if g.timings == nil {
		g.timings = map[string]*queryTiming{}
	}
	t := g.timings[hash]
	if t == nil {
		t = &queryTiming{}
		g.timings[hash] = t
	}
	return t
}

// adminPasswordValid is zero-cache's rule: without a configured password
// only development mode lets in a client that sends none; otherwise the
// password must match.
func (s *Server) adminPasswordValid(password string) bool {
	want := s.cfg.AdminPassword
	if password == "" && want == "" && s.cfg.DevelopmentMode {
		return true
	}
	if want == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(password), []byte(want)) == 1
}

// AdminPasswordValid reports whether password opens the admin surface
// (the inspector, /statz, /heapz) under cfg's settings.
func AdminPasswordValid(cfg Config, password string) bool {
	return (&Server{cfg: cfg}).adminPasswordValid(password)
}

// inspect answers one inspect message. Failures are answered to the
// client, never returned: the connection stays up.
func (g *group) inspect(ctx context.Context, c *conn, b *inspectBody) {
	down := inspectDown{Op: b.Op, ID: b.ID}
	value, err := g.inspectOp(ctx, c, b, &down)
	if err != nil {
		c.log.Warn("inspect", "op", b.Op, "err", err)
		down.Op, value = "error", err.Error()
	}
	down.Value = value
	if f, err := encodeFrame(tagInspect, down); err == nil {
		c.enqueue(f)
	}
}

func (g *group) inspectOp(ctx context.Context, c *conn, b *inspectBody, down *inspectDown) (any, error) {
	unlock := g.lock()
	held := true
	defer func() {
		if held {
			unlock()
		}
	}()
	if b.Op == inspectAuthenticate {
		var password string
		if len(b.Value) > 0 {
			if err := json.Unmarshal(b.Value, &password); err != nil {
				return nil, fmt.Errorf("authenticate: value is not a string")
			}
		}
		g.inspectAuthed = g.s.adminPasswordValid(password)
		down.Op = "authenticated"
		return g.inspectAuthed, nil
	}
	if g.cvr == nil {
		return nil, errors.New("the client group is not loaded")
	}
	if !g.inspectAuthed {
		// zero-cache's challenge: the client asks for the password and
		// retries.
		down.Op = "authenticated"
		return false, nil
	}
	switch b.Op {
	case inspectVersion:
		return g.s.cfg.ServerVersion, nil
	case inspectQueries:
		return g.inspectQueryRows(b.ClientID, c.proto), nil
	case inspectMetrics:
		st := &g.s.inspect
		st.mu.Lock()
		defer st.mu.Unlock()
		return map[string]any{
			"query-materialization-server": st.materialization.json(),
			"query-update-server":          st.update.json(),
		}, nil
	case inspectAnalyze:
		// It may call the API server, and it hydrates on a snapshot of
		// its own: the group's other work does not wait for it.
		authData := g.authData
		held = false
		unlock()
		return g.analyzeQuery(ctx, c, b, authData)
	}
	return nil, fmt.Errorf("unknown inspect op %q", b.Op)
}

// inspectQueryRow is one client's desire for a query, as zero-cache's
// inspector lists it.
type inspectQueryRow struct {
	ClientID      string          `json:"clientID"`
	QueryID       string          `json:"queryID"`
	AST           *zql.AST        `json:"ast"`
	Name          *string         `json:"name"`
	Args          json.RawMessage `json:"args"`
	Got           bool            `json:"got"`
	Deleted       bool            `json:"deleted"`
	TTL           float64         `json:"ttl"`
	InactivatedAt *float64        `json:"inactivatedAt"`
	RowCount      int             `json:"rowCount"`
	Metrics       any             `json:"metrics"`
}

// inspectQueryRows lists the group's live desires (of clientID only, if
// set), ordered by client and query, under g.mu.
func (g *group) inspectQueryRows(clientID string, proto int) []inspectQueryRow {
	clock := g.ttlClock(time.Now())
	rowCounts := map[string]int{}
	for _, r := range g.cvr.Rows {
		for h, n := range r.Refs {
			if n > 0 {
				rowCounts[h]++
			}
		}
	}
	rows := []inspectQueryRow{}
	for _, cid := range sortedKeys(g.cvr.Clients) {
		if clientID != "" && cid != clientID {
			continue
		}
		cl := g.cvr.Clients[cid]
		for _, h := range sortedKeys(cl.Desired) {
			d := cl.Desired[h]
			if d.Expired(clock) {
				continue
			}
			ttl := d.TTL
			if ttl == 0 {
				ttl = cvrstore.DefaultTTL
			}
			row := inspectQueryRow{
				ClientID: cid, QueryID: h, TTL: ms(ttl), Deleted: d.Cleared,
				RowCount: rowCounts[h], Args: json.RawMessage("null"),
			}
			if d.Inactive {
				at := d.InactiveAt
				row.InactivatedAt = &at
			}
			if q := g.cvr.Queries[h]; q != nil {
				row.AST, row.Got = q.AST, q.Got
				if q.Name != "" {
					name := q.Name
					row.Name = &name
					row.AST = nil // a synced query's client AST is unknown
					if len(q.Args) > 0 {
						row.Args = q.Args
					}
				}
			}
			if t := g.timings[h]; t != nil {
				row.Metrics = t.protocolJSON(proto)
			}
			rows = append(rows, row)
		}
	}
	return rows
}

// protocolJSON is the query's metrics in the form the client's protocol
// version reads: v51 changed the hydration time to a plain number.
func (t *queryTiming) protocolJSON(proto int) map[string]any {
	if proto >= 51 {
		m := map[string]any{"query-update-server": t.updates.json()}
		if t.hydrated {
			m["query-hydration-server-ms"] = t.hydrationMs
		}
		return m
	}
	var h digest
	if t.hydrated {
		h.add(t.hydrationMs)
	}
	return map[string]any{
		"query-materialization-server": h.json(),
		"query-update-server":          t.updates.json(),
	}
}

// analyzeResult is zero-cache's AnalyzeQueryResult, as far as jetsync
// has its parts.
type analyzeResult struct {
	Warnings         []string                  `json:"warnings"`
	SyncedRows       map[string][]zql.Row      `json:"syncedRows,omitempty"`
	SyncedRowCount   int                       `json:"syncedRowCount"`
	Start            float64                   `json:"start"`
	End              float64                   `json:"end"`
	Elapsed          float64                   `json:"elapsed"`
	AfterPermissions string                    `json:"afterPermissions,omitempty"`
	SQLitePlans      map[string][]string       `json:"sqlitePlans"`
	ReadRowCount     int                       `json:"readRowCount"`
	ReadRowCounts    map[string]map[string]int `json:"readRowCountsByQuery"`
}

// analyzeQuery runs an AST (the client's, or a named query's as the API
// server transforms it) once on a fresh snapshot, and reports what it
// synced, what it read and SQLite's plan of each read. A legacy AST runs
// with the read rules bound to authData, as its pipeline would. It runs
// without g's lock.
func (g *group) analyzeQuery(ctx context.Context, c *conn, b *inspectBody, authData map[string]any) (any, error) {
	ast := b.AST
	if ast == nil && len(b.Value) > 0 && string(b.Value) != "null" {
		ast = &zql.AST{}
		if err := json.Unmarshal(b.Value, ast); err != nil {
			return nil, fmt.Errorf("analyze-query: bad AST: %v", err)
		}
	}
	legacy := true
	if b.Name != "" && len(b.Args) > 0 {
		t, err := g.transformOne(ctx, c, b.Name, b.Args)
		if err != nil {
			return nil, err
		}
		ast, legacy = t, false
	}
	if ast == nil {
		return nil, errors.New("AST is required for analyze-query operation. Either provide an AST directly or ensure custom query transformation is configured.")
	}
	snap, err := g.openSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	if snap == nil {
		return nil, errors.New("the replica is not ready yet")
	}
	defer snap.close()
	res := &analyzeResult{Warnings: []string{}, SQLitePlans: map[string][]string{}}
	if legacy {
		perms := snap.perms
		if perms == nil {
			res.Warnings = append(res.Warnings, "No permissions loaded; the query ran without read rules.")
			perms = permissions.None
		}
		ast = perms.Transform(ast, authData)
		if j, err := json.Marshal(ast); err == nil {
			res.AfterPermissions = string(j)
		}
	}
	q, err := zql.Compile(snap.schema.zql, ast)
	if err != nil {
		return nil, err
	}
	rec := &recordingQuerier{q: snap.tx, seen: map[string][]any{}}
	start := time.Now()
	out, err := q.Hydrate(ctx, rec)
	elapsed := time.Since(start)
	if err != nil {
		return nil, err
	}
	res.Start = float64(start.UnixMilli())
	res.Elapsed = ms(elapsed)
	res.End = res.Start + res.Elapsed
	res.SyncedRowCount = out.Len()
	res.ReadRowCount = out.RowsRead
	res.ReadRowCounts = map[string]map[string]int{}
	if b.Options != nil && b.Options.SyncedRows {
		res.SyncedRows = out.Rows
	}
	for _, s := range rec.order {
		plan, err := explainPlan(ctx, snap.tx, s, rec.seen[s])
		if err != nil {
			res.Warnings = append(res.Warnings, fmt.Sprintf("no plan for %s: %v", s, err))
			continue
		}
		res.SQLitePlans[s] = plan
	}
	return res, nil
}

// transformOne has the API server transform one named query, with c's
// credentials, as zero-cache's analyze-query does.
func (g *group) transformOne(ctx context.Context, c *conn, name string, args json.RawMessage) (*zql.AST, error) {
	if !g.s.api.QueryConfigured() {
		return nil, errors.New("AST is required for analyze-query operation. Either provide an AST directly or ensure custom query transformation is configured.")
	}
	v, err := g.viaConn(c, false)
	if err != nil {
		return nil, err
	}
	res, err := g.s.api.Transform(ctx, appapi.TransformRequest{
		Conn: v.c.apiConn(v.ac), URL: v.ac.Query.url, Headers: v.ac.Query.headers,
		Queries: []appapi.Query{{ID: "analyze-query", Name: name, Args: args}},
	})
	if err != nil {
		return nil, err
	}
	for _, r := range res.Queries {
		if r.Error != nil {
			return nil, fmt.Errorf("transform %s: %s", name, r.Error.Message)
		}
		if r.AST != nil {
			return r.AST, nil
		}
	}
	return nil, fmt.Errorf("transform %s: no AST in the answer", name)
}

// recordingQuerier notes each distinct statement a hydration runs, with
// its first arguments, so that its plan can be asked for.
type recordingQuerier struct {
	q     zql.Querier
	seen  map[string][]any
	order []string
}

func (r *recordingQuerier) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if _, ok := r.seen[query]; !ok {
		r.seen[query] = args
		r.order = append(r.order, query)
	}
	return r.q.QueryContext(ctx, query, args...)
}

// explainPlan is SQLite's EXPLAIN QUERY PLAN of one statement, one line
// per step, indented by depth.
func explainPlan(ctx context.Context, q zql.Querier, stmt string, args []any) ([]string, error) {
	rows, err := q.QueryContext(ctx, "EXPLAIN QUERY PLAN "+stmt, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	depth := map[int64]int{}
	var lines []string
	for rows.Next() {
		var id, parent, notused int64
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			return nil, err
		}
		d := 0
		if parent != 0 {
			d = depth[parent] + 1
		}
		depth[id] = d
		pad := make([]byte, 2*d)
		for i := range pad {
			pad[i] = ' '
		}
		lines = append(lines, string(pad)+detail)
	}
	return lines, rows.Err()
}
