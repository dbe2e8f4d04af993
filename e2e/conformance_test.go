package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
)

// TestConformance is the differential conformance suite: random ZQL over
// the bench schema (conformance_gen_test.go), materialized through the real
// Zero client against jetsync and zero-cache 1.9.0, both replicating one
// upstream, and compared with Postgres running the same query, first on
// hydration and then after each round of random upstream writes. Postgres
// decides: jetsync differing from it fails the test; zero-cache differing
// from it is logged as a known difference of zero-cache.
//
// Knobs (the defaults are the short run of make test; make conformance
// runs the long one):
//
//	CONFORMANCE_SEEDS=1,2      one subtest per seed, each from scratch
//	CONFORMANCE_QUERIES=36     random queries per seed
//	CONFORMANCE_ROUNDS=6       write rounds per seed
//	CONFORMANCE_ZERO_CACHE=1   also run zero-cache (0: jetsync and Postgres only)
//	CONFORMANCE_ISSUES=200     the bench dataset's size (seed.sh ISSUES)
//	CONFORMANCE_PER_CLIENT=4   queries per client; each client is its own group,
//	                           and holds the rows of all its queries, so fewer
//	                           queries per client let less server error hide
//	CONFORMANCE_QUERY=17       run that one query of the seed only
func TestConformance(t *testing.T) {
	cfg := conformanceConfig(t)
	for _, seed := range cfg.seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runConformance(t, cfg, seed) })
	}
}

type cfConfig struct {
	seeds                              []uint64
	queries, rounds, issues, perClient int
	zeroCache                          bool
	only                               int
}

func conformanceConfig(t *testing.T) cfConfig {
	num := func(key string, def int) int {
		v := os.Getenv(key)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", key, v, err)
		}
		return n
	}
	cfg := cfConfig{
		queries:   num("CONFORMANCE_QUERIES", 36),
		rounds:    num("CONFORMANCE_ROUNDS", 6),
		issues:    num("CONFORMANCE_ISSUES", 200),
		perClient: max(1, num("CONFORMANCE_PER_CLIENT", 4)),
		zeroCache: num("CONFORMANCE_ZERO_CACHE", 1) != 0,
		only:      num("CONFORMANCE_QUERY", -1),
	}
	seeds := os.Getenv("CONFORMANCE_SEEDS")
	if seeds == "" {
		seeds = "1"
	}
	for _, s := range strings.Split(seeds, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			t.Fatalf("CONFORMANCE_SEEDS=%q: %v", seeds, err)
		}
		cfg.seeds = append(cfg.seeds, n)
	}
	return cfg
}

// cfRefApp is zero-cache's app ID: its own slot and schemas, so that it
// replicates the same upstream as jetsync (zeroAppID) side by side.
const cfRefApp = "zcref"

// cfServer is a sync server under comparison, with the real clients that
// hold the queries' views.
type cfServer struct {
	name    string
	srv     *syncServer
	d       *zeroDriver
	clients []string
	// client of each query index.
	clientOf map[int]string
	// clientIDs are the Zero client IDs of the clients, by name; lost
	// holds those that failed to apply a poke, with the round.
	clientIDs map[string]string
	lost      map[string]int
	// peer is zero-cache's side when jetsync's runs beside it: their
	// clients of the same name hold the same queries.
	peer *cfServer
}

// pokeFailed reports whether client c failed to apply a poke.
func (s *cfServer) pokeFailed(c string) bool {
	return strings.Contains(s.d.p.stderr.String(), "clientID="+s.clientIDs[c]+" PokeHandler clearing due to unexpected poke error")
}

// checkLost looks for clients that failed to apply a poke: the 1.9.0
// client then drops its connection and retries forever. For jetsync that
// fails the test; a zero-cache client is left out from then on, and the
// caller records its queries.
func (s *cfServer) checkLost(t *testing.T, round int, queries []*cfQuery) {
	t.Helper()
	for _, c := range s.clients {
		if _, ok := s.lost[c]; ok || !s.pokeFailed(c) {
			continue
		}
		var held []string
		for i, name := range s.clientOf {
			if name == c {
				held = append(held, fmt.Sprintf("query %d: %s", i, queries[i].zql()))
			}
		}
		sort.Strings(held)
		if s.name == "jetsync" && s.peer != nil && s.peer.pokeFailed(c) {
			// The client fails the same way with zero-cache: its own bug.
			s.lost[c], s.peer.lost[c] = round, round
			t.Logf("the 1.9.0 client fails to apply a poke with jetsync (by round %d) and with zero-cache alike; client %s is left out on both; it holds:\n%s", round, c, strings.Join(held, "\n"))
			continue
		}
		if s.name == "jetsync" {
			t.Fatalf("jetsync: client %s failed to apply a poke by round %d (driver.mjs stderr has the client's error; if zero-cache's client of the same queries fails too, the shape belongs in the generator's exclusions); it holds:\n%s", c, round, strings.Join(held, "\n"))
		}
		s.lost[c] = round
		t.Logf("%s: client %s failed to apply a poke by round %d and is left out; it holds:\n%s", s.name, c, round, strings.Join(held, "\n"))
	}
}

// cfMismatch is a view that differs from Postgres.
type cfMismatch struct {
	q          int
	want, got  any
	incomplete bool
}

func runConformance(t *testing.T, cfg cfConfig, seed uint64) {
	began := time.Now()
	node := nodeBin(t)
	bin := pgBin(t)
	upstream := pgtest.NewDB(t, pgtest.Start(t))
	seedBench(t, bin, upstream, cfg.issues)
	deployPermissions(t, node, upstream, "app/schema.mjs")
	if cfg.zeroCache {
		deployAppPermissions(t, node, upstream, cfRefApp, "app/schema.mjs")
	}
	ctx := context.Background()
	pg, err := pgx.Connect(ctx, upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	cfExec(t, pg, fmt.Sprintf(`INSERT INTO "user" (id, name) VALUES (%s, 'round 0')`, sqlStr(cfMarker)))

	// The queries, with literals and start rows from the seeded data.
	data := cfData{}
	for name := range cfTables {
		var rows []map[string]any
		if err := json.Unmarshal(cfAnswer(t, pg, &cfQuery{table: name, limit: -1}), &rows); err != nil {
			t.Fatal(err)
		}
		data[name] = rows
	}
	gen := &cfGen{r: rand.New(rand.NewPCG(seed, 0x5eed)), data: data}
	queries := make([]*cfQuery, cfg.queries)
	for i := range queries {
		queries[i] = gen.query()
	}
	var ids []int
	for i, q := range queries {
		if cfg.only >= 0 && cfg.only != i {
			continue
		}
		if why := q.clientBreaks(); why != "" {
			t.Logf("query %d left out (%s: the 1.9.0 client fails on it with either server): %s", i, why, q.zql())
			continue
		}
		ids = append(ids, i)
	}
	// A query Postgres refuses is the generator's bug, not the servers'.
	for _, i := range ids {
		cfAnswer(t, pg, queries[i])
	}

	var servers []*cfServer
	servers = append(servers, &cfServer{name: "jetsync", srv: startJetsyncSyncer(t, upstream)})
	if cfg.zeroCache {
		servers = append(servers, &cfServer{name: "zero-cache", srv: startZeroCacheApp(t, upstream, cfRefApp)})
	}
	for _, s := range servers {
		s.open(t, node, queries, ids, cfg.perClient)
	}
	if len(servers) == 2 {
		servers[0].peer = servers[1]
	}
	t.Logf("seed %d: %d queries on %d clients per server, ready after %v", seed, len(ids), len(servers[0].clients), time.Since(began).Round(time.Millisecond))

	// zcDiffers records the queries where zero-cache and Postgres disagree,
	// with the rounds that showed it: a stale row stays, a late one would
	// not.
	zcDiffers := map[int][]int{}
	writer := &cfWriter{r: rand.New(rand.NewPCG(seed, 0x5717e5)), seed: seed}
	var roundSQL [][]string
	for round := 0; round <= cfg.rounds; round++ {
		if round > 0 {
			roundSQL = writer.round(cfReadState(t, pg))
			for _, tx := range roundSQL {
				cfExec(t, pg, "BEGIN; "+strings.Join(tx, "; ")+"; COMMIT")
			}
			cfExec(t, pg, fmt.Sprintf(`UPDATE "user" SET name = 'round %d' WHERE id = %s`, round, sqlStr(cfMarker)))
		}
		want := map[int]any{}
		for _, i := range ids {
			want[i] = cfNormalize(queries[i], decodeJSON(t, cfAnswer(t, pg, queries[i])))
		}
		for _, s := range servers {
			s.waitRound(t, round, queries)
			grace := 10 * time.Second
			if s.name == "zero-cache" {
				grace = time.Second
			}
			bad := s.compare(t, round, queries, ids, want, grace)
			if s.name == "zero-cache" {
				for i, c := range s.clientOf {
					if _, lost := s.lost[c]; lost {
						zcDiffers[i] = append(zcDiffers[i], round)
					}
				}
				for _, m := range bad {
					if _, seen := zcDiffers[m.q]; !seen {
						t.Logf("zero-cache differs from Postgres: seed %d query %d round %d: %s\nwrites of the round:\n%s\n%s", seed, m.q, round, queries[m.q].zql(), cfWrites(roundSQL), cfDiff(m))
					}
					zcDiffers[m.q] = append(zcDiffers[m.q], round)
				}
				continue
			}
			for _, m := range bad {
				t.Errorf("jetsync differs from Postgres: seed %d, query %d, round %d (0: hydration)\nquery: %s\ndriver form: %s\nwrites of the round:\n%s\n%s\npostgres: %s\njetsync:  %s",
					seed, m.q, round, queries[m.q].zql(), cfJSON(queries[m.q].driverJSON(true)), cfWrites(roundSQL), cfDiff(m), cfJSON(m.want), cfJSON(m.got))
			}
			if len(bad) > 0 {
				t.Logf("reproduce: CONFORMANCE_SEEDS=%d CONFORMANCE_QUERIES=%d CONFORMANCE_ROUNDS=%d CONFORMANCE_ISSUES=%d CONFORMANCE_ZERO_CACHE=0 go test -count=1 -run 'TestConformance' ./e2e/ (add CONFORMANCE_QUERY=%d for the one query)",
					seed, cfg.queries, round, cfg.issues, bad[0].q)
				s.minimize(t, pg, queries[bad[0].q])
				t.FailNow()
			}
		}
	}
	var zc []int
	for q := range zcDiffers {
		zc = append(zc, q)
	}
	sort.Ints(zc)
	for _, q := range zc {
		r := zcDiffers[q]
		t.Logf("zero-cache 1.9.0 differs from Postgres on query %d in %d rounds (%d to %d of %d): %s", q, len(r), r[0], r[len(r)-1], cfg.rounds, queries[q].zql())
	}
	t.Logf("seed %d: %d queries x %d rounds agree with Postgres on jetsync; zero-cache differs on %d; %v",
		seed, len(ids), cfg.rounds, len(zc), time.Since(began).Round(time.Millisecond))
}

func cfExec(t *testing.T, pg *pgx.Conn, sql string) {
	t.Helper()
	if _, err := pg.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// cfAnswer is q's view as Postgres computes it.
func cfAnswer(t *testing.T, pg *pgx.Conn, q *cfQuery) json.RawMessage {
	t.Helper()
	var out []byte
	if err := pg.QueryRow(context.Background(), q.sql()).Scan(&out); err != nil {
		t.Fatalf("postgres refuses the translation of %s: %v\n%s", q.zql(), err, q.sql())
	}
	if out == nil {
		return json.RawMessage("null")
	}
	return out
}

// cfReadState lists the keys the writer picks from, in key order.
func cfReadState(t *testing.T, pg *pgx.Conn) *cfState {
	t.Helper()
	ctx := context.Background()
	list := func(sql string) []string {
		rows, err := pg.Query(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	s := &cfState{
		users:    list(`SELECT id FROM "user" WHERE id <> ` + sqlStr(cfMarker) + ` ORDER BY id COLLATE "C"`),
		issues:   list(`SELECT id FROM issue ORDER BY id COLLATE "C"`),
		comments: list(`SELECT id FROM comment ORDER BY id COLLATE "C"`),
		labels:   list(`SELECT id FROM label ORDER BY id COLLATE "C"`),
	}
	for _, il := range list(`SELECT issue_id || ' ' || label_id FROM issue_label ORDER BY issue_id COLLATE "C", label_id COLLATE "C"`) {
		a, b, _ := strings.Cut(il, " ")
		s.issueLabels = append(s.issueLabels, [2]string{a, b})
	}
	return s
}

// open starts a driver with clients holding the queries, perClient each,
// and a marker view on every client.
func (s *cfServer) open(t *testing.T, node string, queries []*cfQuery, ids []int, perClient int) {
	t.Helper()
	s.d = startDriver(t, node)
	s.clientOf, s.clientIDs, s.lost = map[int]string{}, map[string]string{}, map[string]int{}
	for n := 0; n*perClient < len(ids); n++ {
		name := fmt.Sprintf("c%d", n)
		s.clients = append(s.clients, name)
		ack := s.d.open(t, name, s.srv.url, "u000001", signToken(t, zeroSecret, "u000001", 24*time.Hour), "conformance-"+name)
		s.clientIDs[name] = ack.ClientID
		s.d.do(t, map[string]any{"cmd": "query", "client": name, "id": "marker", "quiet": true,
			"table": "user", "where": []any{"id", "=", cfMarker}, "one": true})
		for _, i := range ids[n*perClient : min(len(ids), (n+1)*perClient)] {
			s.clientOf[i] = name
			cmd := queries[i].driverJSON(true)
			cmd["cmd"], cmd["client"], cmd["id"], cmd["quiet"] = "query", name, "q"+strconv.Itoa(i), true
			s.d.do(t, cmd)
		}
	}
}

// views asks the driver for a client's views (ids, or all when nil).
func (d *zeroDriver) views(t *testing.T, client string, ids ...string) map[string]driverView {
	t.Helper()
	d.seq++
	seq := d.seq
	cmd := map[string]any{"cmd": "views", "client": client, "seq": seq}
	if ids != nil {
		cmd["ids"] = ids
	}
	line, err := json.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.stdin.Write(append(line, '\n')); err != nil {
		t.Fatalf("driver: %v", err)
	}
	var ev driverEvent
	polltest.Until(t, 60*time.Second, "the driver's views of "+client, func() bool {
		if d.p.exited() {
			t.Fatalf("driver exited (%v):\n%s", d.p.err, d.p.stderr.String())
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		var ok bool
		if ev, ok = d.replies[seq]; ok {
			delete(d.replies, seq)
		}
		return ok
	})
	if ev.Event == "error" {
		t.Fatalf("driver views %s: %s", client, ev.Error)
	}
	return ev.Views
}

// waitRound waits until every client shows the marker of round: the
// server has sent it everything written before.
func (s *cfServer) waitRound(t *testing.T, round int, queries []*cfQuery) {
	t.Helper()
	want := fmt.Sprintf(`{"id":%q,"name":"round %d"}`, cfMarker, round)
	for _, c := range s.clients {
		if _, ok := s.lost[c]; ok {
			continue
		}
		var last driverView
		deadline := time.Now().Add(120 * time.Second)
		for {
			last = s.d.views(t, c, "marker")["marker"]
			if last.Complete && cmp.Equal(decodeJSON(t, json.RawMessage(want)), decodeJSON(t, cfOrNull(last.Rows))) {
				break
			}
			s.checkLost(t, round, queries)
			if _, ok := s.lost[c]; ok {
				break
			}
			if time.Now().After(deadline) {
				if s.name == "jetsync" {
					t.Fatalf("%s client %s: no marker of round %d after 120s (last %s, complete %v)", s.name, c, round, last.Rows, last.Complete)
				}
				t.Logf("%s client %s: no marker of round %d after 120s (last %s, complete %v); it is left out", s.name, c, round, last.Rows, last.Complete)
				s.lost[c] = round
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// compare returns the views that still differ from want after grace, or
// are still incomplete after two minutes (hydration on a loaded machine).
func (s *cfServer) compare(t *testing.T, round int, queries []*cfQuery, ids []int, want map[int]any, grace time.Duration) []cfMismatch {
	t.Helper()
	deadline := time.Now().Add(grace)
	hydrated := time.Now().Add(2 * time.Minute)
	for {
		var bad []cfMismatch
		s.checkLost(t, round, queries)
		for _, c := range s.clients {
			if _, ok := s.lost[c]; ok {
				continue
			}
			views := s.d.views(t, c)
			for _, i := range ids {
				if s.clientOf[i] != c {
					continue
				}
				v := views["q"+strconv.Itoa(i)]
				got := cfNormalize(queries[i], decodeJSON(t, cfOrNull(v.Rows)))
				if !v.Complete || !cmp.Equal(want[i], got) {
					bad = append(bad, cfMismatch{q: i, want: want[i], got: got, incomplete: !v.Complete})
				}
			}
		}
		incomplete := slices.ContainsFunc(bad, func(m cfMismatch) bool { return m.incomplete })
		if len(bad) == 0 || time.Now().After(deadline) && (!incomplete || time.Now().After(hydrated)) {
			return bad
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func cfOrNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

// cfNormalize makes a view comparable: the client leaves a singular
// relationship with no row out of its parent, where Postgres has null.
func cfNormalize(q *cfQuery, v any) any {
	switch v := v.(type) {
	case []any:
		for _, e := range v {
			cfNormalize(q, e)
		}
	case map[string]any:
		for _, r := range q.related {
			if r.q.singular && v[r.name] == nil {
				delete(v, r.name)
			} else if x, ok := v[r.name]; ok {
				cfNormalize(r.q, x)
			}
		}
	}
	return v
}

func cfDiff(m cfMismatch) string {
	if m.incomplete {
		return "(the view is not complete)\n-postgres +server:\n" + cmp.Diff(m.want, m.got)
	}
	return "-postgres +server:\n" + cmp.Diff(m.want, m.got)
}

func cfJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 4000 {
		return string(b[:4000]) + "..."
	}
	return string(b)
}

func cfWrites(txs [][]string) string {
	if txs == nil {
		return "  (none: first hydration)"
	}
	var b strings.Builder
	for _, tx := range txs {
		b.WriteString("  BEGIN; " + strings.Join(tx, "; ") + "; COMMIT\n")
	}
	return b.String()
}

// minimize looks for a smaller query that the server also answers wrongly
// when it hydrates it now, on a client of its own.
func (s *cfServer) minimize(t *testing.T, pg *pgx.Conn, q *cfQuery) {
	t.Helper()
	client := "minimize"
	s.d.open(t, client, s.srv.url, "u000001", signToken(t, zeroSecret, "u000001", 24*time.Hour), "conformance-"+client)
	n := 0
	fails := func(q *cfQuery) bool {
		n++
		id := "m" + strconv.Itoa(n)
		cmd := q.driverJSON(true)
		cmd["cmd"], cmd["client"], cmd["id"], cmd["quiet"] = "query", client, id, true
		s.d.do(t, cmd)
		want := cfNormalize(q, decodeJSON(t, cfAnswer(t, pg, q)))
		deadline := time.Now().Add(15 * time.Second)
		for {
			v := s.d.views(t, client, id)[id]
			if v.Complete && cmp.Equal(want, cfNormalize(q, decodeJSON(t, cfOrNull(v.Rows)))) {
				s.d.do(t, map[string]any{"cmd": "unquery", "client": client, "id": id})
				return false
			}
			if time.Now().After(deadline) {
				s.d.do(t, map[string]any{"cmd": "unquery", "client": client, "id": id})
				return true
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !fails(q) {
		t.Logf("minimize: the same query hydrated now on a new client agrees with Postgres: the bug is in the incremental path")
		return
	}
	for changed := true; changed; {
		changed = false
		for _, c := range cfShrink(q) {
			if fails(c) {
				q, changed = c, true
				break
			}
		}
	}
	t.Logf("minimize: smallest query %s hydrates wrongly now too:\n%s\npostgres: %s", s.name, q.zql(), cfJSON(decodeJSON(t, cfAnswer(t, pg, q))))
}

// cfShrink returns smaller variants of q: a part left out or a condition
// replaced by one of its own.
func cfShrink(q *cfQuery) []*cfQuery {
	var out []*cfQuery
	clone := func() *cfQuery { c := *q; return &c }
	for i := range q.related {
		c := clone()
		c.related = append(append([]cfRelated(nil), q.related[:i]...), q.related[i+1:]...)
		out = append(out, c)
		for _, sub := range cfShrink(q.related[i].q) {
			c := clone()
			c.related = append([]cfRelated(nil), q.related...)
			c.related[i] = cfRelated{q.related[i].name, sub}
			out = append(out, c)
		}
	}
	if q.start != nil {
		c := clone()
		c.start = nil
		out = append(out, c)
	}
	if q.limit >= 0 && !q.one {
		c := clone()
		c.limit = -1
		out = append(out, c)
	}
	if len(q.orderBy) > 0 {
		c := clone()
		c.orderBy = q.orderBy[:len(q.orderBy)-1]
		out = append(out, c)
	}
	if q.where != nil {
		c := clone()
		c.where = nil
		out = append(out, c)
		for _, w := range q.where.subs {
			c := clone()
			c.where = w
			out = append(out, c)
		}
		if q.where.op == "exists" && q.where.q != nil {
			for _, sub := range cfShrink(q.where.q) {
				c := clone()
				w := *q.where
				sub.singular = false
				w.q = sub
				c.where = &w
				out = append(out, c)
			}
		}
	}
	return out
}
