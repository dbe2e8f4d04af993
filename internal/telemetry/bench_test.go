package telemetry

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promb "go.opentelemetry.io/contrib/bridges/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// benchSpans starts and ends the spans one traced transaction makes in
// `jetsync run` (commit, publish, apply, advance, group advance, poke),
// with the traceparent written and read, under sampler s.
func benchSpans(b *testing.B, s sdktrace.Sampler) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s), sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := tp.Tracer("bench")
	b.ReportAllocs()
	for b.Loop() {
		ctx, commit := tr.Start(context.Background(), "postgres commit")
		commit.End()
		ctx, pub := tr.Start(ctx, "jetstream publish")
		h := map[string][]string{}
		Inject(ctx, h)
		pub.End()
		sc, ok := Extract(h)
		if !ok {
			if pub.SpanContext().IsSampled() {
				b.Fatal("no traceparent")
			}
			continue
		}
		_, apply := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), sc), "replica apply")
		apply.End()
		ctx, adv := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), apply.SpanContext()), "view-syncer advance")
		ctx, g := tr.Start(ctx, "group advance")
		_, poke := tr.Start(ctx, "poke")
		poke.End()
		g.End()
		adv.End()
	}
}

// BenchmarkTrace_Sampled is the cost of one traced transaction.
func BenchmarkTrace_Sampled(b *testing.B) { benchSpans(b, sdktrace.AlwaysSample()) }

// BenchmarkTrace_NotSampled is what a message pays that the default
// sampler passes over: the commit and publish spans, not recorded.
func BenchmarkTrace_NotSampled(b *testing.B) { benchSpans(b, sdktrace.NeverSample()) }

// BenchmarkTrace_HeadDropped is what a transaction pays in the publisher
// that the default rate sampler passes over: StartTrace's refusal, before
// any span (BenchmarkTrace_NotSampled is the span-by-span path that a
// configured sampler which drops it still takes).
func BenchmarkTrace_HeadDropped(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	r := newRateSampler(DefaultTracesPerSecond)
	r.last.Store(time.Now().Add(time.Hour).UnixNano())
	headRate.Store(r)
	tracing.Store(true)
	defer func() { tracing.Store(false); headRate.Store(nil) }()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := StartTrace(context.Background(), "postgres commit"); ok {
			b.Fatal("sampled")
		}
	}
}

// BenchmarkMetrics_Produce is one export's read of the Prometheus
// collectors through the bridge, with 200 series registered (jetsync run
// has about that many).
func BenchmarkMetrics_Produce(b *testing.B) {
	reg := prometheus.NewRegistry()
	for i := range 50 {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "zero_bench_" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "_total", Help: "h"}, []string{"l"})
		reg.MustRegister(c)
		for j := range 3 {
			c.WithLabelValues(string(rune('a' + j))).Inc()
		}
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "zero_bench_h" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "_seconds", Help: "h"})
		h.Observe(0.1)
		reg.MustRegister(h)
	}
	p := renamer{promb.NewMetricProducer(promb.WithGatherer(reg))}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Produce(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
