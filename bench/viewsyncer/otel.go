package main

import (
	"context"
	"fmt"
	"net"
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
	// steadyCPU is the process's CPU share over the latency measure: one
	// transaction a message at a fixed rate, so that batching does not
	// move it, and what the export adds shows.
	steadyCPU float64
	p50       time.Duration
}

// runOTel measures what exporting OpenTelemetry costs: `jetsync run` with
// no OTEL_* set, and with metrics (every second, sixty times the default
// rate) and traces (the default sampling) exported over OTLP/gRPC to a
// receiver in this process. Runs alternate off and on (off first in even
// pairs, on first in odd ones), each on a fresh data folder, so that load
// drifting on the machine falls on both; medians are compared.
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
					"OTEL_METRIC_EXPORT_INTERVAL=1000")
			}
			if o.env != "" {
				env = append(env, o.env)
			}
			spans0, points0 := sink.spans.Load(), sink.points.Load()
			r, err := measureOTelRun(ctx, bin, root, up.url, strings.Join(env, ","), q, o)
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
				fmt.Printf("pair %d otel=%v: %.0f txn/s, %v CPU/txn, p50 %.2f ms, %.1f%% of a core at %d/s\n", pair, withOTel, r.throughput, r.cpuPerTxn, ms(r.p50), 100*r.steadyCPU, o.rate)
			}
		}
	}
	printOTel(o, off, on, sink)
	return nil
}

func measureOTelRun(ctx context.Context, bin, root, pgURL, env string, q queries, o options) (otelRun, error) {
	js, err := startJetsync(ctx, bin, root, pgURL, env)
	if err != nil {
		return otelRun{}, err
	}
	defer js.Stop()
	cpu0, err := procCPU(js.Cmd.Process.Pid)
	if err != nil {
		return otelRun{}, err
	}
	tput, err := measureThroughput(ctx, js.Base, pgURL, q, o.otelTxns)
	if err != nil {
		return otelRun{}, fmt.Errorf("throughput: %w", err)
	}
	cpu1, err := procCPU(js.Cmd.Process.Pid)
	if err != nil {
		return otelRun{}, err
	}
	cpu2, t2 := cpu1, time.Now()
	if cpu2, err = procCPU(js.Cmd.Process.Pid); err != nil {
		return otelRun{}, err
	}
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
	return otelRun{throughput: tput, cpuPerTxn: (cpu1 - cpu0) / time.Duration(o.otelTxns), steadyCPU: steady, p50: l.p50}, nil
}

// measureThroughput commits n single-row UPDATE transactions from four
// connections as fast as they go, each retitling one of the first 28 issues,
// which a connected client's issuesWithLabels shows, and returns n over the
// time from the first commit to the pokeEnd that carries the last title of
// every one of the 28 (pokes coalesce, so earlier titles may never show).
func measureThroughput(ctx context.Context, base, pgURL string, q queries, n int) (float64, error) {
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
		row := func(k int) string { return fmt.Sprintf("i%07d", 1+w+writers*(k%(rows/writers))) }
		title := func(k int) string { return marker + strconv.Itoa(w+writers*k) }
		for k := max(0, per-rows/writers); k < per; k++ {
			final[title(k)] = true
		}
		g.Go(func() error {
			pg, err := pgx.Connect(gctx, pgURL)
			if err != nil {
				return err
			}
			defer pg.Close(context.WithoutCancel(gctx))
			for k := range per {
				if _, err := pg.Exec(gctx, `UPDATE issue SET title = $1 WHERE id = $2`, title(k), row(k)); err != nil {
					return err
				}
			}
			return nil
		})
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

func printOTel(o options, off, on []otelRun, sink *otlpSink) {
	tp := func(rs []otelRun) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = r.throughput
		}
		slices.Sort(out)
		return out
	}
	p50 := func(rs []otelRun) []time.Duration {
		out := make([]time.Duration, len(rs))
		for i, r := range rs {
			out[i] = r.p50
		}
		return out
	}
	tOff, tOn := tp(off), tp(on)
	mOff, mOn := tOff[len(tOff)/2], tOn[len(tOn)/2]
	cost := 1 - mOn/mOff
	lOff, lOn := median(p50(off)), median(p50(on))
	dl := ms(lOn) - ms(lOff)
	fmt.Println()
	fmt.Printf("OpenTelemetry export cost (seed.sh %d; %d alternating pairs; on: metrics every 1 s, traces at the default sampling (10 transactions a second), OTLP/gRPC to an in-process receiver, which got %d spans and %d metric streams)\n\n",
		o.issues, len(off), sink.spans.Load(), sink.points.Load())
	fmt.Println("| measure | OTel off | OTel on | cost | aim |")
	fmt.Println("|---|---|---|---|---|")
	fmt.Printf("| throughput: %d single-row transactions from 4 connections, first commit → the client's poke with the last; median (runs %s / %s) | %.0f txn/s | %.0f txn/s | %.1f%% | < %.0f%% %s |\n",
		o.otelTxns, floats(tOff), floats(tOn), mOff, mOn, 100*cost, 100*aimOTelThroughputCost, met(cost < aimOTelThroughputCost))
	fmt.Printf("| commit → client poke p50, %d updates at %d/s; median of the runs' p50s (%s / %s) | %.2f ms | %.2f ms | %+.2f ms | < %.1f ms %s |\n",
		o.updates, o.rate, list(p50(off)), list(p50(on)), ms(lOff), ms(lOn), dl, aimOTelP50CostMS, met(dl < aimOTelP50CostMS))
	// Each pair ran back to back: the median of the pairs' differences
	// cancels the load that drifts between pairs.
	var dts, dls, dcs []float64
	for i := range min(len(off), len(on)) {
		dts = append(dts, 1-on[i].throughput/off[i].throughput)
		dls = append(dls, ms(on[i].p50)-ms(off[i].p50))
		dcs = append(dcs, on[i].cpuPerTxn.Seconds()/off[i].cpuPerTxn.Seconds()-1)
	}
	slices.Sort(dts)
	slices.Sort(dls)
	slices.Sort(dcs)
	cpus := func(rs []otelRun) []time.Duration {
		out := make([]time.Duration, len(rs))
		for i, r := range rs {
			out[i] = r.cpuPerTxn
		}
		return out
	}
	cOff, cOn := median(cpus(off)), median(cpus(on))
	cc := cOn.Seconds()/cOff.Seconds() - 1
	fmt.Printf("| jetsync's CPU time per transaction over the throughput measure (the work throughput is bound by on 2 cores); median | %v | %v | %.1f%% | < %.0f%% %s |\n",
		cOff, cOn, 100*cc, 100*aimOTelThroughputCost, met(cc < aimOTelThroughputCost))
	fmt.Printf("\npaired (on − off within each pair), median: throughput cost %.1f%% (aim < %.0f%% %s), p50 %+.2f ms (aim < %.1f ms %s); pairs' throughput costs %s%%, p50 differences %s ms\n",
		100*dts[len(dts)/2], 100*aimOTelThroughputCost, met(dts[len(dts)/2] < aimOTelThroughputCost),
		dls[len(dls)/2], aimOTelP50CostMS, met(dls[len(dls)/2] < aimOTelP50CostMS), floats1(dts, 100), floats1(dls, 1))
	var dss []float64
	for i := range min(len(off), len(on)) {
		dss = append(dss, on[i].steadyCPU-off[i].steadyCPU)
	}
	slices.Sort(dss)
	fmt.Printf("paired CPU share at %d updates/s (on − off, percent of a core), median: %+.2f; pairs' %s\n",
		o.rate, 100*dss[len(dss)/2], floats1(dss, 100))
	fmt.Printf("paired CPU per transaction, median: %+.1f%% (aim < %.0f%% %s); pairs' %s%%\n",
		100*dcs[len(dcs)/2], 100*aimOTelThroughputCost, met(dcs[len(dcs)/2] < aimOTelThroughputCost), floats1(dcs, 100))
}

func floats(fs []float64) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strings.Join(s, ", ")
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
