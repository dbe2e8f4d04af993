// Package telemetry exports the process's metrics and traces over OTLP with
// the OpenTelemetry SDK, turned on by the standard OTEL_* variables as
// zero-cache turns its own on. The Prometheus collectors stay the one source
// of every figure: the meter provider reads them through the Prometheus
// bridge at each export, renaming zero-cache's to its dotted OTel names.
// With no OTEL_* set nothing is started, and the tracing helpers cost a
// load of one atomic; with traces on, a transaction the sampler passes over
// costs little more (StartTrace).
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	promb "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/prometheus/client_golang/prometheus"
)

// Options say what a process exports.
type Options struct {
	// Worker names the role (process.worker, as zero-cache's workers).
	Worker string
	// Version is service.version.
	Version string
	// Gatherer is what the metrics are read from.
	Gatherer prometheus.Gatherer
	Log      *slog.Logger
	// Getenv reads the OTEL_* variables that decide what starts; nil:
	// os.Getenv. The SDK's exporters read the process's environment.
	Getenv func(string) string
}

// Telemetry is what Start started; Shutdown flushes and stops it.
type Telemetry struct {
	mp *sdkmetric.MeterProvider
	tp *sdktrace.TracerProvider
}

// tracing is set while a tracer provider exports: the hot paths check it
// before any span work.
var tracing atomic.Bool

// Tracing reports whether traces are exported.
func Tracing() bool { return tracing.Load() }

// headRate is the rate sampler when it is the provider's: StartTrace asks
// it before making any span.
var headRate atomic.Pointer[rateSampler]

// StartTrace starts the root span of a new trace if the sampler takes it,
// and returns ok false, having made nothing, if it does not. The decision
// is taken once, here at the head: an unsampled transaction carries no
// span and no traceparent down the path, and under the default rate
// sampler it costs a clock read and two atomic loads.
func StartTrace(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span, bool) {
	if !tracing.Load() {
		return ctx, nil, false
	}
	if r := headRate.Load(); r != nil && !r.due(time.Now().UnixNano()) {
		return ctx, nil, false
	}
	ctx, span := Tracer().Start(ctx, name, opts...)
	if !span.IsRecording() {
		return ctx, nil, false
	}
	return ctx, span, true
}

// Signals reports which signals the variables turn on, as zero-cache
// decides: an OTLP endpoint (common or the signal's) or the signal's
// exporter variable, and not that exporter set to none.
func Signals(getenv func(string) string) (metrics, traces bool) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false, false
	}
	on := func(signal string) bool {
		exp := strings.TrimSpace(getenv("OTEL_" + signal + "_EXPORTER"))
		if exp == "none" {
			return false
		}
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != "" || exp != ""
	}
	return on("METRICS"), on("TRACES")
}

// protocol is the OTLP transport for signal: grpc, or http/protobuf for
// anything else (zero-cache's default, http/json, is served by the same
// receivers on the same port, and the Go SDK has no JSON encoder).
func protocol(getenv func(string) string, signal string) string {
	p := getenv("OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL")
	if p == "" {
		p = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if p == "grpc" {
		return "grpc"
	}
	return "http/protobuf"
}

// Start starts the exports the environment asks for. It returns a
// Telemetry whose Shutdown does nothing when it asks for none.
func Start(ctx context.Context, o Options) (*Telemetry, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	wantMetrics, wantTraces := Signals(getenv)
	t := &Telemetry{}
	if !wantMetrics && !wantTraces {
		return t, nil
	}
	if o.Log != nil {
		// Export failures (a collector down) are logged, not fatal: the
		// SDK retries at the next interval.
		log := o.Log
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("OpenTelemetry", "err", err) }))
	}
	for _, sig := range []string{"METRICS", "TRACES"} {
		if e := getenv("OTEL_" + sig + "_EXPORTER"); e != "" && e != "otlp" && e != "none" {
			return nil, fmt.Errorf("OTEL_%s_EXPORTER=%s: jetsync exports otlp or none", sig, e)
		}
	}
	// Later options win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the defaults.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithAttributes(
			attribute.String("service.name", "jetsync"),
			attribute.String("service.version", o.Version),
			attribute.String("process.worker", o.Worker),
		),
		resource.WithFromEnv(),
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	if wantMetrics {
		var exp sdkmetric.Exporter
		var err error
		if protocol(getenv, "METRICS") == "grpc" {
			exp, err = otlpmetricgrpc.New(ctx)
		} else {
			exp, err = otlpmetrichttp.New(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("otlp metric exporter: %w", err)
		}
		// The periodic reader honours OTEL_METRIC_EXPORT_INTERVAL.
		reader := sdkmetric.NewPeriodicReader(exp,
			sdkmetric.WithProducer(renamer{promb.NewMetricProducer(promb.WithGatherer(o.Gatherer))}))
		t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(reader))
	}
	if wantTraces {
		var exp sdktrace.SpanExporter
		var err error
		if protocol(getenv, "TRACES") == "grpc" {
			exp, err = otlptracegrpc.New(ctx)
		} else {
			exp, err = otlptracehttp.New(ctx)
		}
		if err != nil {
			_ = t.Shutdown(ctx)
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		// The provider reads OTEL_TRACES_SAMPLER(_ARG) and the batch
		// processor OTEL_BSP_*. Without a sampler set, a busy stream
		// traces DefaultTracesPerSecond transactions a second, not all.
		opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithBatcher(exp)}
		var rate *rateSampler
		if getenv("OTEL_TRACES_SAMPLER") == "" {
			rate = newRateSampler(DefaultTracesPerSecond)
			opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(rate)))
		}
		t.tp = sdktrace.NewTracerProvider(opts...)
		otel.SetTracerProvider(t.tp)
		otel.SetTextMapPropagator(propagation.TraceContext{})
		headRate.Store(rate)
		tracing.Store(true)
	}
	if o.Log != nil {
		o.Log.Info("exporting OpenTelemetry", "metrics", wantMetrics, "metrics_protocol", protocol(getenv, "METRICS"),
			"traces", wantTraces, "traces_protocol", protocol(getenv, "TRACES"))
	}
	return t, nil
}

// Shutdown exports what is pending and stops.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	var errs []error
	if t.tp != nil {
		tracing.Store(false)
		headRate.Store(nil)
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// DefaultTracesPerSecond bounds the traces started a second when
// OTEL_TRACES_SAMPLER is unset.
const DefaultTracesPerSecond = 10

// rateSampler samples a root span when at least its interval has passed
// since the last one it sampled: at most perSecond traces a second, and an
// idle stream's next change is always traced.
type rateSampler struct {
	every time.Duration
	last  atomic.Int64 // unix nanoseconds of the last sampled root
}

func newRateSampler(perSecond int) *rateSampler {
	return &rateSampler{every: time.Second / time.Duration(max(perSecond, 1))}
}

func (r *rateSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	psc := trace.SpanContextFromContext(p.ParentContext)
	now := time.Now().UnixNano()
	last := r.last.Load()
	decision := sdktrace.Drop
	if now-last >= int64(r.every) && r.last.CompareAndSwap(last, now) {
		decision = sdktrace.RecordAndSample
	}
	return sdktrace.SamplingResult{Decision: decision, Tracestate: psc.TraceState()}
}

// due reports whether a root started at now would be sampled, without
// taking the slot: ShouldSample takes it, and may still drop a root that
// a concurrent one beat to it.
func (r *rateSampler) due(now int64) bool { return now-r.last.Load() >= int64(r.every) }

func (r *rateSampler) Description() string {
	return fmt.Sprintf("RateSampler{%v}", r.every)
}

// Tracer is jetsync's tracer.
func Tracer() trace.Tracer { return otel.Tracer("github.com/jetsync/jetsync") }

// HeaderTraceparent is the W3C trace context header.
const HeaderTraceparent = "traceparent"

// Inject sets h's traceparent to the span of ctx, if it is sampled. h is
// a NATS header (or any map of header values); the key is written as W3C
// spells it, since NATS headers are case-sensitive.
func Inject(ctx context.Context, h map[string][]string) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return
	}
	propagation.TraceContext{}.Inject(ctx, carrier(h))
}

// Extract returns the remote span context that h's traceparent names, if
// any.
func Extract(h map[string][]string) (trace.SpanContext, bool) {
	if len(h[HeaderTraceparent]) == 0 {
		return trace.SpanContext{}, false
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier(h)))
	return sc, sc.IsValid()
}

// carrier is a header map read and written with exact keys.
type carrier map[string][]string

func (c carrier) Get(k string) string {
	if v := c[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c carrier) Set(k, v string) { c[k] = []string{v} }

func (c carrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}
