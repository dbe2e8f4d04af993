package viewsyncer

import (
	"fmt"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
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
