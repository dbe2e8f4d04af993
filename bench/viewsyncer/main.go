// Command viewsyncer measures the sync server of `jetsync run` against
// zero-cache 1.9.0's figures (testdata/bench/README.md), on the benchmark
// dataset seeded with seed.sh 100000 (451,020 rows):
//
//   - server: a Go client speaking protocol v51 puts a query over the whole
//     issue table; the time from that put to the pokeEnd of the poke that
//     carries its gotQueriesPatch;
//   - client: the real @rocicorp/zero 1.9.0 client under Node 22 (client.mjs)
//     materializes the whole issue table; the time until the view reports
//     complete;
//   - groups: 50 Go clients, each its own group, connect at once with 5
//     legacy queries each; the time until every query is complete (its
//     gotQueriesPatch arrived in a finished poke);
//   - latency: 500 single-row UPDATEs of rows a connected client views; the
//     time from the commit returning to the pokeEnd carrying the change;
//   - loaded: the same at 1,000 single-row transactions per second offered
//     from 4 Postgres connections (issue 17, aim 3), with jetsync's CPU time
//     per transaction;
//   - rss: the jetsync process's peak RSS (VmHWM) after each measure.
//
// Usage: go run ./bench/viewsyncer [-measures server,client,groups,latency,loaded] [-runs 3]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
)

// zero-cache 1.9.0 on this machine (testdata/bench/README.md), and the
// issue's aims as fractions of them.
const (
	zcServerMS          = 2165 // median of 1,992 / 2,283 / 2,165 ms
	zcClientMS          = 2688 // 2,934–3,211 ms in later runs
	zcGroupsMS          = 5382
	zcP50, zcP95, zcP99 = 5.8, 11.5, 15.3
	zcRSSMiB            = 3289

	aimServer = 0.25
	aimClient = 0.6
	aimGroups = 0.33
	aimP50MS  = 3.0
	aimP99MS  = 8.0
	aimRSSMiB = 400

	// Issue 17's aims: hydration (aim 2), commit → client at 1,000 txn/s
	// (aim 3) and peak RSS (aim 5).
	aim17Server   = 0.15
	aim17P50MS    = 2.0
	aim17P99MS    = 4.0
	aim17RSSMiB   = 300
	aim17LoadRate = 1000
)

type options struct {
	issues   int
	data     string
	bin      string
	measures string
	runs     int
	clients  int
	updates  int
	rate     int
	latQs    string
	// loaded* shape the loaded measure.
	loadedRate, loadedConns, loadedUpdates int
	keep                                   bool
	hold                                   bool
	env                                    string
	verbose                                bool
	// otel runs the OpenTelemetry cost measure (otel.go) instead.
	otel      bool
	otelTxns  int
	otelPaced int
	otelRate  int
	// otelProfile, when set, is a folder for a CPU profile of each -otel
	// run's throughput measure.
	otelProfile string
}

func main() {
	var o options
	flag.IntVar(&o.issues, "issues", 100000, "seed.sh ISSUES (100000 gives 451,020 rows)")
	benchenv.DataFlag(&o.data)
	flag.StringVar(&o.bin, "bin", "bin/jetsync", "the jetsync binary (make build); built into a temporary folder when missing")
	flag.StringVar(&o.measures, "measures", "server,client,groups,latency,loaded", "comma-separated measures to run: server, client, groups, latency, loaded (rss is always reported)")
	flag.IntVar(&o.runs, "runs", 3, "repetitions of the server, client and groups measures; medians are reported")
	flag.IntVar(&o.clients, "clients", 50, "client groups in the groups measure (5 queries each)")
	flag.IntVar(&o.updates, "updates", 500, "single-row updates in the latency measure")
	flag.IntVar(&o.rate, "rate", 50, "updates per second in the latency measure")
	flag.IntVar(&o.loadedRate, "loaded-rate", aim17LoadRate, "single-row transactions per second offered in the loaded measure")
	flag.IntVar(&o.loadedConns, "loaded-conns", 4, "Postgres connections committing the loaded measure's transactions")
	flag.IntVar(&o.loadedUpdates, "loaded-updates", 5000, "single-row updates in the loaded measure")
	flag.StringVar(&o.latQs, "latency-queries", strings.Join(shapes, ","), "the queries the latency client holds (issuesWithLabels must be one: the updates retitle its rows)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (Postgres, jetsync's data and log)")
	flag.BoolVar(&o.verbose, "v", false, "print each run")
	flag.StringVar(&o.env, "jetsync-env", "", "extra environment for jetsync, comma-separated KEY=VALUE pairs (such as JETSYNC_PPROF_ADDR=127.0.0.1:6060)")
	flag.BoolVar(&o.hold, "hold", false, "after the measures, keep Postgres and jetsync running until interrupted (to point client.mjs or zero-cache at them)")
	flag.BoolVar(&o.otel, "otel", false, "measure what exporting OpenTelemetry costs instead: throughput and commit → client p50 with OTEL_* unset and set, side by side (otelside.go)")
	flag.IntVar(&o.otelTxns, "otel-txns", 3000, "transactions in the -otel throughput measure")
	flag.IntVar(&o.otelPaced, "otel-paced", 2000, "transactions in the -otel measure of CPU per transaction at a fixed offered rate")
	flag.IntVar(&o.otelRate, "otel-rate", 500, "the offered rate of that measure, transactions a second")
	flag.StringVar(&o.otelProfile, "otel-cpuprofile", "", "a folder to write a CPU profile of each -otel run's throughput measure into (off-<pair>.pprof, on-<pair>.pprof)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "viewsyncer:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	want := map[string]bool{}
	for _, m := range strings.Split(o.measures, ",") {
		switch m = strings.TrimSpace(m); m {
		case "server", "client", "groups", "latency", "loaded":
			want[m] = true
		case "", "rss":
		default:
			return fmt.Errorf("unknown measure %q", m)
		}
	}
	if o.runs < 1 {
		return errors.New("-runs must be at least 1")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	root, err := os.MkdirTemp("", "jetsync-bench-vs-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("temporary folder:", root)
	} else {
		defer os.RemoveAll(root)
	}
	bin, err := benchenv.JetsyncBin(ctx, o.bin, root)
	if err != nil {
		return err
	}

	up, err := startUpstream(ctx, root, o.data, o.issues)
	if err != nil {
		return err
	}
	defer up.close()

	if o.otel {
		return runOTelSide(ctx, o, bin, root, up)
	}
	js, err := startJetsync(ctx, bin, root, up.url, o.env)
	if err != nil {
		return err
	}
	defer js.Stop()
	fmt.Printf("jetsync ready in %v (replica applied), sync endpoint %s\n", js.readyIn.Round(time.Millisecond), js.Base)

	var rep report
	rep.rss = append(rep.rss, js.rss("ready"))
	if want["server"] {
		for i := range o.runs {
			cpu0 := js.cpu()
			r, err := measureServer(js.Base, i)
			r.cpu = js.cpu() - cpu0
			if err != nil {
				return fmt.Errorf("server hydration: %w", err)
			}
			if r.rows != o.issues {
				return fmt.Errorf("server hydration: got %d issue rows; want %d", r.rows, o.issues)
			}
			if o.verbose {
				fmt.Printf("server run %d: %v, %d rows, %.1f MB of frames, %v of jetsync's CPU (the put and the del)\n", i, r.took.Round(time.Millisecond), r.rows, float64(r.bytes)/1e6, r.cpu.Round(10*time.Millisecond))
			}
			rep.server = append(rep.server, r)
		}
		rep.rss = append(rep.rss, js.rss("server"))
	}
	if want["client"] {
		node, err := nodeBin()
		if err != nil {
			fmt.Println("client: skipped:", err)
		} else {
			rep.client, err = measureClient(ctx, node, js.Base, o.runs, o.issues)
			if err != nil {
				return fmt.Errorf("real client: %w", err)
			}
			if o.verbose {
				fmt.Println("client runs:", rep.client)
			}
			rep.rss = append(rep.rss, js.rss("client"))
		}
	}
	if want["groups"] {
		q := newQueries(o.issues)
		for i := range o.runs {
			d, err := measureGroups(ctx, js.Base, q, o.clients, i)
			if err != nil {
				return fmt.Errorf("groups: %w", err)
			}
			if o.verbose {
				fmt.Printf("groups run %d: %v\n", i, d.Round(time.Millisecond))
			}
			rep.groups = append(rep.groups, d)
		}
		rep.rss = append(rep.rss, js.rss("groups"))
	}
	if want["latency"] {
		// Groups the other measures left idle unload (GroupIdle) with a
		// burst of CVR writes: the latency is measured after them, with no
		// other group loaded.
		for deadline := time.Now().Add(time.Minute); js.metric("zero_sync_queries") > 0 && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
		}
		if n := js.metric("zero_sync_queries"); n != 0 {
			fmt.Printf("warning: the latency is measured with %v queries of other groups loaded\n", n)
		}
		l, err := measureLatency(ctx, js.Base, up.url, newQueries(o.issues), strings.Split(o.latQs, ","), o.updates, o.rate)
		if err != nil {
			return fmt.Errorf("latency: %w", err)
		}
		rep.latency = l
		rep.rss = append(rep.rss, js.rss("latency"))
	}
	if want["loaded"] {
		cpu0, err := benchenv.CPUTime(js.Cmd.Process.Pid)
		if err != nil {
			return err
		}
		seq0, adv0, pokes0 := js.metric("jetsync_stream_last_seq"), js.metric("jetsync_sync_advances_total"), js.metric("zero_sync_poke_transactions_total")
		l, rate, err := measureLoaded(ctx, js.Base, up.url, newQueries(o.issues), strings.Split(o.latQs, ","), o.loadedUpdates, o.loadedRate, o.loadedConns)
		if err != nil {
			return fmt.Errorf("loaded: %w", err)
		}
		cpu1, err := benchenv.CPUTime(js.Cmd.Process.Pid)
		if err != nil {
			return err
		}
		rep.loaded, rep.loadedRate, rep.loadedCPU = l, rate, (cpu1-cpu0)/time.Duration(l.n)
		// How many change messages, replica advances and pokes the
		// transactions took: what batching saves, less noisy than the
		// latencies on a shared machine.
		per := func(a, b int64) float64 { return float64(b-a) / float64(l.n) }
		rep.loadedMsgs = per(seq0, js.metric("jetsync_stream_last_seq"))
		rep.loadedAdvances = per(adv0, js.metric("jetsync_sync_advances_total"))
		rep.loadedPokes = per(pokes0, js.metric("zero_sync_poke_transactions_total"))
		rep.rss = append(rep.rss, js.rss("loaded"))
	}
	if err := js.AliveNoError(); err != nil {
		return err
	}
	rep.print(o)
	if o.hold {
		fmt.Printf("holding: upstream %s, sync endpoint %s, jetsync pid %d; interrupt to stop\n", up.url, js.Base, js.Cmd.Process.Pid)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
	}
	return nil
}

// nodeBin is the Node 22 that make node-deps installs (scripts/node22).
func nodeBin() (string, error) {
	out, err := exec.Command("scripts/node22", "--path").Output()
	if err != nil {
		return "", fmt.Errorf("node 22 not found (make node-deps): %w", err)
	}
	node := strings.TrimSpace(string(out))
	if _, err := os.Stat(node); err != nil {
		return "", fmt.Errorf("node 22 not found (make node-deps): %w", err)
	}
	return node, nil
}

type report struct {
	server  []serverRun
	client  []time.Duration
	groups  []time.Duration
	latency *latencies
	rss     []rssSample
	// loaded is the loaded measure's latencies, at loadedRate txn/s
	// committed, with jetsync's CPU time per transaction.
	loaded     *latencies
	loadedRate float64
	loadedCPU  time.Duration
	// Change messages, replica advances and pokes per transaction.
	loadedMsgs, loadedAdvances, loadedPokes float64
}

func (r report) print(o options) {
	var aims []benchenv.Aim
	fmt.Println()
	fmt.Printf("| measure (seed.sh %d) | jetsync | zero-cache 1.9.0 | ratio | aim |\n", o.issues)
	fmt.Println("|---|---|---|---|---|")
	if len(r.server) > 0 {
		ds := make([]time.Duration, len(r.server))
		for i, s := range r.server {
			ds[i] = s.took
		}
		m := median(ds)
		fmt.Printf("| server side: whole `issue` table (%d rows, %.1f MB of frames), put → pokeEnd with its gotQueriesPatch; median of %d (%s) | %d ms | %d ms | %.2f× | ≤ %.2f× %s |\n",
			r.server[0].rows, float64(r.server[0].bytes)/1e6, len(ds), list(ds), m.Milliseconds(), zcServerMS, ratio(m, zcServerMS), aimServer, met(ratio(m, zcServerMS) <= aimServer))
		aims = append(aims, benchenv.Aim{Issue: 17, Name: fmt.Sprintf("whole-table hydration, server side, seed.sh %d (median of %d)", o.issues, len(ds)),
			Figure: fmt.Sprintf("%d ms, %.2f×", m.Milliseconds(), ratio(m, zcServerMS)), Target: fmt.Sprintf("≤ %.2f×", aim17Server),
			Ref: fmt.Sprintf("%d ms", zcServerMS), Met: ratio(m, zcServerMS) <= aim17Server})
	}
	if len(r.client) > 0 {
		m := median(r.client)
		fmt.Printf("| one real client (@rocicorp/zero 1.9.0, Node 22) hydrating the whole `issue` table until complete; median of %d (%s) | %d ms | %d ms (2,934–3,211 later) | %.2f× | ≤ %.2f× %s |\n",
			len(r.client), list(r.client), m.Milliseconds(), zcClientMS, ratio(m, zcClientMS), aimClient, met(ratio(m, zcClientMS) <= aimClient))
		aims = append(aims, benchenv.Aim{Issue: 4, Name: fmt.Sprintf("whole-table hydration, one real client until complete (median of %d)", len(r.client)),
			Figure: fmt.Sprintf("%d ms, %.2f×", m.Milliseconds(), ratio(m, zcClientMS)), Target: fmt.Sprintf("≤ %.2f×", aimClient),
			Ref: fmt.Sprintf("%d ms", zcClientMS), Met: ratio(m, zcClientMS) <= aimClient})
	}
	if len(r.groups) > 0 {
		m := median(r.groups)
		fmt.Printf("| %d clients × 5 queries, each its own group, until all complete; median of %d (%s) | %d ms | %d ms | %.2f× | ≤ %.2f× %s |\n",
			o.clients, len(r.groups), list(r.groups), m.Milliseconds(), zcGroupsMS, ratio(m, zcGroupsMS), aimGroups, met(ratio(m, zcGroupsMS) <= aimGroups))
		aims = append(aims, benchenv.Aim{Issue: 4, Name: fmt.Sprintf("%d groups × 5 queries until all complete (median of %d)", o.clients, len(r.groups)),
			Figure: fmt.Sprintf("%d ms, %.2f×", m.Milliseconds(), ratio(m, zcGroupsMS)), Target: fmt.Sprintf("≤ %.2f×", aimGroups),
			Ref: fmt.Sprintf("%d ms", zcGroupsMS), Met: ratio(m, zcGroupsMS) <= aimGroups})
	}
	if l := r.latency; l != nil {
		fmt.Printf("| commit → client poke, %d single-row updates at %d/s, the client holding %d queries, p50 / p95 / p99 | %.1f / %.1f / %.1f ms | %.1f / %.1f / %.1f ms | %.2f× / %.2f× / %.2f× | p50 ≤ %.0f ms %s, p99 ≤ %.0f ms %s |\n",
			l.n, o.rate, l.queries, ms(l.p50), ms(l.p95), ms(l.p99), zcP50, zcP95, zcP99,
			ms(l.p50)/zcP50, ms(l.p95)/zcP95, ms(l.p99)/zcP99, aimP50MS, met(ms(l.p50) <= aimP50MS), aimP99MS, met(ms(l.p99) <= aimP99MS))
		aims = append(aims, benchenv.Aim{Issue: 4, Name: fmt.Sprintf("commit → client at %d txn/s, p50 / p99", o.rate),
			Figure: fmt.Sprintf("%.1f / %.1f ms", ms(l.p50), ms(l.p99)), Target: fmt.Sprintf("≤ %.0f / %.0f ms", aimP50MS, aimP99MS),
			Ref: fmt.Sprintf("%.1f / %.1f ms", zcP50, zcP99), Met: ms(l.p50) <= aimP50MS && ms(l.p99) <= aimP99MS})
	}
	if l := r.loaded; l != nil {
		fmt.Printf("| commit → client poke, %d single-row updates offered at %d/s from %d connections (%.0f/s committed), p50 / p95 / p99; per transaction: jetsync CPU %.3f ms, %.2f change messages, %.2f advances, %.2f pokes | %.1f / %.1f / %.1f ms | | | p50 ≤ %.0f ms %s, p99 ≤ %.0f ms %s |\n",
			l.n, o.loadedRate, o.loadedConns, r.loadedRate, ms(r.loadedCPU), r.loadedMsgs, r.loadedAdvances, r.loadedPokes, ms(l.p50), ms(l.p95), ms(l.p99),
			aim17P50MS, met(ms(l.p50) <= aim17P50MS), aim17P99MS, met(ms(l.p99) <= aim17P99MS))
		// The aim is at 1,000 txn/s: a run Postgres could not commit at
		// nine tenths of that rate has not measured it.
		atRate := r.loadedRate >= 0.9*aim17LoadRate
		fig := fmt.Sprintf("%.1f / %.1f ms at %.0f txn/s", ms(l.p50), ms(l.p99), r.loadedRate)
		aims = append(aims, benchenv.Aim{Issue: 17, Name: "commit → client at 1,000 txn/s, p50 / p99",
			Figure: fig, Target: fmt.Sprintf("≤ %.0f / %.0f ms", aim17P50MS, aim17P99MS), Ref: "5.4 / 14.3 ms at low rates",
			Met: atRate && ms(l.p50) <= aim17P50MS && ms(l.p99) <= aim17P99MS})
	}
	if len(r.rss) > 0 {
		last := r.rss[len(r.rss)-1]
		var steps []string
		for _, s := range r.rss {
			steps = append(steps, fmt.Sprintf("%s %d (live heap ~%d)", s.after, s.hwm>>20, s.live>>20))
		}
		fmt.Printf("| peak RSS of the jetsync process (VmHWM; MiB after each step: %s) | %d MiB | %d MiB | %.2f× | ≤ %d MiB %s |\n",
			strings.Join(steps, ", "), last.hwm>>20, zcRSSMiB, float64(last.hwm>>20)/zcRSSMiB, aimRSSMiB, met(last.hwm>>20 <= aimRSSMiB))
		aims = append(aims, benchenv.Aim{Issue: 17, Name: "peak RSS of bench/viewsyncer's jetsync (VmHWM)",
			Figure: fmt.Sprintf("%d MiB", last.hwm>>20), Target: fmt.Sprintf("≤ %d MiB", aim17RSSMiB),
			Ref: fmt.Sprintf("%d MiB", zcRSSMiB), Met: last.hwm>>20 <= aim17RSSMiB})
	}
	fmt.Println()
	for _, a := range aims {
		benchenv.Report(a)
	}
}

func met(ok bool) string {
	if ok {
		return "(met)"
	}
	return "(not met)"
}

func ratio(d time.Duration, refMS float64) float64 { return ms(d) / refMS }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func list(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprint(d.Milliseconds())
	}
	return strings.Join(parts, " / ") + " ms"
}
