package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	collmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
)

// The issue's aims for the cost of exporting OpenTelemetry.
const (
	aimOTelThroughputCost = 0.05 // of throughput
	aimOTelP50CostMS      = 0.3  // of commit → client p50
)

// otlpSink is an in-process OTLP/gRPC receiver that counts what it gets.
type otlpSink struct {
	colltrace.UnimplementedTraceServiceServer
	spans, points atomic.Int64
	addr          string
	srv           *grpc.Server
}

type otlpMetricSink struct {
	collmetrics.UnimplementedMetricsServiceServer
	*otlpSink
}

func (s *otlpSink) Export(_ context.Context, r *colltrace.ExportTraceServiceRequest) (*colltrace.ExportTraceServiceResponse, error) {
	for _, rs := range r.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			s.spans.Add(int64(len(ss.GetSpans())))
		}
	}
	return &colltrace.ExportTraceServiceResponse{}, nil
}

func (s otlpMetricSink) Export(_ context.Context, r *collmetrics.ExportMetricsServiceRequest) (*collmetrics.ExportMetricsServiceResponse, error) {
	for _, rm := range r.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			s.points.Add(int64(len(sm.GetMetrics())))
		}
	}
	return &collmetrics.ExportMetricsServiceResponse{}, nil
}

func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{addr: ln.Addr().String(), srv: grpc.NewServer()}
	colltrace.RegisterTraceServiceServer(s.srv, s)
	collmetrics.RegisterMetricsServiceServer(s.srv, otlpMetricSink{otlpSink: s})
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

type otelRun struct {
	throughput float64 // transactions per second, commit to client
	// cpuPerTxn is the jetsync process's CPU time (user and system) over
	// the throughput measure, per transaction: on a loaded machine a
	// steadier figure of the work than the wall clock.
	cpuPerTxn time.Duration
	// pacedCPUPerTxn is the same at a fixed offered rate (-otel-rate),
	// which both kinds of run get alike: what an operator's process
	// spends on each transaction, background work included.
	pacedCPUPerTxn time.Duration
	// steadyCPU is the process's CPU share over the latency measure: one
	// transaction a message at a fixed rate, so that batching does not
	// move it, and what the export adds shows.
	steadyCPU float64
	p50       time.Duration
}

// otelMetricInterval is the metrics export interval of the runs with
// export on, in ms: twelve times the default (60 s, zero-cache's too), so
// that each run exports a few times.
const otelMetricInterval = 5000

// runOTel measures what exporting OpenTelemetry costs: `jetsync run` with
// no OTEL_* set, and with metrics (every otelMetricInterval) and traces
// (the default sampling) exported over OTLP/gRPC to a receiver in this
// process. Runs alternate off and on (off first in even pairs, on first in
// odd ones), each on a fresh data folder, so that load drifting on the
// machine falls on both; the verdicts are the medians of the pairs'
// differences.
func runOTel(ctx context.Context, o options, bin, root string, up *upstream) error {
	sink, err := startOTLPSink()
	if err != nil {
		return err
	}
	defer sink.srv.Stop()
	q := newQueries(o.issues)
	var off, on []otelRun
	for pair := range o.runs {
		modes := []bool{false, true}
		if pair%2 == 1 {
			modes = []bool{true, false}
		}
		for _, withOTel := range modes {
			env := []string{"JETSYNC_BACKUP=off", "JETSYNC_DATA_DIR=" + filepath.Join(root, fmt.Sprintf("data-%d-%v", pair, withOTel))}
			if withOTel {
				env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+sink.addr, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
					"OTEL_METRIC_EXPORT_INTERVAL="+strconv.Itoa(otelMetricInterval))
			}
			if o.env != "" {
				env = append(env, o.env)
			}
			spans0, points0 := sink.spans.Load(), sink.points.Load()
			profile := ""
			if o.otelProfile != "" {
				kind := map[bool]string{false: "off", true: "on"}[withOTel]
				profile = filepath.Join(o.otelProfile, fmt.Sprintf("%s-%d.pprof", kind, pair))
				port, err := benchenv.FreePort()
				if err != nil {
					return err
				}
				env = append(env, fmt.Sprintf("JETSYNC_PPROF_ADDR=127.0.0.1:%d", port))
			}
			r, err := measureOTelRun(ctx, bin, root, up.url, strings.Join(env, ","), q, o, profile)
			if err != nil {
				return fmt.Errorf("otel %v, pair %d: %w", withOTel, pair, err)
			}
			if withOTel {
				// -jetsync-env OTEL_TRACES_EXPORTER=none (or METRICS)
				// measures one signal alone.
				if sink.spans.Load() == spans0 && sink.points.Load() == points0 {
					return fmt.Errorf("otel on, pair %d: the receiver got nothing", pair)
				}
				on = append(on, r)
			} else {
				if sink.spans.Load() != spans0 || sink.points.Load() != points0 {
					return fmt.Errorf("otel off, pair %d: something was exported", pair)
				}
				off = append(off, r)
			}
			if o.verbose {
				fmt.Printf("pair %d otel=%v: %.0f txn/s, %v CPU/txn; %v CPU/txn at %d/s offered; p50 %.2f ms, %.1f%% of a core at %d/s\n",
					pair, withOTel, r.throughput, r.cpuPerTxn, r.pacedCPUPerTxn, o.otelRate, ms(r.p50), 100*r.steadyCPU, o.rate)
			}
		}
	}
	printOTel(o, "alternating pairs", off, on, sink, nil)
	return nil
}

func measureOTelRun(ctx context.Context, bin, root, pgURL, env string, q queries, o options, profile string) (otelRun, error) {
	js, err := startJetsync(ctx, bin, root, pgURL, env)
	if err != nil {
		return otelRun{}, err
	}
	defer js.Stop()
	if profile != "" {
		addr := ""
		for _, kv := range strings.Split(env, ",") {
			if v, ok := strings.CutPrefix(kv, "JETSYNC_PPROF_ADDR="); ok {
				addr = v
			}
		}
		done := make(chan error, 1)
		go func() { done <- fetchProfile(ctx, addr, profile) }()
		defer func() {
			if err := <-done; err != nil {
				fmt.Fprintln(os.Stderr, "cpu profile:", err)
			}
		}()
	}
	cpu0, err := procCPU(js.Cmd.Process.Pid)
	if err != nil {
		return otelRun{}, err
	}
	tput, err := measureThroughput(ctx, js.Base, pgURL, q, o.otelTxns, 0)
	if err != nil {
		return otelRun{}, fmt.Errorf("throughput: %w", err)
	}
	cpu1, err := procCPU(js.Cmd.Process.Pid)
	if err != nil {
		return otelRun{}, err
	}
	if _, err := measureThroughput(ctx, js.Base, pgURL, q, o.otelPaced, o.otelRate); err != nil {
		return otelRun{}, fmt.Errorf("paced: %w", err)
	}
	cpu1b, err := procCPU(js.Cmd.Process.Pid)
	if err != nil {
		return otelRun{}, err
	}
	cpu2, t2 := cpu1b, time.Now()
	l, err := measureLatency(ctx, js.Base, pgURL, q, strings.Split(o.latQs, ","), o.updates, o.rate)
	if err != nil {
		return otelRun{}, fmt.Errorf("latency: %w", err)
	}
	cpu3, err := procCPU(js.Cmd.Process.Pid)
	if err != nil {
		return otelRun{}, err
	}
	steady := (cpu3 - cpu2).Seconds() / time.Since(t2).Seconds()
	if err := js.AliveNoError(); err != nil {
		return otelRun{}, err
	}
	return otelRun{throughput: tput, cpuPerTxn: (cpu1 - cpu0) / time.Duration(o.otelTxns),
		pacedCPUPerTxn: (cpu1b - cpu1) / time.Duration(o.otelPaced), steadyCPU: steady, p50: l.p50}, nil
}

// measureThroughput commits n single-row UPDATE transactions from four
// connections, as fast as they go or, with rate > 0, at most rate a second
// in all, each retitling one of the first 28 issues, which a connected
// client's issuesWithLabels shows, and returns n over the time from the
// first commit to the pokeEnd that carries the last title of every one of
// the 28 (pokes coalesce, so earlier titles may never show).
func measureThroughput(ctx context.Context, base, pgURL string, q queries, n, rate int) (float64, error) {
	qs, err := q.named(0, []string{"issuesWithLabels"})
	if err != nil {
		return 0, err
	}
	c, err := connectGroup(base, fmt.Sprintf("bench-tput-%d", time.Now().UnixNano()), qs)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, _, err := c.WaitGot(hashes(qs)...); err != nil {
		return 0, err
	}
	// Writer w owns rows w, w+writers, ... (of the first 28, a multiple of
	// writers): a row's last title is its own writer's last update of it.
	const writers, rows = 4, 28
	marker := fmt.Sprintf("tput-%d-", time.Now().UnixNano())
	final := map[string]bool{}
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	for w := range writers {
		per := n / writers
		for k := max(0, per-rows/writers); k < per; k++ {
			final[retitled(marker, w, writers, k)] = true
		}
		goRetitle(g, gctx, pgURL, marker, w, writers, rows, per, rate)
	}
	n = writers * (n / writers)
	seen := make(chan time.Time, 1)
	go func() {
		left := len(final)
		for left > 0 {
			p, err := c.NextPoke(marker)
			if err != nil {
				close(seen)
				return
			}
			for _, m := range p.Markers {
				if final[m] {
					delete(final, m)
					left--
				}
			}
			if left == 0 {
				seen <- p.End
			}
		}
	}()
	if err := g.Wait(); err != nil {
		return 0, err
	}
	select {
	case end, ok := <-seen:
		if !ok {
			return 0, fmt.Errorf("the client's connection failed before every last title arrived")
		}
		return float64(n) / end.Sub(start).Seconds(), nil
	case <-time.After(time.Minute):
		c.Close()
		return 0, fmt.Errorf("not every last title reached the client within a minute of the last commit: %w", errTimeout)
	}
}

// lag, from side-by-side rounds, is every update's arrival at the
// exporting process's client less its arrival at the other's.
func printOTel(o options, mode string, off, on []otelRun, sink *otlpSink, lag []time.Duration) {
	field := func(rs []otelRun, f func(otelRun) float64) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = f(r)
		}
		return out
	}
	// Each pair ran back to back or side by side: the median of the pairs'
	// differences cancels the load that drifts between pairs, which the
	// medians of each kind's runs do not.
	paired := func(diff func(off, on otelRun) float64) []float64 {
		var out []float64
		for i := range min(len(off), len(on)) {
			out = append(out, diff(off[i], on[i]))
		}
		return out
	}
	tput := func(r otelRun) float64 { return r.throughput }
	cpu := func(r otelRun) float64 { return float64(r.cpuPerTxn.Microseconds()) }
	paced := func(r otelRun) float64 { return float64(r.pacedCPUPerTxn.Nanoseconds()) / 1000 }
	share := func(r otelRun) float64 { return 100 * r.steadyCPU }
	p50 := func(r otelRun) float64 { return ms(r.p50) }
	rel := func(f func(otelRun) float64) func(off, on otelRun) float64 {
		return func(off, on otelRun) float64 { return 100 * (f(on)/f(off) - 1) }
	}
	abs := func(f func(otelRun) float64) func(off, on otelRun) float64 {
		return func(off, on otelRun) float64 { return f(on) - f(off) }
	}
	dTput := paired(func(off, on otelRun) float64 { return 100 * (1 - on.throughput/off.throughput) })
	dCPU, dPaced, dShare, dP50 := paired(rel(cpu)), paired(rel(paced)), paired(abs(share)), paired(abs(p50))

	fmt.Println()
	fmt.Printf("OpenTelemetry export cost (seed.sh %d; %d %s; on: metrics every %d s, traces at the default sampling (%d transactions a second), OTLP/gRPC to an in-process receiver, which got %d spans and %d metric streams)\n\n",
		o.issues, len(off), mode, otelMetricInterval/1000, 10, sink.spans.Load(), sink.points.Load())
	fmt.Println("| measure | OTel off, median | OTel on, median | cost: median of the pairs' differences (each pair's) |")
	fmt.Println("|---|---|---|---|")
	row := func(name, unit string, f func(otelRun) float64, d []float64, dunit string) {
		fmt.Printf("| %s | %.1f %s | %.1f %s | %+.2f%s (%s) |\n", name, medianF(field(off, f)), unit, medianF(field(on, f)), unit, medianF(d), dunit, floats1(d, 1))
	}
	row(fmt.Sprintf("throughput: %d single-row transactions from 4 connections as fast as they commit, first commit → the client's poke with the last", o.otelTxns), "txn/s", tput, dTput, "% slower")
	row("jetsync's CPU time per transaction over that measure", "µs", cpu, dCPU, "%")
	row(fmt.Sprintf("jetsync's CPU time per transaction at %d txn/s offered (%d transactions)", o.otelRate, o.otelPaced), "µs", paced, dPaced, "%")
	row(fmt.Sprintf("jetsync's CPU share at %d updates/s", o.rate), "% of a core", share, dShare, " points")
	row(fmt.Sprintf("commit → client poke p50, %d updates at %d/s", o.updates, o.rate), "ms", p50, dP50, " ms")
	// The p50s' difference carries the noise of two medians of a loaded
	// machine's latencies; side by side, each update's own difference
	// does not, and its median is what the export adds to a commit's way
	// to the client.
	p50Cost, p50What := medianF(dP50), fmt.Sprintf("paired median of %d", len(dP50))
	if len(lag) > 0 {
		ls := make([]float64, len(lag))
		for i, d := range lag {
			ls[i] = ms(d)
		}
		slices.Sort(ls)
		fmt.Printf("| each update's arrival at the exporting process's client less the other's (%d updates): median [p25, p75] | | | %+.3f ms [%+.3f, %+.3f] |\n",
			len(ls), medianF(ls), ls[len(ls)/4], ls[len(ls)*3/4])
		p50Cost = medianF(ls)
		p50What = fmt.Sprintf("median of %d updates' differences; of the rounds' p50s: %+.2f ms", len(ls), medianF(dP50))
	}
	fmt.Println()
	// Postgres's commit rate bounds the throughput measure: jetsync uses
	// well under a core of the two there. What the export takes from
	// throughput where jetsync is the bound is its CPU per transaction at
	// the same offered load.
	benchenv.Report(benchenv.Aim{Issue: 16,
		Name: fmt.Sprintf("OpenTelemetry export: throughput cost, as jetsync's CPU per transaction at %d txn/s offered (paired median of %d; throughput as fast as Postgres commits: %.1f%%)",
			o.otelRate, len(dPaced), medianF(dTput)),
		Figure: fmt.Sprintf("%+.1f%%", medianF(dPaced)),
		Target: fmt.Sprintf("< %.0f%%", 100*aimOTelThroughputCost),
		Met:    medianF(dPaced) < 100*aimOTelThroughputCost,
	})
	benchenv.Report(benchenv.Aim{Issue: 16,
		Name:   fmt.Sprintf("OpenTelemetry export: commit → client p50 cost, %d updates at %d/s (%s)", o.updates, o.rate, p50What),
		Figure: fmt.Sprintf("%+.2f ms", p50Cost),
		Target: fmt.Sprintf("< %.1f ms", aimOTelP50CostMS),
		Met:    p50Cost < aimOTelP50CostMS,
	})
}

// medianF is the median of fs (the mean of the middle two for an even
// count).
func medianF(fs []float64) float64 {
	if len(fs) == 0 {
		return 0
	}
	s := slices.Clone(fs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// fetchProfile saves two seconds of the CPU profile of the jetsync serving
// pprof on addr, from now: the throughput measure's steady part.
func fetchProfile(ctx context.Context, addr, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/profile?seconds=2", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", req.URL, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func floats1(fs []float64, scale float64) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = strconv.FormatFloat(f*scale, 'f', 2, 64)
	}
	return strings.Join(s, ", ")
}

// procCPU is pid's user and system CPU time so far, from /proc/pid/stat
// (clock ticks of 1/100 s, Linux's USER_HZ).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command, which is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b)[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad times %q %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// goRetitle starts writer w of writers on g: per single-row UPDATEs, rate
// a second across the writers (as fast as they go when rate is 0). Writer
// w owns issues w+1, w+1+writers, ... of the first rows (a multiple of
// writers), and titles its k-th update retitled(marker, w, writers, k), so
// that a row's last title is its own writer's last update of it.
func goRetitle(g *errgroup.Group, ctx context.Context, pgURL, marker string, w, writers, rows, per, rate int) {
	g.Go(func() error {
		pg, err := pgx.Connect(ctx, pgURL)
		if err != nil {
			return err
		}
		defer pg.Close(context.WithoutCancel(ctx))
		var tick <-chan time.Time
		if rate > 0 {
			t := time.NewTicker(time.Second * time.Duration(writers) / time.Duration(rate))
			defer t.Stop()
			tick = t.C
		}
		for k := range per {
			if tick != nil {
				<-tick
			}
			id := fmt.Sprintf("i%07d", 1+w+writers*(k%(rows/writers)))
			if _, err := pg.Exec(ctx, `UPDATE issue SET title = $1 WHERE id = $2`, retitled(marker, w, writers, k), id); err != nil {
				return err
			}
		}
		return nil
	})
}

// retitled is the title writer w of writers gives its k-th update.
func retitled(marker string, w, writers, k int) string { return marker + strconv.Itoa(w+writers*k) }
