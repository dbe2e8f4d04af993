package pgrepl

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetsync/jetsync/internal/telemetry"
	"github.com/jetsync/jetsync/streams"
)

// TestTracePublish_UnsampledCarriesNothing: under the default rate
// sampler the first transaction is traced (a publish span, and the
// traceparent header that the replicas follow) and one right after it is
// not, and carries no header.
func TestTracePublish_UnsampledCarriesNothing(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	tel, err := telemetry.Start(context.Background(), telemetry.Options{Worker: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()
	msg := func() *outMsg {
		return &outMsg{subject: "s", txs: 1, changes: 1, msg: streams.Message{Parts: []streams.Part{
			{Watermark: "0a", Last: true, CommitTimeMs: float64(time.Now().UnixMilli())}}}}
	}
	h := nats.Header{}
	span := tracePublish(msg(), h)
	if span == nil || h.Get(telemetry.HeaderTraceparent) == "" {
		t.Fatalf("the first transaction: span %v, header %v; want it traced", span, h)
	}
	span.End()
	h = nats.Header{}
	if span := tracePublish(msg(), h); span != nil || len(h) != 0 {
		t.Errorf("a transaction within the sampler's interval: span %v, header %v; want neither", span, h)
	}
}
