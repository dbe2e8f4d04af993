package cvrstore

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/streams"
)

var update = flag.Bool("update", false, "rewrite the expected output of testdata/*.txt")

// TestScripts runs the CVR scripts in testdata/, as etcd's raft tests its
// state machine: each step is commands, a "----" line, and the output they
// must print, up to a blank line. With -update, the output is rewritten.
//
// Commands (a CVR "g" starts empty; its wall clock is fake, at 0):
//
//	config | query STATE [compare]   begin an update
//	client ID | delete-client ID      register / delete a client
//	put CLIENT HASH [TTLMS] | del CLIENT HASH | clear CLIENT
//	                                  a desiredQueriesPatch op, at the TTL clock
//	got HASH | unget HASH             the got set
//	hold HASH ID VERSION [TITLE]      a query holds issue ID at VERSION
//	release HASH ID                   it no longer does
//	put? ID                           whether the held row would be streamed
//	finish [streamed ID...]           end the update: print its version and delta
//	catchup BASE|null                 print the catch-up from BASE
//	start-clock | stop-clock | wait MS | clock
//	expired HASH | next-eviction HASH...
//	internal HASH                     (re)place an internal query
//	named CLIENT HASH NAME            a put of a synced query
//	transform HASH TH | refuse HASH   the API server's answer for it
//	schema JSON                       set the client schema
//	flush                             print what a durable flush of the last
//	                                  update writes, then count it written
//	rows | queries | desires          print the records
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScript(t, f) })
	}
}

type step struct {
	cmds []string
	want string
}

func parseScript(t *testing.T, file string) (head string, steps []step) {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cur *step
	var out []string
	inOut := false
	var heads []string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case inOut && line == "":
			cur.want = strings.Join(out, "\n")
			steps = append(steps, *cur)
			cur, out, inOut = nil, nil, false
		case inOut:
			out = append(out, line)
		case line == "----":
			if cur == nil {
				t.Fatalf("%s: ---- without commands", file)
			}
			inOut = true
		case strings.HasPrefix(line, "#") && cur == nil && len(steps) == 0:
			heads = append(heads, line)
		case line == "":
		default:
			if cur == nil {
				cur = &step{}
			}
			cur.cmds = append(cur.cmds, line)
		}
	}
	if inOut {
		cur.want = strings.Join(out, "\n")
		steps = append(steps, *cur)
	} else if cur != nil {
		t.Fatalf("%s: commands without ----", file)
	}
	return strings.Join(heads, "\n"), steps
}

func runScript(t *testing.T, file string) {
	head, steps := parseScript(t, file)
	r := newRunner(t)
	var rewritten strings.Builder
	if head != "" {
		rewritten.WriteString(head + "\n\n")
	}
	for _, st := range steps {
		var out []string
		for _, cmd := range st.cmds {
			if !strings.HasPrefix(cmd, "#") {
				out = append(out, r.run(cmd)...)
			}
		}
		got := strings.Join(out, "\n")
		if got != st.want && !*update {
			t.Errorf("%s:\n%s\n----\ngot:\n%s\nwant:\n%s", file, strings.Join(st.cmds, "\n"), got, st.want)
		}
		rewritten.WriteString(strings.Join(st.cmds, "\n") + "\n----\n")
		if got != "" {
			rewritten.WriteString(got + "\n")
		}
		rewritten.WriteString("\n")
	}
	if *update {
		if err := os.WriteFile(file, []byte(strings.TrimSuffix(rewritten.String(), "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// runner drives one CVR through a script.
type runner struct {
	t    *testing.T
	c    *CVR
	u    *Update
	last *Update
	now  time.Time
	rows *rowSource
}

func newRunner(t *testing.T) *runner {
	r := &runner{t: t, c: New("g"), now: time.UnixMilli(0), rows: newRowSource(t)}
	r.c.Now = func() time.Time { return r.now }
	r.c.track = true // as a durable store's, for flush
	return r
}

func (r *runner) run(line string) []string {
	t := r.t
	f := strings.Fields(line)
	arg := func(i int) string {
		if i >= len(f) {
			t.Fatalf("%q: missing argument %d", line, i)
		}
		return f[i]
	}
	num := func(i int) float64 {
		n, err := strconv.ParseFloat(arg(i), 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return n
	}
	needU := func() {
		if r.u == nil {
			t.Fatalf("%q: no update begun", line)
		}
	}
	switch f[0] {
	case "config":
		r.u = r.c.BeginConfig()
	case "query":
		r.u = r.c.BeginQuery(arg(1))
		r.u.Compare = len(f) > 2 && f[2] == "compare"
	case "client":
		needU()
		r.u.PutClient(arg(1))
	case "delete-client":
		needU()
		r.u.DeleteClient(arg(1), r.c.Clock())
	case "put", "del", "clear":
		needU()
		op := PatchOp{Op: f[0]}
		if f[0] != "clear" {
			op.Hash = arg(2)
			op.AST = &zql.AST{Table: "issue"}
		}
		if f[0] == "put" && len(f) > 3 {
			ms := num(3)
			op.TTL = &ms
		}
		r.u.ApplyPatch(arg(1), []PatchOp{op}, r.c.Clock())
	case "internal":
		needU()
		r.u.PutInternalQuery(arg(1), &zql.AST{Table: "issue"})
	case "schema":
		needU()
		r.u.SetClientSchema(json.RawMessage(arg(1)))
	case "named":
		needU()
		name := arg(3)
		r.u.ApplyPatch(arg(1), []PatchOp{{Op: "put", Hash: arg(2), Name: &name}}, r.c.Clock())
	case "transform":
		r.c.Transformed(arg(1), &zql.AST{Table: "issue"}, arg(2))
	case "refuse":
		r.c.Refused(arg(1), &appapi.QueryError{Kind: "app", Message: "no"})
	case "flush":
		return r.flush()
	case "got":
		needU()
		r.u.Got(arg(1))
	case "unget":
		needU()
		r.u.Unget(arg(1))
	case "hold":
		needU()
		title := ""
		if len(f) > 4 {
			title = f[4]
		}
		v := r.rows.row(arg(2), arg(3), title)
		r.u.Hold(rowIDOf(arg(2)), `{"id":"`+arg(2)+`"}`, arg(1), v)
	case "release":
		needU()
		r.u.Release(rowIDOf(arg(2)), arg(1))
	case "put?":
		needU()
		id := rowIDOf(arg(1))
		return []string{fmt.Sprintf("put? %s: %v", arg(1), r.u.Put(id, r.c.Rows[id]))}
	case "finish":
		needU()
		streamed := map[string]struct{}{}
		if len(f) > 2 && f[1] == "streamed" {
			for _, id := range f[2:] {
				streamed[rowIDOf(id)] = struct{}{}
			}
		}
		u := r.u
		r.u, r.last = nil, u
		if err := u.Finish(streamed); err != nil {
			return []string{"error: " + err.Error()}
		}
		r.c.Version = u.Version
		out := []string{fmt.Sprintf("version %s -> %s", nullable(u.From), nullable(u.Version))}
		for p := range u.Delta(nil) {
			out = append(out, "  "+patchString(p))
		}
		return out
	case "catchup":
		base, has := arg(1), arg(1) != "null"
		var out []string
		for p := range r.c.Catchup(base, has) {
			out = append(out, "  "+patchString(p))
		}
		slices.Sort(out)
		return append([]string{"catchup from " + arg(1)}, out...)
	case "start-clock":
		r.c.StartClock()
	case "stop-clock":
		r.c.StopClock(r.now)
	case "wait":
		r.now = r.now.Add(time.Duration(num(1)) * time.Millisecond)
	case "clock":
		return []string{fmt.Sprintf("clock %g", r.c.Clock())}
	case "expired":
		return []string{fmt.Sprintf("expired %s: %v", arg(1), r.c.Expired(arg(1), r.c.Clock()))}
	case "next-eviction":
		clock := r.c.Clock()
		next, ok := r.c.NextEviction(clock, slices.Values(f[1:]))
		if !ok {
			return []string{"next eviction: none"}
		}
		return []string{fmt.Sprintf("next eviction: %g (clock %g)", next, clock)}
	case "rows":
		var out []string
		for _, id := range sortedKeys(r.c.Rows) {
			rec := r.c.Rows[id]
			refs := "tombstone"
			if rec.Refs != nil {
				refs = "refs=" + strings.Join(sortedKeys(rec.Refs), ",")
			}
			out = append(out, fmt.Sprintf("  row %s v=%s pv=%s %s value=%v", rec.Key, rec.RowVersion, rec.PatchVersion, refs, !rec.Value.IsZero()))
		}
		return append([]string{"rows"}, out...)
	case "queries":
		var out []string
		for _, h := range sortedKeys(r.c.Queries) {
			q := r.c.Queries[h]
			out = append(out, fmt.Sprintf("  query %s got=%v everGot=%v pv=%s", h, q.Got, q.EverGot, q.PatchVersion))
		}
		return append([]string{"queries"}, out...)
	case "desires":
		var out []string
		for _, id := range sortedKeys(r.c.Clients) {
			cl := r.c.Clients[id]
			out = append(out, fmt.Sprintf("  client %s deleted=%v", id, cl.Deleted))
			for _, h := range sortedKeys(cl.Desired) {
				d := cl.Desired[h]
				s := fmt.Sprintf("    desire %s ttl=%v pv=%s", h, d.TTL, d.PatchVersion)
				if d.Inactive {
					s += fmt.Sprintf(" inactiveAt=%g expiresAt=%g", d.InactiveAt, d.ExpiresAt())
				}
				if d.Cleared {
					s += " cleared"
				}
				out = append(out, s)
			}
		}
		return append([]string{"desires"}, out...)
	default:
		t.Fatalf("unknown command %q", line)
	}
	return nil
}

// flush prints the events a durable flush of the last update would
// publish (Durable.Flush, but the publish), and records them written.
func (r *runner) flush() []string {
	c, u := r.c, r.last
	if u == nil {
		u = c.BeginConfig()
	}
	r.last = nil
	cfg, err := configEvents(c)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	evs := append(cfg, rowEvents(c, u)...)
	out := []string{"flush"}
	for _, ev := range evs {
		var s string
		switch ev.Op {
		case streams.CVROpClientSchema:
			s = "client-schema " + string(ev.ClientSchema)
		case streams.CVROpPutClient:
			s = fmt.Sprintf("put-client %s deleted=%v", ev.Client.ID, ev.Client.Deleted)
		case streams.CVROpPutDesire:
			d := ev.Desire
			s = fmt.Sprintf("put-desire %s %s ttl=%d cleared=%v pv=%s", d.ClientID, d.Hash, d.TTLMs, d.Cleared, d.PatchVersion)
			if d.InactivatedAtMs != nil {
				s += fmt.Sprintf(" inactivatedAt=%g", *d.InactivatedAtMs)
			}
		case streams.CVROpPutQuery:
			q := ev.Query
			s = fmt.Sprintf("put-query %s got=%v internal=%v pv=%s name=%q th=%q ast=%v", q.Hash, q.Got, q.Internal, q.PatchVersion, q.Name, q.TransformationHash, len(q.AST) > 0)
		case streams.CVROpPutRow:
			s = fmt.Sprintf("put-row %s v=%s pv=%s refs=%v", ev.Row.Key, ev.Row.RowVersion, ev.Row.PatchVersion, sortedKeys(ev.Row.Refs))
		case streams.CVROpPutRows:
			s = fmt.Sprintf("put-rows %s pv=%s refs=%v keys=%d", ev.Rows.Table, ev.Rows.PatchVersion, sortedKeys(ev.Rows.Refs), len(ev.Rows.Keys))
		default:
			s = string(ev.Op)
		}
		out = append(out, "  "+s)
	}
	c.schemaWritten, c.dirty = c.ClientSchema, dirty{}
	return out
}

func nullable(v string) string {
	if v == "" {
		return "null"
	}
	return v
}

func rowIDOf(id string) string { return KeyID("issue", []byte(`{"id":"`+id+`"}`)) }

func patchString(p Patch) string {
	op := "put"
	if p.Del {
		op = "del"
	}
	switch p.Kind {
	case DesirePatch:
		return fmt.Sprintf("desired %s %s %s", p.ClientID, op, p.Hash)
	case GotPatch:
		return fmt.Sprintf("got %s %s", op, p.Hash)
	default:
		if p.Del {
			return fmt.Sprintf("row del %s", p.Row.Key)
		}
		b, err := p.Row.Value.AppendJSON(nil)
		if err != nil {
			return "row put: " + err.Error()
		}
		return fmt.Sprintf("row put %s", b)
	}
}

// rowSource makes real row values: it reads them back from an in-memory
// SQLite table through a compiled query, as the view-syncer's pipelines do.
type rowSource struct {
	t  *testing.T
	db *sql.DB
	s  zql.Schema
}

func newRowSource(t *testing.T) *rowSource {
	db, err := sql.Open("sqlite", "file::memory:")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE issue (id TEXT PRIMARY KEY, title TEXT, _0_version TEXT)`); err != nil {
		t.Fatal(err)
	}
	s := zql.Schema{Tables: map[string]zql.TableSchema{"issue": {
		Columns:    []zql.Column{{Name: "id", Kind: zql.KindString}, {Name: "title", Kind: zql.KindString}},
		PrimaryKey: []string{"id"},
	}}}
	return &rowSource{t: t, db: db, s: s}
}

// row writes issue id at version with title and reads it back.
func (rs *rowSource) row(id, version, title string) zql.RowValue {
	t := rs.t
	if _, err := rs.db.Exec(`INSERT OR REPLACE INTO issue VALUES (?, ?, ?)`, id, title, version); err != nil {
		t.Fatal(err)
	}
	ast, err := zql.ParseAST([]byte(`{"table":"issue","where":{"type":"simple","op":"=","left":{"type":"column","name":"id"},"right":{"type":"literal","value":` + strconv.Quote(id) + `}}}`))
	if err != nil {
		t.Fatal(err)
	}
	q, err := zql.Compile(rs.s, ast)
	if err != nil {
		t.Fatal(err)
	}
	var got zql.RowValue
	if _, err := q.NewView().HydrateEach(context.Background(), rs.db, func(v zql.RowValue) error {
		got = v
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got.IsZero() {
		t.Fatalf("issue %s not read back", id)
	}
	return got
}
