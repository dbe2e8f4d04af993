package viewsyncer

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

// captureSecret is the throwaway secret the transcripts were captured with
// (testdata/spec/transcripts/README.md).
const captureSecret = "zpeer-dev-secret-0123456789abcdef"

// env is a real replica pipeline: an embedded JetStream with the shard's
// stream, a hand-rolled producer publishing what pgrepl would, a replica
// consumer keeping a SQLite file, and a view-syncer serving it over HTTP.
type env struct {
	t     testing.TB
	ns    *server.Server
	js    jetstream.JetStream
	kv    jetstream.KeyValue
	shard streams.Shard
	cons  *replicator.Consumer
	file  string
	log   *slog.Logger
	// srv and http are the view-syncer clients dial (the first one
	// started, unless a test points them elsewhere).
	srv  *Server
	http *httptest.Server
	sy   *syncer
	// cvrDir holds the syncers' CVR projections, one file per syncer ID,
	// so that a restarted syncer finds its own.
	cvrDir string

	// api is the app's API server, if envOptions.api.
	api *apiServer

	// txMu serialises upstream transactions: the API server's mutators
	// write too.
	txMu    *sync.Mutex
	lsn     uint64
	wm      string
	version string
	// specs holds the tables' specs once a transcript's DDL changed one.
	specs map[string]streams.TableSpec
}

type envOptions struct {
	issues int
	secret string
	// durable keeps the CVRs in the JetStream CVR stream.
	durable bool
	// groupIdle and leaseTTL default to the server's and store's.
	groupIdle, leaseTTL time.Duration
	// gc configures the durable store's garbage collection.
	gc cvrstore.GCConfig
	// api starts an API server (apiServer) at ZERO_QUERY_URL and
	// ZERO_MUTATE_URL; revalidate and retransform are the auth
	// maintenance intervals.
	api                     bool
	revalidate, retransform time.Duration
	// apiTimeout, if set, bounds each call to the API server.
	apiTimeout time.Duration
	// adminPassword and devMode open the inspector.
	adminPassword string
	devMode       bool
	// wrapStore, if set, replaces the server's CVR store before it starts.
	wrapStore func(cvrStore) cvrStore
	// noPeerSecret leaves a durable store's peer secret (else
	// testPeerSecret) unset: nothing is relayed.
	noPeerSecret bool
	// pruneAge is the server's CVRPruneAge.
	pruneAge time.Duration
	// releaseRows and onRelease, if set, replace the server's release
	// threshold and what a release does (release.go).
	releaseRows int
	onRelease   func()
}

// testPeerSecret is the durable syncers' JETSYNC_PEER_SECRET.
const testPeerSecret = "zpeer-peer-secret"

// syncer is one view-syncer over the env's replica.
type syncer struct {
	id    string
	nc    *nats.Conn
	srv   *Server
	store *cvrstore.Store
	http  *httptest.Server
	// stop shuts it down as on SIGTERM; crash as on SIGKILL: its leases
	// are left to expire. Both wait for Run to return and may be called
	// again. drain ends Run alone, its HTTP server still up, and waits
	// for it.
	stop, crash, drain func()
}

func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	ns := natstest.Start(t)
	_, js := natstest.Connect(t, ns)
	shard := streams.Shard{App: "zpeer", Num: 0}
	_, kv, err := streams.Ensure(context.Background(), js, streams.Config{Shard: shard})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ns: ns, js: js, kv: kv, shard: shard, lsn: 0x1000000, txMu: &sync.Mutex{}}
	e.initialSync(o.issues)

	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if os.Getenv("VIEWSYNCER_TEST_LOGS") != "" {
		logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	file := filepath.Join(t.TempDir(), "replica.db")
	cons, err := replicator.New(replicator.Config{File: file, Shard: shard, TaskID: "vs-test", Logger: logger}, js)
	if err != nil {
		t.Fatal(err)
	}
	e.cons, e.file, e.log, e.cvrDir = cons, file, logger, t.TempDir()
	if o.api {
		e.api = newAPIServer(t, e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	e.use(e.startSyncer("vs-a", o))
	// A large seed takes its time to apply.
	polltest.Until(t, 10*time.Second+time.Duration(o.issues)*time.Millisecond/2, "the initial sync", func() bool {
		return e.cons.State().Watermark == e.wm
	})
	return e
}

func peerSecret(o envOptions) []byte {
	if o.noPeerSecret {
		return nil
	}
	return []byte(testPeerSecret)
}

// use points the env's clients at s.
func (e *env) use(s *syncer) { e.sy, e.srv, e.http = s, s.srv, s.http }

// startSyncer starts a view-syncer over the env's replica, with its own
// NATS connection and, if o.durable, its own CVR projection file.
func (e *env) startSyncer(id string, o envOptions) *syncer {
	t := e.t
	t.Helper()
	nc, js := natstest.Connect(t, e.ns)
	s := &syncer{id: id, nc: nc}
	// The routes cmd/jetsync serves beside the sync endpoint.
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("OK")) })
	mux.HandleFunc("GET /metrics", func(http.ResponseWriter, *http.Request) {})
	s.http = httptest.NewUnstartedServer(mux)
	cfg := Config{ReplicaFile: e.file, Replica: e.cons, Shard: e.shard, AuthSecret: o.secret, GroupIdle: o.groupIdle,
		GC: o.gc, Logger: e.log.With("syncer", id), RevalidateInterval: o.revalidate, RetransformInterval: o.retransform,
		AdminPassword: o.adminPassword, DevelopmentMode: o.devMode, ServerVersion: "jetsync test", CVRPruneAge: o.pruneAge}
	if e.api != nil {
		cfg.API.Query.URLs = []string{e.api.http.URL + "/query"}
		cfg.API.Mutate.URLs = []string{e.api.http.URL + "/mutate"}
		cfg.API.RequestTimeout = o.apiTimeout
	}
	if o.durable {
		store, err := cvrstore.Open(context.Background(), cvrstore.Config{
			JS: js, Shard: e.shard, File: filepath.Join(e.cvrDir, id+"-cvr.db"), OwnerID: id,
			Address: "ws://" + s.http.Listener.Addr().String(), LeaseTTL: o.leaseTTL, Logger: cfg.Logger,
			PeerSecret: peerSecret(o),
		})
		if err != nil {
			t.Fatal(err)
		}
		s.store, cfg.CVR = store, store
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if o.wrapStore != nil {
		srv.store = o.wrapStore(srv.store)
	}
	if o.releaseRows > 0 {
		srv.rel.rows = o.releaseRows
	}
	if o.onRelease != nil {
		srv.rel.free = o.onRelease
	}
	s.srv = srv
	for _, p := range Patterns {
		mux.Handle(p, srv.Handler())
	}
	s.http.Start()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	wait := sync.OnceFunc(func() {
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	s.drain = func() { cancel(); wait() }
	var once sync.Once
	halt := func(crash bool) {
		once.Do(func() {
			if crash {
				// Without NATS, the leases can be neither renewed nor
				// given up.
				nc.Close()
			}
			s.http.CloseClientConnections()
			s.http.Close()
			cancel()
			wait()
			srv.Close()
			if s.store != nil {
				s.store.Close()
			}
		})
	}
	s.stop, s.crash = func() { halt(false) }, func() { halt(true) }
	t.Cleanup(s.stop)
	return s
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (e *env) waitWM(wm string) {
	e.t.Helper()
	polltest.Until(e.t, 10*time.Second, "watermark "+wm, func() bool { return e.cons.State().Watermark == wm })
}

func (e *env) nextWM() string {
	e.lsn += 8
	return streams.Lexi(e.lsn)
}

func (e *env) publish(m *streams.Message) uint64 {
	e.t.Helper()
	msg, err := streams.NewMsg(e.shard, m, e.version)
	if err != nil {
		e.t.Fatal(err)
	}
	ack, err := e.js.PublishMsg(context.Background(), msg)
	if err != nil {
		e.t.Fatalf("publish: %v", err)
	}
	return ack.Sequence
}

func col(name string, pos int, typ string, kind streams.Kind, notNull bool) streams.ColumnSpec {
	return streams.ColumnSpec{Name: name, Pos: pos, DataType: typ, Kind: kind, NotNull: notNull}
}

// benchTables are testdata/bench/schema.sql's tables.
var benchTables = []streams.TableSpec{
	{Schema: "public", Name: "user", PrimaryKey: []string{"id"}, Columns: []streams.ColumnSpec{
		col("id", 1, "text", streams.KindString, true), col("name", 2, "text", streams.KindString, true)}},
	{Schema: "public", Name: "label", PrimaryKey: []string{"id"}, Columns: []streams.ColumnSpec{
		col("id", 1, "text", streams.KindString, true), col("name", 2, "text", streams.KindString, true)}},
	{Schema: "public", Name: "issue", PrimaryKey: []string{"id"}, Columns: []streams.ColumnSpec{
		col("id", 1, "text", streams.KindString, true), col("title", 2, "text", streams.KindString, true),
		col("open", 3, "bool", streams.KindBoolean, true), col("modified", 4, "float8", streams.KindNumber, true),
		col("owner_id", 5, "text", streams.KindString, false), col("created", 6, "timestamptz", streams.KindNumber, true)}},
	{Schema: "public", Name: "comment", PrimaryKey: []string{"id"}, Columns: []streams.ColumnSpec{
		col("id", 1, "text", streams.KindString, true), col("issue_id", 2, "text", streams.KindString, true),
		col("body", 3, "text", streams.KindString, true), col("created", 4, "timestamptz", streams.KindNumber, true)}},
	{Schema: "public", Name: "issue_label", PrimaryKey: []string{"issue_id", "label_id"}, Columns: []streams.ColumnSpec{
		col("issue_id", 1, "text", streams.KindString, true), col("label_id", 2, "text", streams.KindString, true)}},
	// The app's lastMutationID table (docs/protocol.md §8).
	{Schema: "zpeer_0", Name: "clients", PrimaryKey: []string{"clientGroupID", "clientID"}, Columns: []streams.ColumnSpec{
		col("clientGroupID", 1, "text", streams.KindString, true), col("clientID", 2, "text", streams.KindString, true),
		col("lastMutationID", 3, "int8", streams.KindNumber, true), col("userID", 4, "text", streams.KindString, false)}},
	// The app's mutation results (docs/protocol.md §8).
	{Schema: "zpeer_0", Name: "mutations", PrimaryKey: []string{"clientGroupID", "clientID", "mutationID"}, Columns: []streams.ColumnSpec{
		col("clientGroupID", 1, "text", streams.KindString, true), col("clientID", 2, "text", streams.KindString, true),
		col("mutationID", 3, "int8", streams.KindNumber, true), col("result", 4, "json", streams.KindJSON, true)}},
	// The app's legacy permissions (docs/replica.md §6).
	{Schema: "zpeer", Name: "permissions", PrimaryKey: []string{"lock"}, Columns: []streams.ColumnSpec{
		col("permissions", 1, "jsonb", streams.KindJSON, false), col("hash", 2, "text", streams.KindString, false),
		col("lock", 3, "bool", streams.KindBoolean, true)}},
}

var benchIndexes = []streams.IndexSpec{
	{Schema: "public", TableName: "issue", Name: "issue_modified_idx", Columns: []string{"modified"}},
	{Schema: "public", TableName: "issue", Name: "issue_owner_idx", Columns: []string{"owner_id"}},
	{Schema: "public", TableName: "comment", Name: "comment_issue_idx", Columns: []string{"issue_id"}},
	{Schema: "public", TableName: "issue_label", Name: "issue_label_label_idx", Columns: []string{"label_id"}},
}

func raw(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// transcriptPermissions is testdata/spec/transcripts/app/permissions.json.
const transcriptPermissions = `{"tables":{` +
	`"user":{"row":{"select":[["allow",{"type":"and","conditions":[]}]],"update":{}}},` +
	`"issue":{"row":{"select":[["allow",{"type":"and","conditions":[]}]],"update":{}}},` +
	`"label":{"row":{"select":[["allow",{"type":"and","conditions":[]}]],"update":{}}},` +
	`"comment":{"row":{"select":[["allow",{"type":"and","conditions":[]}]],"update":{}}},` +
	`"issue_label":{"row":{"select":[["allow",{"type":"and","conditions":[]}]],"update":{}}}}}`

// epoch2024 is 2024-01-01 00:00:00+00 in epoch milliseconds.
const epoch2024 = 1704067200000

// seedRows generates testdata/bench/seed.sh's rows (2 comments per
// issue), in client form.
func seedRows(issues int) map[string][][]json.RawMessage {
	out := map[string][][]json.RawMessage{}
	put := func(table string, vals ...any) {
		r := make([]json.RawMessage, len(vals))
		for i, v := range vals {
			r[i] = raw(v)
		}
		out[table] = append(out[table], r)
	}
	users := max(10, issues/100)
	for g := 1; g <= users; g++ {
		put("user", fmt.Sprintf("u%06d", g), "User "+strconv.Itoa(g))
	}
	for g := 1; g <= 20; g++ {
		put("label", fmt.Sprintf("l%02d", g), "label-"+strconv.Itoa(g))
	}
	for g := 1; g <= issues; g++ {
		sum := md5.Sum([]byte(strconv.Itoa(g)))
		id := fmt.Sprintf("i%07d", g)
		put("issue", id, "Issue "+strconv.Itoa(g)+" "+hex.EncodeToString(sum[:]), g%3 != 0,
			float64((int64(g)*7919)%1000003)*1000+float64(g), fmt.Sprintf("u%06d", 1+(g*31)%users),
			float64(epoch2024+int64(g)*60000))
		for c := 1; c <= 2; c++ {
			put("comment", fmt.Sprintf("c%07d-%d", g, c), id, fmt.Sprintf("Comment %d on issue %d", c, g),
				float64(epoch2024+int64(g)*60000+int64(c)*1000))
		}
	}
	for g := 1; g <= issues; g++ {
		put("issue_label", fmt.Sprintf("i%07d", g), fmt.Sprintf("l%02d", 1+g%20))
	}
	// The rules the transcripts were captured with: every bench table
	// readable by anyone.
	put("permissions", json.RawMessage(transcriptPermissions), "2b1a0c5b7e2c4e3f8a9d0c1b2a3f4e5d", true)
	for g := 1; g <= issues; g++ {
		if g%2 == 0 && (g*7+3)%20 != g%20 {
			put("issue_label", fmt.Sprintf("i%07d", g), fmt.Sprintf("l%02d", 1+(g*7+3)%20))
		}
	}
	return out
}

// initialSync publishes a reset, the bench tables seeded with issues, and
// records the upstream.
func (e *env) initialSync(issues int) {
	e.t.Helper()
	v := e.nextWM()
	e.version = v
	resetSeq := e.publish(&streams.Message{Parts: []streams.Part{{Watermark: v, Num: 0, Changes: []streams.Change{{
		Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: v, Publications: []string{"zpeer_pub"}, SystemID: "1", Slot: "s"},
	}}}}})
	num := 1
	part := func(schema, table string, cs ...streams.Change) {
		e.publish(&streams.Message{Schema: schema, Table: table, Parts: []streams.Part{{Watermark: v, Num: num, Changes: cs}}})
		num++
	}
	rows := seedRows(issues)
	for _, spec := range benchTables {
		s := spec
		part(s.Schema, s.Name, streams.Change{Op: streams.OpCreateTable, Spec: &s})
		names := make([]string, len(s.Columns))
		for i, c := range s.Columns {
			names[i] = c.Name
		}
		rs := rows[s.Name]
		for lo := 0; lo < len(rs); lo += 500 {
			part(s.Schema, s.Name, streams.Change{Op: streams.OpBackfill, Columns: names, Rows: rs[lo:min(len(rs), lo+500)]})
		}
	}
	for _, ix := range benchIndexes {
		x := ix
		part(x.Schema, x.TableName, streams.Change{Op: streams.OpCreateIndex, Index: &x})
	}
	e.publish(&streams.Message{Parts: []streams.Part{{Watermark: v, Num: num, Last: true, Changes: []streams.Change{}}}})
	e.wm = v
	b, _ := json.Marshal(streams.Upstream{SystemID: "1", Slot: "s", ReplicaVersion: v, Publications: []string{"zpeer_pub"}, ResetSeq: resetSeq, Complete: true})
	if _, err := e.kv.Put(context.Background(), streams.KeyUpstream, b); err != nil {
		e.t.Fatal(err)
	}
}

// tableChanges are one table's changes in a transaction.
type tableChanges struct {
	schema, table string
	changes       []streams.Change
}

// txTables publishes one transaction over several tables, as pgrepl does:
// a part per table, then an empty last part on the tx subject. It waits
// until the replica has it.
func (e *env) txTables(ts ...tableChanges) {
	e.t.Helper()
	e.txMu.Lock()
	defer e.txMu.Unlock()
	wm := e.nextWM()
	for i, tc := range ts {
		p := streams.Part{Watermark: wm, Num: i, Changes: tc.changes}
		if i == 0 {
			p.Prev = e.wm
		}
		e.publish(&streams.Message{Schema: tc.schema, Table: tc.table, Parts: []streams.Part{p}})
	}
	e.publish(&streams.Message{Parts: []streams.Part{{Watermark: wm, Num: len(ts), Last: true, Changes: []streams.Change{}}}})
	e.wm = wm
	e.waitWM(wm)
}

// tx publishes one transaction on schema.table and waits until the replica
// has it.
func (e *env) tx(schema, table string, cs ...streams.Change) {
	e.t.Helper()
	e.txMu.Lock()
	defer e.txMu.Unlock()
	wm := e.nextWM()
	e.publish(&streams.Message{Schema: schema, Table: table, Parts: []streams.Part{{Watermark: wm, Prev: e.wm, Num: 0, Last: true, Changes: cs}}})
	e.wm = wm
	e.waitWM(wm)
}

// SQL the transcripts' notes run upstream, in the few forms they use.
var (
	insertRe  = regexp.MustCompile(`^INSERT INTO "?(\w+)"? \(([^)]*)\) VALUES \((.*)\)$`)
	updateRe  = regexp.MustCompile(`^UPDATE "?(\w+)"? SET (.*) WHERE id = '([^']*)'$`)
	deleteRe  = regexp.MustCompile(`^DELETE FROM "?(\w+)"? WHERE id = '([^']*)'$`)
	addColRe  = regexp.MustCompile(`^ALTER TABLE "?(\w+)"? ADD COLUMN "?(\w+)"? (integer|text|boolean)( NOT NULL)?(?: DEFAULT (.+))?$`)
	dropColRe = regexp.MustCompile(`^ALTER TABLE "?(\w+)"? DROP COLUMN "?(\w+)"?$`)
)

// pgColumnTypes maps the column types the transcripts' DDL uses to what the
// producer reports for them.
var pgColumnTypes = map[string]struct {
	dataType string
	kind     streams.Kind
}{
	"integer": {"int4", streams.KindNumber},
	"text":    {"text", streams.KindString},
	"boolean": {"bool", streams.KindBoolean},
}

// tableSpec returns the public table's spec as the env last published it.
func (e *env) tableSpec(name string) streams.TableSpec {
	e.t.Helper()
	if e.specs == nil {
		e.specs = map[string]streams.TableSpec{}
		for _, s := range benchTables {
			e.specs[s.Schema+"."+s.Name] = s
		}
	}
	s, ok := e.specs["public."+name]
	if !ok {
		e.t.Fatalf("no table %s", name)
	}
	s.Columns = slices.Clone(s.Columns)
	return s
}

// execSQL applies a note's SQL as one upstream transaction.
func (e *env) execSQL(sql string) {
	e.t.Helper()
	var table string
	var cs []streams.Change
	for _, st := range strings.Split(sql, ";") {
		st = strings.TrimSpace(st)
		if st == "" || st == "BEGIN" || st == "COMMIT" {
			continue
		}
		switch {
		case insertRe.MatchString(st):
			m := insertRe.FindStringSubmatch(st)
			table = m[1]
			cols, vals := splitList(m[2]), splitList(m[3])
			row := streams.Row{}
			for i, c := range cols {
				row[c] = sqlValue(e.t, vals[i])
			}
			cs = append(cs, streams.Change{Op: streams.OpInsert, New: row})
		case updateRe.MatchString(st):
			m := updateRe.FindStringSubmatch(st)
			table = m[1]
			// Columns left out are kept, as for an unchanged TOAST value.
			row := streams.Row{"id": raw(m[3])}
			for _, a := range splitList(m[2]) {
				k, v, _ := strings.Cut(a, "=")
				row[strings.TrimSpace(k)] = sqlValue(e.t, strings.TrimSpace(v))
			}
			cs = append(cs, streams.Change{Op: streams.OpUpdate, New: row})
		case deleteRe.MatchString(st):
			m := deleteRe.FindStringSubmatch(st)
			table = m[1]
			cs = append(cs, streams.Change{Op: streams.OpDelete, Old: streams.Row{"id": raw(m[2])}})
		case addColRe.MatchString(st):
			m := addColRe.FindStringSubmatch(st)
			table = m[1]
			spec := e.tableSpec(table)
			typ := pgColumnTypes[m[3]]
			spec.Columns = append(spec.Columns, col(m[2], spec.Columns[len(spec.Columns)-1].Pos+1, typ.dataType, typ.kind, m[4] != ""))
			c := streams.Change{Op: streams.OpAddColumn, Spec: &spec, Columns: []string{m[2]}}
			if m[5] != "" {
				c.New = streams.Row{m[2]: sqlValue(e.t, m[5])}
			}
			e.specs["public."+table] = spec
			cs = append(cs, c)
		case dropColRe.MatchString(st):
			m := dropColRe.FindStringSubmatch(st)
			table = m[1]
			spec := e.tableSpec(table)
			spec.Columns = slices.DeleteFunc(spec.Columns, func(c streams.ColumnSpec) bool { return c.Name == m[2] })
			e.specs["public."+table] = spec
			cs = append(cs, streams.Change{Op: streams.OpDropColumn, Spec: &spec, Columns: []string{m[2]}})
		default:
			e.t.Fatalf("unsupported SQL in transcript: %s", st)
		}
	}
	e.tx("public", table, cs...)
}

// splitList splits on commas outside quotes and parentheses.
func splitList(s string) []string {
	var out []string
	depth, quoted, start := 0, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'':
			quoted = !quoted
		case quoted:
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == ',' && depth == 0:
			out = append(out, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

func sqlValue(t testing.TB, v string) json.RawMessage {
	t.Helper()
	switch {
	case strings.HasPrefix(v, "'"):
		return raw(strings.ReplaceAll(strings.Trim(v, "'"), "''", "'"))
	case v == "true" || v == "false" || v == "null":
		return json.RawMessage(v)
	case strings.HasPrefix(v, "to_timestamp("):
		f, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(v, "to_timestamp("), ")"), 64)
		if err != nil {
			t.Fatal(err)
		}
		return raw(f * 1000)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("unsupported SQL value %s", v)
	}
	return raw(f)
}
