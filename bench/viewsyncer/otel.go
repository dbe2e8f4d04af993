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

// printOTel prints the rounds' figures and reports the aims. lag is every
// update's arrival at the exporting process's client less its arrival at
// the other's.
func printOTel(o options, off, on []otelRun, sink *otlpSink, lag []time.Duration) {
	field := func(rs []otelRun, f func(otelRun) float64) []float64 {
		out := make([]float64, len(rs))
		for i, r := range rs {
			out[i] = f(r)
		}
		return out
	}
	// Each pair ran side by side: the median of the pairs'
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
	fmt.Printf("OpenTelemetry export cost (seed.sh %d; %d side-by-side rounds; on: metrics every %d s, traces at the default sampling (%d transactions a second), OTLP/gRPC to an in-process receiver, which got %d spans and %d metric streams)\n\n",
		o.issues, len(off), otelMetricInterval/1000, 10, sink.spans.Load(), sink.points.Load())
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
