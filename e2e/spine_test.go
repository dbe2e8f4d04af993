package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/producers/pgrepl"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// The spine tests run the change-streamer and a replica consumer in this
// process, against a real Postgres and a real embedded nats-server, so that
// they can watch the changed-rows subscription as well as the stream and the
// replica file.

const spineSchema = `
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'ünïcode');
CREATE TABLE every (
	id int8 PRIMARY KEY,
	i2 int2, i4 int4, i8 int8, f4 float4, f8 float8, num numeric, b bool,
	t text, vc varchar(40), bp char(4), u uuid, j json, jb jsonb,
	d date, tm time, tz timetz, ts timestamp, tstz timestamptz,
	e mood, ai int4[], at text[], ea mood[]
);
CREATE TABLE pair (a text, b int4, v text, PRIMARY KEY (a, b));
CREATE TABLE txlog (n int8 PRIMARY KEY, client int4 NOT NULL, seq int4 NOT NULL);
`

// everyCols lists every's columns with the Postgres expression that yields
// what the replica stores for them (docs/replica.md §4), so that Postgres
// itself, not jetsync's converters, says what the replica must hold.
var everyCols = []struct{ name, expr string }{
	{"id", "id"}, {"i2", "i2"}, {"i4", "i4"}, {"i8", "i8"},
	{"f4", "f4::text::float8"}, {"f8", "f8"}, {"num", "num::float8"},
	{"b", "b::int"}, {"t", "t"}, {"vc", "vc"}, {"bp", "bpcharout(bp)::text"}, {"u", "u::text"},
	{"j", "j::text"}, {"jb", "jb::text"},
	{"d", "extract(epoch from d) * 1000"},
	{"tm", "floor(extract(epoch from tm) * 1000)"},
	{"tz", "mod(floor(extract(epoch from tz) * 1000)::numeric + 86400000, 86400000)"},
	{"ts", "extract(epoch from ts) * 1000"}, {"tstz", "extract(epoch from tstz) * 1000"},
	{"e", "e::text"}, {"ai", "to_json(ai)::text"}, {"at", "to_json(at)::text"}, {"ea", "to_json(ea)::text"},
}

// jsonCols hold JSON text: compared parsed, since Postgres's to_json spacing
// is not the array literal jetsync writes.
var jsonCols = map[string]bool{"j": true, "jb": true, "ai": true, "at": true, "ea": true}

type spine struct {
	t     *testing.T
	pg    *pgx.Conn
	url   string
	js    jetstream.JetStream
	shard streams.Shard
	file  string
	rep   *replicator.Consumer
	stop  func()
	nats  string // client URL of the NATS server
}

// newSpine sets up a fresh upstream database, loaded with setupSQL, and a
// NATS server, and runs nothing: tests start the parts they need, in this
// process or as binaries.
func newSpine(t *testing.T, setupSQL string) *spine {
	t.Helper()
	pgBin(t)
	c := pgtest.Start(t)
	url := pgtest.NewDB(t, c)
	ctx := context.Background()
	pg, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	if _, err := pg.Exec(ctx, setupSQL); err != nil {
		t.Fatalf("setup: %v", err)
	}
	ns := natstest.Start(t)
	_, js := natstest.Connect(t, ns)
	return &spine{t: t, pg: pg, url: url, js: js, shard: streams.Shard{App: "zero", Num: 0}, file: filepath.Join(t.TempDir(), "replica.db"), nats: ns.ClientURL()}
}

// startSpine is newSpine with the change-streamer and a replica consumer
// running in this process.
func startSpine(t *testing.T, setupSQL string) *spine {
	t.Helper()
	s := newSpine(t, setupSQL)
	s.startProducer()
	s.startReplica()
	return s
}

func (s *spine) startProducer() {
	src, err := pgrepl.New(pgrepl.Config{UpstreamURL: s.url, Shard: s.shard, Stream: streams.Config{Shard: s.shard}}, s.js)
	if err != nil {
		s.t.Fatal(err)
	}
	s.run("producer", src.Run)
}

func (s *spine) startReplica() {
	rep, err := replicator.New(replicator.Config{File: s.file, Shard: s.shard, TaskID: "spine"}, s.js)
	if err != nil {
		s.t.Fatal(err)
	}
	s.rep = rep
	s.stop = s.run("replica", rep.Run)
}

// run runs f until the test ends, or until the returned stop is called.
func (s *spine) run(name string, f func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f(ctx); err != nil {
			s.t.Errorf("%s: %v", name, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	s.t.Cleanup(stop)
	return stop
}

// waitCaughtUp waits until the replica holds everything Postgres committed
// so far. Every transaction writes a txlog row, so it commits one more and
// waits for the replica's txlog to hold as many rows as Postgres's.
func (s *spine) waitCaughtUp(timeout time.Duration) {
	s.t.Helper()
	if _, err := s.pg.Exec(context.Background(), `INSERT INTO txlog VALUES (-1 * (extract(epoch from clock_timestamp()) * 1e6)::int8, -1, 0)`); err != nil {
		s.t.Fatal(err)
	}
	polltest.Until(s.t, timeout, "the replica to catch up", s.hasMarkerRows)
	if s.rep == nil {
		return // the replica runs in another process: no subscriptions here
	}
	// The file shows a commit before the replicator has published it to
	// its subscriptions: a subscription taken now must not report it.
	db := s.openReplica()
	defer db.Close()
	st, err := replica.LoadState(context.Background(), db)
	if err != nil {
		s.t.Fatal(err)
	}
	polltest.Until(s.t, timeout, "the replica's last commit to be published", func() bool {
		return s.rep.State().Watermark >= st.Watermark
	})
}

func (s *spine) hasMarkerRows() bool {
	db := s.openReplica()
	defer db.Close()
	var pgN, repN int64
	if err := s.pg.QueryRow(context.Background(), `SELECT count(*) FROM txlog`).Scan(&pgN); err != nil {
		return false
	}
	if err := db.QueryRow(`SELECT count(*) FROM txlog`).Scan(&repN); err != nil {
		return false
	}
	return pgN == repN
}

func (s *spine) openReplica() *sql.DB {
	db, err := sql.Open("sqlite", "file:"+s.file+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		s.t.Fatal(err)
	}
	return db
}

// op is one random change; the workload records what it did for the
// stream-order check.
type workload struct {
	r      *rand.Rand
	client int
	seq    int
	nextID int64
	ids    []int64  // live ids of every
	pairs  [][2]any // live keys of pair
	big    string   // a large text value
}

func newWorkload(client int, firstID int64) *workload {
	w := &workload{r: rand.New(rand.NewPCG(uint64(client), 42)), client: client, nextID: firstID}
	var b strings.Builder
	for b.Len() < 200<<10 {
		fmt.Fprintf(&b, "línea %d — \"quoted\" <tag> & \\ back\ttab ☃ ", b.Len())
	}
	w.big = b.String()
	return w
}

func (w *workload) pick(xs []string) string { return xs[w.r.IntN(len(xs))] }

// everyValues returns column names and random values for every, NULLs
// included.
func (w *workload) everyValues() ([]string, []any) {
	r := w.r
	maybe := func(v any) any {
		if r.IntN(6) == 0 {
			return nil
		}
		return v
	}
	texts := []string{"", "plain", "ünïcödé ☃ 😀", "quote ' and \" and \\", "tab\tnew\nline", "<b>&amp;</b>"}
	if r.IntN(20) == 0 {
		texts = append(texts, w.big)
	}
	jsons := []string{`{"a": 1, "b": [true, null, "x"]}`, `[1, 2.5, -3e2]`, `"just a string"`, `42`, `null`, `{"nested": {"deep": {"é": "ü"}}}`}
	if r.IntN(25) == 0 {
		jsons = append(jsons, `{"big": "`+strings.Repeat("x", 100<<10)+`"}`)
	}
	cols := []string{"i2", "i4", "i8", "f4", "f8", "num", "b", "t", "vc", "bp", "u", "j", "jb", "d", "tm", "tz", "ts", "tstz", "e", "ai", "at", "ea"}
	vals := []any{
		maybe(int16(r.IntN(65536) - 32768)), maybe(r.Int32() - 1<<30), maybe(r.Int64N(1<<53) - 1<<52),
		maybe(float32(r.NormFloat64() * 1000)), maybe(r.NormFloat64() * 1e6), maybe(fmt.Sprintf("%d.%03d", r.IntN(1000000)-500000, r.IntN(1000))),
		maybe(r.IntN(2) == 0), maybe(w.pick(texts)), maybe(w.pick(texts[:5])), maybe(w.pick([]string{"ab", "abcd", "é"})),
		maybe(fmt.Sprintf("%08x-0000-4000-8000-%012x", r.Uint32(), r.Uint64()&0xffffffffffff)),
		maybe(w.pick(jsons)), maybe(w.pick(jsons)),
		maybe(fmt.Sprintf("%04d-%02d-%02d", 1900+r.IntN(200), 1+r.IntN(12), 1+r.IntN(28))),
		maybe(fmt.Sprintf("%02d:%02d:%02d.%06d", r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000000))),
		maybe(fmt.Sprintf("%02d:%02d:%02d%+03d", r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(25)-12)),
		maybe(fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d.%06d", 1950+r.IntN(100), 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000000))),
		maybe(fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d.%03d%+03d", 1950+r.IntN(100), 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000), r.IntN(25)-12)),
		maybe(w.pick([]string{"sad", "ok", "happy", "ünïcode"})),
		maybe(w.pick([]string{"{}", "{1,2,3}", "{NULL,-5}", "{{1,2},{3,4}}"})),
		maybe(w.pick([]string{"{}", `{"a b","c\"d",NULL}`, "{ü,☃}"})),
		maybe(w.pick([]string{"{}", "{sad,happy}", "{ünïcode,NULL}"})),
	}
	// Everything goes as text and Postgres casts it (see everyTypes), so
	// the driver's encoders play no part.
	for i := range vals {
		if vals[i] != nil {
			vals[i] = fmt.Sprint(vals[i])
		}
	}
	return cols, vals
}

var everyTypes = map[string]string{
	"i2": "int2", "i4": "int4", "i8": "int8", "f4": "float4", "f8": "float8", "num": "numeric", "b": "bool",
	"t": "text", "vc": "varchar", "bp": "bpchar", "u": "uuid", "j": "json", "jb": "jsonb", "d": "date",
	"tm": "time", "tz": "timetz", "ts": "timestamp", "tstz": "timestamptz", "e": "mood", "ai": "int4[]",
	"at": "text[]", "ea": "mood[]",
}

func param(n int, col string) string { return fmt.Sprintf("$%d::text::%s", n, everyTypes[col]) }

// tx runs one random transaction of 1 to 4 changes plus a txlog row.
func (w *workload) tx(ctx context.Context, conn *pgx.Conn, allowTruncate bool) error {
	w.seq++
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	for range 1 + w.r.IntN(4) {
		if err := w.change(ctx, tx, allowTruncate); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO txlog VALUES ($1, $2, $3)`, int64(w.client)<<32|int64(w.seq), w.client, w.seq); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func (w *workload) change(ctx context.Context, tx pgx.Tx, allowTruncate bool) error {
	r := w.r
	switch k := r.IntN(100); {
	case k < 30 || len(w.ids) < 5:
		cols, vals := w.everyValues()
		id := w.nextID
		w.nextID++
		ph := make([]string, len(cols))
		for i, c := range cols {
			ph[i] = param(i+2, c)
		}
		_, err := tx.Exec(ctx, `INSERT INTO every (id, `+strings.Join(cols, ", ")+`) VALUES ($1, `+strings.Join(ph, ", ")+`)`, append([]any{id}, vals...)...)
		w.ids = append(w.ids, id)
		return err
	case k < 55:
		cols, vals := w.everyValues()
		n := 1 + r.IntN(len(cols))
		perm := r.Perm(len(cols))[:n]
		sets := make([]string, n)
		args := []any{w.ids[r.IntN(len(w.ids))]}
		for i, p := range perm {
			sets[i] = cols[p] + " = " + param(i+2, cols[p])
			args = append(args, vals[p])
		}
		_, err := tx.Exec(ctx, `UPDATE every SET `+strings.Join(sets, ", ")+` WHERE id = $1`, args...)
		return err
	case k < 62:
		// A primary-key change.
		i := r.IntN(len(w.ids))
		id := w.nextID
		w.nextID++
		_, err := tx.Exec(ctx, `UPDATE every SET id = $1, t = 'moved' WHERE id = $2`, id, w.ids[i])
		w.ids[i] = id
		return err
	case k < 70:
		i := r.IntN(len(w.ids))
		_, err := tx.Exec(ctx, `DELETE FROM every WHERE id = $1`, w.ids[i])
		w.ids = append(w.ids[:i], w.ids[i+1:]...)
		return err
	case k < 80:
		key := [2]any{fmt.Sprintf("k-%d-%d", w.client, r.IntN(50)), int32(r.IntN(5))}
		_, err := tx.Exec(ctx, `INSERT INTO pair VALUES ($1, $2, $3) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v`, key[0], key[1], fmt.Sprint("v", r.IntN(1000)))
		w.pairs = append(w.pairs, key)
		return err
	case k < 88 && len(w.pairs) > 0:
		// Move a pair row to a new key: a composite primary-key change.
		i := r.IntN(len(w.pairs))
		nk := [2]any{fmt.Sprintf("k-%d-%d", w.client, 100+r.IntN(1000)), int32(r.IntN(5))}
		_, err := tx.Exec(ctx, `UPDATE pair SET a = $1, b = $2 WHERE a = $3 AND b = $4 AND NOT EXISTS (SELECT 1 FROM pair WHERE a = $1 AND b = $2)`, nk[0], nk[1], w.pairs[i][0], w.pairs[i][1])
		w.pairs[i] = nk
		return err
	case k < 95 && len(w.pairs) > 0:
		i := r.IntN(len(w.pairs))
		_, err := tx.Exec(ctx, `DELETE FROM pair WHERE a = $1 AND b = $2`, w.pairs[i][0], w.pairs[i][1])
		return err
	case k < 97 && allowTruncate:
		_, err := tx.Exec(ctx, `TRUNCATE pair`)
		w.pairs = nil
		return err
	default:
		_, err := tx.Exec(ctx, `UPDATE every SET i4 = coalesce(i4, 0) + 1 WHERE id = $1`, w.ids[r.IntN(len(w.ids))])
		return err
	}
}

// model mirrors the replica from the changed-rows subscription alone.
type model map[string]map[string]map[string]any // table → key → row

func rowKey(key map[string]any) string {
	ks := make([]string, 0, len(key))
	for k := range key {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, "%s=%v;", k, norm(key[k]))
	}
	return b.String()
}

// norm makes SQLite values comparable whatever Go type they were scanned as.
func norm(v any) any {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case int64:
		return float64(x)
	case int:
		return float64(x)
	}
	return v
}

func normRow(r map[string]any) map[string]any {
	out := make(map[string]any, len(r))
	for k, v := range r {
		out[k] = norm(v)
	}
	return out
}

func sameRow(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if fmt.Sprint(norm(v)) != fmt.Sprint(norm(b[k])) {
			return false
		}
	}
	return true
}

// replicaRows reads a replica table as key → row, with _0_version.
func replicaRows(t *testing.T, db *sql.DB, table string, pk []string) map[string]map[string]any {
	t.Helper()
	rows, err := db.Query(`SELECT * FROM "` + table + `"`)
	if err != nil {
		t.Fatalf("read replica %s: %v", table, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	out := map[string]map[string]any{}
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := map[string]any{}
		key := map[string]any{}
		for i, c := range cols {
			row[c] = norm(vals[i])
		}
		for _, k := range pk {
			key[k] = row[k]
		}
		out[rowKey(key)] = row
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var spinePKs = map[string][]string{"every": {"id"}, "pair": {"a", "b"}, "txlog": {"n"}}

// checkReplicaEqualsPostgres compares every table row for row, with the
// expected values computed by Postgres.
func (s *spine) checkReplicaEqualsPostgres() {
	s.t.Helper()
	db := s.openReplica()
	defer db.Close()
	queries := map[string]string{
		"pair":  `SELECT a, b, v FROM pair`,
		"txlog": `SELECT n, client, seq FROM txlog`,
	}
	exprs := make([]string, len(everyCols))
	for i, c := range everyCols {
		exprs[i] = c.expr + " AS " + c.name
	}
	queries["every"] = `SELECT ` + strings.Join(exprs, ", ") + ` FROM every`
	for table, q := range queries {
		s.compareTable(db, table, q, spinePKs[table], jsonCols)
	}
}

// compareTable compares the rows query selects from Postgres with table's
// rows in the replica db, keyed by pk. Columns in jsonCols hold JSON text.
func (s *spine) compareTable(db *sql.DB, table, query string, pk []string, jsonCols map[string]bool) {
	t := s.t
	t.Helper()
	rows, err := s.pg.Query(context.Background(), query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	want := map[string]map[string]any{}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		row := map[string]any{}
		for i, f := range rows.FieldDescriptions() {
			row[f.Name] = pgNorm(vals[i])
		}
		key := map[string]any{}
		for _, k := range pk {
			key[k] = row[k]
		}
		want[rowKey(key)] = row
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	got := replicaRows(t, db, table, pk)
	if len(got) != len(want) {
		t.Errorf("%s: replica has %d rows; Postgres %d", table, len(got), len(want))
	}
	bad := 0
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			if bad++; bad <= 5 {
				t.Errorf("%s: row %s missing from the replica", table, k)
			}
			continue
		}
		for col, wv := range w {
			if !sameValue(jsonCols[col], g[col], wv) {
				if bad++; bad <= 5 {
					t.Errorf("%s %s.%s: replica %.200v; Postgres %.200v", table, k, col, g[col], wv)
				}
			}
		}
	}
}

func pgNorm(v any) any {
	switch x := v.(type) {
	case nil:
		return nil
	case int16:
		return float64(x)
	case int32:
		return float64(x)
	case int64:
		return float64(x)
	case float64:
		return x
	case string:
		return x
	case bool:
		if x {
			return 1.0
		}
		return 0.0
	default:
		// numeric, from extract(): pgtype.Numeric marshals as a JSON number.
		b, err := json.Marshal(x)
		var f float64
		if err == nil && json.Unmarshal(b, &f) == nil {
			return f
		}
		return fmt.Sprint(x)
	}
}

func sameValue(isJSON bool, got, want any) bool {
	if isJSON {
		// A JSON null travels as null, like SQL NULL: Zero clients cannot
		// tell the two apart either.
		if want == "null" {
			want = nil
		}
		// SQLite gives a "json" column NUMERIC affinity, so a JSON number
		// comes back as a number: the same JSON value.
		if f, ok := got.(float64); ok {
			got = strconv.FormatFloat(f, 'g', -1, 64)
		}
	}
	if got == nil || want == nil {
		return got == nil && want == nil
	}
	if isJSON {
		var g, w any
		gs, _ := got.(string)
		ws, _ := want.(string)
		if json.Unmarshal([]byte(gs), &g) != nil || json.Unmarshal([]byte(ws), &w) != nil {
			return false
		}
		gb, _ := json.Marshal(g)
		wb, _ := json.Marshal(w)
		return string(gb) == string(wb)
	}
	gf, gok := got.(float64)
	wf, wok := want.(float64)
	if gok && wok {
		return gf == wf || math.Abs(gf-wf) <= 1e-9*math.Max(math.Abs(gf), math.Abs(wf)) || math.Abs(gf-wf) < 1e-3
	}
	return fmt.Sprint(got) == fmt.Sprint(want)
}

// streamTxs reads the whole change stream and returns its transactions in
// stream order, checking that parts are contiguous and complete and that the
// prev chain holds.
type streamTx struct {
	wm      string
	changes []tableChange
}

type tableChange struct {
	table string
	c     streams.Change
}

func (s *spine) streamTxs() []streamTx {
	t := s.t
	t.Helper()
	ctx := context.Background()
	stream, err := s.js.Stream(ctx, s.shard.ChangesStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var txs []streamTx
	var open *streamTx
	var lastWM string
	nextPart := 0
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; {
		// Bounded by bytes: 500 full-size messages would overflow the
		// client's 64 MB pending limit and be dropped as a slow consumer.
		batch, err := cons.FetchBytes(16<<20, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			seq++
			m, err := streams.Decode(msg.Data())
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			for _, p := range m.Parts {
				if p.Num == 0 {
					if open != nil {
						t.Fatalf("transaction %s starts before %s ended", p.Watermark, open.wm)
					}
					isReset := len(p.Changes) > 0 && p.Changes[0].Op == streams.OpReset
					if !isReset && lastWM != "" && p.Prev != lastWM {
						t.Fatalf("transaction %s has prev %s; the one before was %s", p.Watermark, p.Prev, lastWM)
					}
					if !isReset && p.Watermark <= lastWM {
						t.Fatalf("transaction %s follows %s out of order", p.Watermark, lastWM)
					}
					open = &streamTx{wm: p.Watermark}
					nextPart = 0
				}
				if open == nil || p.Watermark != open.wm || p.Num != nextPart {
					t.Fatalf("part %s:%d out of place", p.Watermark, p.Num)
				}
				nextPart++
				for _, c := range p.Changes {
					open.changes = append(open.changes, tableChange{m.Table, c})
				}
				if p.Last {
					txs = append(txs, *open)
					lastWM = open.wm
					open = nil
				}
			}
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("stream read stalled at seq %d of %d", seq, info.State.LastSeq)
		}
	}
	if open != nil {
		t.Fatalf("the stream ends inside transaction %s", open.wm)
	}
	return txs
}

// txlogOrder returns, per client, the txlog sequence numbers in stream
// order.
func txlogOrder(t *testing.T, txs []streamTx) map[int][]int {
	out := map[int][]int{}
	for _, tx := range txs {
		for _, c := range tx.changes {
			if c.table != "txlog" || c.c.Op != streams.OpInsert {
				continue
			}
			var client, seq int
			if json.Unmarshal(c.c.New["client"], &client) != nil || json.Unmarshal(c.c.New["seq"], &seq) != nil {
				t.Fatalf("bad txlog row %v", c.c.New)
			}
			if client >= 0 {
				out[client] = append(out[client], seq)
			}
		}
	}
	return out
}

func TestSpine_RandomWorkload(t *testing.T) {
	s := startSpine(t, spineSchema+`
		INSERT INTO every (id, t, j, ai) SELECT g, 'seed ' || g, '{"seed": true}', '{1,2}' FROM generate_series(1, 300) g;
		INSERT INTO pair SELECT 'seed-' || g, g % 5, 'v' FROM generate_series(1, 100) g;`)
	ctx := context.Background()
	s.waitCaughtUp(time.Minute)

	// Phase 1: one client, no truncates. The subscription must report
	// exactly the changes made: a model fed only by it stays equal to the
	// replica, and every reported old row is what the model held.
	sub := s.rep.Subscribe()
	defer sub.Close()
	db := s.openReplica()
	m := model{}
	for table, pk := range spinePKs {
		m[table] = replicaRows(t, db, table, pk)
	}
	db.Close()
	start := s.rep.State().Watermark
	w := newWorkload(0, 1000)
	for id := int64(1); id <= 300; id++ {
		w.ids = append(w.ids, id)
	}
	const phase1 = 1500
	for range phase1 {
		if err := w.tx(ctx, s.pg, false); err != nil {
			t.Fatalf("workload: %v", err)
		}
	}
	s.waitCaughtUp(2 * time.Minute)
	reported := 0
	for to := start; to < s.rep.State().Watermark; {
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		u, err := sub.Next(uctx)
		cancel()
		if err != nil {
			t.Fatalf("subscription: %v", err)
		}
		if u.Reset {
			t.Fatalf("subscription reset between %s and %s; the workload made no table-wide change", u.From, u.To)
		}
		if u.From != to {
			t.Fatalf("subscription jumped from %s to %s", to, u.From)
		}
		to = u.To
		for _, rc := range u.Changes {
			reported++
			tbl := m[rc.Table]
			if tbl == nil {
				t.Fatalf("change to unknown table %s", rc.Table)
			}
			k := rowKey(rc.Key)
			if rc.Old != nil && !sameRow(tbl[k], rc.Old) {
				t.Fatalf("%s %s: reported old row %v; the model holds %v", rc.Table, k, rc.Old, tbl[k])
			}
			if rc.Old == nil && tbl[k] != nil {
				t.Fatalf("%s %s: reported as new, but the model holds %v", rc.Table, k, tbl[k])
			}
			if rc.New == nil {
				delete(tbl, k)
			} else {
				tbl[k] = normRow(rc.New)
			}
		}
	}
	db = s.openReplica()
	for table, pk := range spinePKs {
		got := replicaRows(t, db, table, pk)
		if len(got) != len(m[table]) {
			t.Errorf("%s: the subscription's model has %d rows; the replica %d", table, len(m[table]), len(got))
		}
		for k, row := range got {
			if !sameRow(row, m[table][k]) {
				t.Errorf("%s %s: replica %v; subscription model %v", table, k, row, m[table][k])
				break
			}
		}
	}
	db.Close()
	if reported < phase1 {
		t.Errorf("the subscription reported %d row changes for %d transactions", reported, phase1)
	}
	s.checkReplicaEqualsPostgres()

	// Phase 2: four concurrent clients, truncates included.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for c := 1; c <= 4; c++ {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, s.url)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(ctx)
			cw := newWorkload(c, int64(c)*1_000_000_000)
			cw.ids = append(cw.ids, w.ids[c*10:c*10+5]...)
			for range 300 {
				if err := cw.tx(ctx, conn, true); err != nil {
					var pgErr interface{ SQLState() string }
					if errors.As(err, &pgErr) && (pgErr.SQLState() == "40P01" || pgErr.SQLState() == "23505") {
						continue // a deadlock or key clash with another client: that transaction rolled back
					}
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent workload: %v", err)
	}
	s.waitCaughtUp(2 * time.Minute)
	s.checkReplicaEqualsPostgres()

	// The stream: commit order, each transaction once and whole.
	txs := s.streamTxs()
	order := txlogOrder(t, txs)
	if got := order[0]; len(got) != phase1 {
		t.Errorf("client 0: %d transactions in the stream; want %d", len(got), phase1)
	}
	var pgCounts = map[int]int{}
	rows, err := s.pg.Query(ctx, `SELECT client, count(*) FROM txlog WHERE client >= 0 GROUP BY client`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c, n int
		if err := rows.Scan(&c, &n); err != nil {
			t.Fatal(err)
		}
		pgCounts[c] = n
	}
	for c, seqs := range order {
		if len(seqs) != pgCounts[c] {
			t.Errorf("client %d: %d transactions in the stream; Postgres committed %d", c, len(seqs), pgCounts[c])
		}
		if !sort.IntsAreSorted(seqs) {
			t.Errorf("client %d: transactions out of commit order in the stream", c)
		}
		for i := 1; i < len(seqs); i++ {
			if seqs[i] == seqs[i-1] {
				t.Errorf("client %d: transaction %d twice in the stream", c, seqs[i])
			}
		}
	}

	// A second replica, from the stream alone, equals the first.
	s.checkReplayEquals()
}

// checkReplayEquals builds a second replica from the stream alone with
// `jetsync replay --into` and compares it with the first, versions included.
func (s *spine) checkReplayEquals() {
	t := s.t
	t.Helper()
	file := filepath.Join(t.TempDir(), "replayed.db")
	if out, err := replay(s.nats, "--from", "1", "--into", file); err != nil {
		t.Fatalf("jetsync replay --into: %v\n%s", err, out)
	}
	a, b := s.openReplica(), openFile(t, file)
	defer a.Close()
	defer b.Close()
	for table, pk := range spinePKs {
		ra, rb := replicaRows(t, a, table, pk), replicaRows(t, b, table, pk)
		if len(ra) != len(rb) {
			t.Errorf("%s: replayed replica has %d rows; the live one %d", table, len(rb), len(ra))
		}
		for k, row := range ra {
			if !sameRow(row, rb[k]) {
				t.Errorf("%s %s: replayed %v; live %v", table, k, rb[k], row)
				break
			}
		}
	}
}

func openFile(t *testing.T, file string) *sql.DB {
	db, err := sql.Open("sqlite", "file:"+file+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestSpine_Gap purges history past a stopped replica consumer. On restart
// it must detect the gap rather than apply past it, and rebuild: the reset
// that opened its history is purged too, so it asks the producer for a new
// initial sync.
func TestSpine_Gap(t *testing.T) {
	s := startSpine(t, spineSchema+`INSERT INTO every (id, t) SELECT g, 'seed' FROM generate_series(1, 50) g;`)
	ctx := context.Background()
	s.waitCaughtUp(time.Minute)
	before := s.rep.State()
	s.stop()

	w := newWorkload(0, 1000)
	for id := int64(1); id <= 50; id++ {
		w.ids = append(w.ids, id)
	}
	for range 100 {
		if err := w.tx(ctx, s.pg, false); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := s.js.Stream(ctx, s.shard.ChangesStream())
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the producer has published all of it, then drop all
	// but the newest message.
	polltest.Until(t, time.Minute, "the workload to reach the stream", func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.LastSeq > before.StreamSeq+50
	})
	if err := stream.Purge(ctx, jetstream.WithPurgeKeep(1)); err != nil {
		t.Fatal(err)
	}

	s.startReplica()
	s.waitCaughtUp(2 * time.Minute)
	after := s.rep.State()
	if after.ReplicaVersion == before.ReplicaVersion {
		t.Errorf("replica version %s unchanged: the gap was not answered with a rebuild from a new initial sync", after.ReplicaVersion)
	}
	s.checkReplicaEqualsPostgres()
}

// TestSpine_BadConditions covers upstream tables that jetsync replicates but
// cannot sync to clients, each with the behaviour the README documents under
// "Bad conditions".
func TestSpine_BadConditions(t *testing.T) {
	s := startSpine(t, spineSchema+`
		CREATE TABLE nokey (a text, b int);
		CREATE TABLE odd (id int PRIMARY KEY, iv interval, raw bytea, pt point);
		INSERT INTO nokey VALUES ('x', 1), ('x', 1);
		INSERT INTO odd VALUES (1, '1 day 02:03:04', '\x00ff', '(1,2)');`)
	ctx := context.Background()
	s.waitCaughtUp(time.Minute)
	for _, q := range []string{
		`INSERT INTO nokey VALUES ('y', 2)`,
		`INSERT INTO odd VALUES (2, '-5 minutes', '\xdeadbeef', '(3.5,-1)')`,
		`UPDATE odd SET iv = iv * 2 WHERE id = 1`,
	} {
		if _, err := s.pg.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Postgres itself refuses to update or delete rows of a published table
	// that has no replica identity: nothing for jetsync to lose.
	if _, err := s.pg.Exec(ctx, `UPDATE nokey SET b = 3 WHERE a = 'y'`); err == nil {
		t.Error("Postgres accepted an UPDATE on a published table without a replica identity")
	}
	s.waitCaughtUp(time.Minute)
	db := s.openReplica()
	defer db.Close()

	t.Run("NoPrimaryKey", func(t *testing.T) {
		// Replicated as it stands upstream, duplicates included.
		got := map[string]int{}
		rows, err := db.Query(`SELECT a, count(*) FROM nokey GROUP BY a`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var a string
			var n int
			if err := rows.Scan(&a, &n); err != nil {
				t.Fatal(err)
			}
			got[a] = n
		}
		if got["x"] != 2 || got["y"] != 1 || len(got) != 2 {
			t.Errorf("nokey in the replica: %v; want x twice and y once", got)
		}
	})

	t.Run("UnsupportedTypes", func(t *testing.T) {
		// Carried as Postgres's text form, and marked unsupported so that
		// no client is ever sent them.
		pgRows, err := s.pg.Query(ctx, `SELECT id, iv::text, raw::text, pt::text FROM odd ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		var want [][4]string
		for pgRows.Next() {
			var r [4]string
			var id int
			if err := pgRows.Scan(&id, &r[1], &r[2], &r[3]); err != nil {
				t.Fatal(err)
			}
			r[0] = strconv.Itoa(id)
			want = append(want, r)
		}
		if err := pgRows.Err(); err != nil {
			t.Fatal(err)
		}
		rows, err := db.Query(`SELECT id, iv, raw, pt FROM odd ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got [][4]string
		for rows.Next() {
			var r [4]string
			var id int
			if err := rows.Scan(&id, &r[1], &r[2], &r[3]); err != nil {
				t.Fatal(err)
			}
			r[0] = strconv.Itoa(id)
			got = append(got, r)
		}
		if !slices.Equal(got, want) {
			t.Errorf("odd in the replica: %q; Postgres: %q", got, want)
		}
		var spec string
		if err := db.QueryRow(`SELECT spec FROM "_jetsync.tables" WHERE name = 'odd'`).Scan(&spec); err != nil {
			t.Fatal(err)
		}
		var ts streams.TableSpec
		if err := json.Unmarshal([]byte(spec), &ts); err != nil {
			t.Fatal(err)
		}
		kinds := map[string]streams.Kind{}
		for _, c := range ts.Columns {
			kinds[c.Name] = c.Kind
		}
		for _, c := range []string{"iv", "raw", "pt"} {
			if kinds[c] != streams.KindUnsupported {
				t.Errorf("column %s has kind %q; want %q", c, kinds[c], streams.KindUnsupported)
			}
		}
		if kinds["id"] != streams.KindNumber {
			t.Errorf("column id has kind %q; want number", kinds["id"])
		}
	})
}
