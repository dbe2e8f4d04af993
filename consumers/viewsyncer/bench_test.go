package viewsyncer

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/consumers/zql"
)

// BenchmarkHydrateIssues times, server side and end to end over a real
// socket, one new group's query for the whole issue table: from the put to
// the pokeEnd carrying its gotQueriesPatch. VIEWSYNCER_BENCH_ISSUES sets the
// table size (default 10,000; the issue's figure is for 100,000).
func BenchmarkHydrateIssues(b *testing.B) {
	issues := 10000
	if s := os.Getenv("VIEWSYNCER_BENCH_ISSUES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		issues = n
	}
	// VIEWSYNCER_BENCH_DURABLE=1 keeps the CVRs on the JetStream CVR
	// stream, as jetsync run does.
	// VIEWSYNCER_BENCH_REMOVE=1 removes each group's query after it
	// hydrated, so the live heap is what a group keeps after its query.
	remove := os.Getenv("VIEWSYNCER_BENCH_REMOVE") != ""
	e := newEnv(b, envOptions{issues: issues, durable: os.Getenv("VIEWSYNCER_BENCH_DURABLE") != ""})
	proto, err := encodeSecProtocol(secProtocol{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var total time.Duration
	var bytes int
	i := 0
	for b.Loop() {
		i++
		q := url.Values{"clientGroupID": {fmt.Sprint("bench", i)}, "clientID": {"c"}, "ts": {"1"}, "lmid": {"0"}}
		ws := dialWS(b, e, "/sync/v51/connect", q, proto)
		readFrame(b, ws) // connected
		start := time.Now()
		init := initFrame(testSchema, put("all", `{"table":"issue","orderBy":[["id","asc"]]}`, 0))
		if err := ws.WriteMessage(websocket.TextMessage, []byte(init)); err != nil {
			b.Fatal(err)
		}
		pokes := 0
		for pokes < 2 {
			tag, body := readFrame(b, ws)
			switch tag {
			case "pokePart":
				bytes += len(body)
			case "pokeEnd":
				pokes++
			}
		}
		total += time.Since(start)
		if remove {
			// As bench/viewsyncer does: the query goes, with TTL 0.
			del := `["changeDesiredQueries",{"desiredQueriesPatch":[{"op":"del","hash":"all"}]}]`
			if err := ws.WriteMessage(websocket.TextMessage, []byte(del)); err != nil {
				b.Fatal(err)
			}
			for gone := false; !gone; {
				tag, body := readFrame(b, ws)
				gone = tag == "pokePart" && strings.Contains(string(body), `"gotQueriesPatch":[{"op":"del"`)
			}
		}
		ws.Close()
	}
	// The groups stay loaded (GroupIdle): what each holds is the live heap
	// beyond the env's own, over the groups.
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "MiB-live-heap")
	if f := os.Getenv("VIEWSYNCER_BENCH_HEAPPROFILE"); f != "" {
		out, err := os.Create(f)
		if err != nil {
			b.Fatal(err)
		}
		defer out.Close()
		if err := pprof.WriteHeapProfile(out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(i), "ms/hydration")
	b.ReportMetric(float64(bytes)/float64(i)/(1<<20), "MiB/hydration")
}

// BenchmarkAdvanceQuiet times one commit, from the UPDATE upstream to the
// pokeEnd that carries it, to a watcher advanced after many groups that
// hold a query on the changed table but none of the changed rows (issue
// 15's reconnect storm, after the storm): what the watcher waits for
// while the advance visits them. VIEWSYNCER_BENCH_GROUPS sets their
// number (default 300); VIEWSYNCER_BENCH_DURABLE=1 keeps the CVRs on
// JetStream.
func BenchmarkAdvanceQuiet(b *testing.B) {
	groups := 300
	if s := os.Getenv("VIEWSYNCER_BENCH_GROUPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		groups = n
	}
	e := newEnv(b, envOptions{issues: 30, durable: os.Getenv("VIEWSYNCER_BENCH_DURABLE") != ""})
	proto, err := encodeSecProtocol(secProtocol{})
	if err != nil {
		b.Fatal(err)
	}
	open := func(group, query string) *websocket.Conn {
		q := url.Values{"clientGroupID": {group}, "clientID": {"c"}, "ts": {"1"}, "lmid": {"0"}}
		ws := dialWS(b, e, "/sync/v51/connect", q, proto)
		readFrame(b, ws) // connected
		if err := ws.WriteMessage(websocket.TextMessage, []byte(initFrame(testSchema, put("q", query, 0)))); err != nil {
			b.Fatal(err)
		}
		for got := false; !got; {
			tag, body := readFrame(b, ws)
			got = tag == "pokePart" && strings.Contains(string(body), `"gotQueriesPatch":[{"op":"put"`)
		}
		for tag := ""; tag != "pokeEnd"; {
			tag, _ = readFrame(b, ws)
		}
		return ws
	}
	// u000005 owns i0000004, i0000014 and i0000024; the watched row
	// i0000001 is u000002's.
	quiet := `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"literal","value":"u000005"},"op":"="},"orderBy":[["modified","desc"],["id","asc"]],"limit":20}`
	for g := range groups {
		defer open(fmt.Sprintf("quiet-%04d", g), quiet).Close()
	}
	// Groups are advanced in ID order: the watcher's comes last.
	w := open("watcher", `{"table":"issue","orderBy":[["id","asc"]],"limit":3}`)
	defer w.Close()
	var full atomic.Int64
	hook := func(id string) {
		if strings.HasPrefix(id, "quiet-") {
			full.Add(1)
		}
	}
	advanceHook.Store(&hook)
	defer advanceHook.Store(nil)
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	i := 0
	for b.Loop() {
		i++
		title := fmt.Sprintf("t%d", i)
		e.execSQL("UPDATE issue SET title = '" + title + "' WHERE id = 'i0000001'")
		for seen := false; ; {
			tag, body := readFrame(b, w)
			seen = seen || tag == "pokePart" && strings.Contains(string(body), `"`+title+`"`)
			if seen && tag == "pokeEnd" {
				break
			}
		}
	}
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	// The process's CPU (the server, its replicator and NATS, and the
	// clients) per commit: less noisy than the time on a shared machine.
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(i), "cpu-ms/op")
	b.ReportMetric(float64(full.Load())/float64(i), "full-advances/op")
}

// BenchmarkAffected is the Affects checks of one commit, the retitle of a
// hot issue, against the queries of 1,000 quiet groups as bench/storm
// holds them (one issue with its comments, one owner's latest issues):
// what passQuiet runs for every quiet group at every commit.
func BenchmarkAffected(b *testing.B) {
	sch := zql.Schema{Tables: map[string]zql.TableSchema{
		"issue": {Columns: []zql.Column{{Name: "id", Kind: zql.KindString}, {Name: "title", Kind: zql.KindString},
			{Name: "open", Kind: zql.KindBoolean}, {Name: "modified", Kind: zql.KindNumber},
			{Name: "owner_id", Kind: zql.KindString}, {Name: "created", Kind: zql.KindNumber}}, PrimaryKey: []string{"id"}},
		"comment": {Columns: []zql.Column{{Name: "id", Kind: zql.KindString}, {Name: "issue_id", Kind: zql.KindString},
			{Name: "body", Kind: zql.KindString}, {Name: "created", Kind: zql.KindNumber}}, PrimaryKey: []string{"id"}},
	}}
	var pipes []*pipeline
	for g := range 1000 {
		for _, src := range []string{
			fmt.Sprintf(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"i%07d"},"op":"="},"limit":1,
				"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","asc"]]}}]}`, 100+g),
			fmt.Sprintf(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"literal","value":"u%06d"},"op":"="},
				"orderBy":[["modified","desc"],["id","asc"]],"limit":20}`, 10+g%90),
		} {
			var ast zql.AST
			if err := json.Unmarshal([]byte(src), &ast); err != nil {
				b.Fatal(err)
			}
			q, err := zql.Compile(sch, &ast)
			if err != nil {
				b.Fatal(err)
			}
			pipes = append(pipes, &pipeline{query: q})
		}
	}
	row := func(title string) map[string]any {
		return map[string]any{"id": "i0000001", "title": title, "open": int64(1), "modified": 1.7e12, "owner_id": "u000002", "created": 1.6e12}
	}
	i := 0
	for b.Loop() {
		i++
		cs := &changeSet{}
		cs.add([]replicator.RowChange{{Table: "issue", Old: row(fmt.Sprint(i - 1)), New: row(fmt.Sprint(i))}})
		for _, p := range pipes {
			if p.affected(cs) {
				b.Fatal("a quiet group's query is affected")
			}
		}
	}
}
