package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func TestSignals(t *testing.T) {
	for _, c := range []struct {
		env             map[string]string
		metrics, traces bool
	}{
		{env: nil},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, metrics: true, traces: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/v1/metrics"}, metrics: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, traces: true},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, traces: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRICS_EXPORTER": "none"}, traces: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}},
		{env: map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_RESOURCE_ATTRIBUTES": "a=b"}},
	} {
		m, tr := Signals(func(k string) string { return c.env[k] })
		if m != c.metrics || tr != c.traces {
			t.Errorf("%v: metrics %v traces %v; want %v %v", c.env, m, tr, c.metrics, c.traces)
		}
	}
}

func TestStart_NothingSetStartsNothing(t *testing.T) {
	tel, err := Start(context.Background(), Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if tel.mp != nil || tel.tp != nil || Tracing() {
		t.Errorf("started %+v, tracing %v, with no OTEL_* set", tel, Tracing())
	}
	if _, err := Start(context.Background(), Options{Getenv: func(k string) string {
		return map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}[k]
	}}); err == nil {
		t.Error("OTEL_TRACES_EXPORTER=zipkin accepted")
	}
}

func TestInjectExtract(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	for _, sampled := range []bool{true, false} {
		cfg := trace.SpanContextConfig{TraceID: tid, SpanID: sid}
		if sampled {
			cfg.TraceFlags = trace.FlagsSampled
		}
		ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(cfg))
		h := map[string][]string{}
		Inject(ctx, h)
		if !sampled {
			if len(h) != 0 {
				t.Errorf("unsampled span set %v", h)
			}
			continue
		}
		if got := h["traceparent"]; len(got) != 1 || got[0] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
			t.Errorf("traceparent %v", h)
		}
		sc, ok := Extract(h)
		if !ok || sc.TraceID() != tid || sc.SpanID() != sid || !sc.IsRemote() {
			t.Errorf("extracted %v %v", sc, ok)
		}
	}
	if _, ok := Extract(map[string][]string{"traceparent": {"garbage"}}); ok {
		t.Error("a malformed traceparent extracted")
	}
	if _, ok := Extract(map[string][]string{}); ok {
		t.Error("no traceparent extracted")
	}
}

func TestRateSampler(t *testing.T) {
	r := newRateSampler(10)
	p := sdktrace.SamplingParameters{ParentContext: context.Background(), Name: "x"}
	if r.ShouldSample(p).Decision != sdktrace.RecordAndSample {
		t.Fatal("the first root was not sampled")
	}
	if r.ShouldSample(p).Decision != sdktrace.Drop {
		t.Error("a second root within 100 ms was sampled")
	}
	r.last.Add(-int64(r.every))
	if r.ShouldSample(p).Decision != sdktrace.RecordAndSample {
		t.Error("a root after the interval was not sampled")
	}
}

// TestStart_HTTPProtobufByDefault: with only OTEL_EXPORTER_OTLP_ENDPOINT
// set, metrics and traces go over OTLP/HTTP to its /v1/metrics and
// /v1/traces, and Shutdown flushes them.
func TestStart_HTTPProtobufByDefault(t *testing.T) {
	var mu sync.Mutex
	hits := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits[r.URL.Path] = r.Header.Get("Content-Type")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "zero_mutation_crud_total", Help: "h"})
	reg.MustRegister(c)
	c.Inc()
	// The exporters read the process's environment themselves.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	tel, err := Start(context.Background(), Options{Worker: "test", Gatherer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if !Tracing() {
		t.Fatal("tracing is off")
	}
	_, span := Tracer().Start(context.Background(), "x")
	span.End()
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if Tracing() {
		t.Error("tracing still on after Shutdown")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range []string{"/v1/metrics", "/v1/traces"} {
		if ct, ok := hits[p]; !ok || ct != "application/x-protobuf" {
			t.Errorf("%s: hit %v, content type %q; want an OTLP/HTTP protobuf export (hits %v)", p, ok, ct, hits)
		}
	}
}

// TestStartTrace_DecidesAtTheHead: under the default rate sampler a root
// within the interval of the last is refused before any span is made (no
// allocation), and under a configured sampler the span's own decision
// stands; with traces off nothing starts.
func TestStartTrace_DecidesAtTheHead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	for _, c := range []struct {
		sampler      string
		first, again bool
	}{
		{sampler: "", first: true, again: false},
		{sampler: "always_on", first: true, again: true},
		{sampler: "always_off", first: false, again: false},
	} {
		t.Setenv("OTEL_TRACES_SAMPLER", c.sampler)
		tel, err := Start(context.Background(), Options{Worker: "test"})
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []bool{c.first, c.again} {
			_, span, ok := StartTrace(context.Background(), "root")
			if ok != want || (span != nil) != want {
				t.Errorf("sampler %q, root %d: ok %v, span %v; want %v", c.sampler, i, ok, span, want)
			}
			if span != nil {
				span.End()
			}
		}
		if c.sampler == "" {
			allocs := testing.AllocsPerRun(100, func() {
				if _, _, ok := StartTrace(context.Background(), "root"); ok {
					t.Error("a root within the rate sampler's interval started")
				}
			})
			if allocs != 0 {
				t.Errorf("a root the rate sampler passes over allocated %v times; want nothing made", allocs)
			}
		}
		if err := tel.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, _, ok := StartTrace(context.Background(), "root"); ok {
			t.Errorf("sampler %q: a root started after Shutdown", c.sampler)
		}
	}
}
