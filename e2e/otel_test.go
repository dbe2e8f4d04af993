package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	collmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// otlpReceiver is an OTLP/gRPC collector that records what it is sent.
type otlpReceiver struct {
	colltrace.UnimplementedTraceServiceServer

	addr string
	mu   sync.Mutex
	// spans by hex span ID, with the resource attributes they came with.
	spans   map[string]recvSpan
	metrics map[string]map[string]string // metric name -> resource attributes
}

type recvSpan struct {
	traceID, parentID, name string
	worker                  string
	attrs                   map[string]string
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{addr: ln.Addr().String(), spans: map[string]recvSpan{}, metrics: map[string]map[string]string{}}
	srv := grpc.NewServer()
	colltrace.RegisterTraceServiceServer(srv, r)
	collmetrics.RegisterMetricsServiceServer(srv, metricsServer{otlpReceiver: r})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return r
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	return m
}

func (r *otlpReceiver) Export(_ context.Context, req *colltrace.ExportTraceServiceRequest) (*colltrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans[hex.EncodeToString(s.GetSpanId())] = recvSpan{
					traceID: hex.EncodeToString(s.GetTraceId()), parentID: hex.EncodeToString(s.GetParentSpanId()),
					name: s.GetName(), worker: res["process.worker"], attrs: attrs(s.GetAttributes()),
				}
			}
		}
	}
	return &colltrace.ExportTraceServiceResponse{}, nil
}

// metricsServer adapts the receiver to the metrics service, whose method
// has the trace service's name.
type metricsServer struct {
	collmetrics.UnimplementedMetricsServiceServer
	*otlpReceiver
}

func (m metricsServer) Export(_ context.Context, req *collmetrics.ExportMetricsServiceRequest) (*collmetrics.ExportMetricsServiceResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		res := attrs(rm.GetResource().GetAttributes())
		for _, sm := range rm.GetScopeMetrics() {
			for _, x := range sm.GetMetrics() {
				m.metrics[x.GetName()] = res
			}
		}
	}
	return &collmetrics.ExportMetricsServiceResponse{}, nil
}

// chain returns the spans of the trace in which a poke descends, parent by
// parent, from a Postgres commit whose publish went to subject, as names
// from the commit down; nil if no such trace arrived yet.
func (r *otlpReceiver) chain(subject string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if s.name != "poke" {
			continue
		}
		names := []string{s.name}
		published := ""
		for cur := s; cur.parentID != "" && cur.parentID != "0000000000000000"; {
			p, ok := r.spans[cur.parentID]
			if !ok || p.traceID != s.traceID {
				break
			}
			names = append([]string{p.name}, names...)
			if p.name == "jetstream publish" {
				published = p.attrs["messaging.destination.name"]
			}
			cur = p
		}
		if names[0] == "postgres commit" && published == subject {
			return names
		}
	}
	return nil
}

// TestOTel_ExportsMetricsAndOneTrace is issue 16's OpenTelemetry
// acceptance: `jetsync run`, told by OTEL_* where a collector listens,
// exports its metrics to it, under zero-cache's names where zero-cache has
// them, and the trace of a row inserted with SQL links its Postgres
// commit, the publish, the replica apply, the view-syncer's advance and
// the poke, each the parent of the next.
func TestOTel_ExportsMetricsAndOneTrace(t *testing.T) {
	recv := startOTLPReceiver(t)
	app := newCVRApp(t, 20)
	p := start(t, app.runEnv(t, 0,
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+recv.addr,
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_METRIC_EXPORT_INTERVAL=300",
		"OTEL_BSP_SCHEDULE_DELAY=100",
		"OTEL_SERVICE_NAME=jetsync-e2e",
		// Every transaction traced: the default samples ten a second.
		"OTEL_TRACES_SAMPLER=parentbased_always_on",
		"JETSYNC_METRICS_LISTEN=127.0.0.1:0",
	), "run")
	listening := p.logRecord(t, "http listening", 60*time.Second)
	port := int(listening["port"].(float64))
	srv := &syncServer{url: fmt.Sprintf("http://127.0.0.1:%d", port), proc: p}
	waitHealthy(t, p, srv.url, 90*time.Second)
	p.logRecord(t, "exporting OpenTelemetry", 10*time.Second)
	// JETSYNC_METRICS_LISTEN moves /metrics off the sync port.
	if body, code := get(t, str(t, listening, "metrics")); code != 200 || !strings.Contains(body, "zero_replication_transactions_total") {
		t.Errorf("GET %s = %d %.300s; want the Prometheus metrics", str(t, listening, "metrics"), code, body)
	}
	if _, code := get(t, srv.url+"/metrics"); code != 404 {
		t.Errorf("GET %s/metrics = %d; want 404 with JETSYNC_METRICS_LISTEN set", srv.url, code)
	}

	c := dialSync(t, srv, "otel-group", "c1", "", initConnection(astPut("open", goodQuery)))
	c.waitGot("open")
	app.exec(t, `INSERT INTO issue (id, title, open, modified, owner_id, created) VALUES ('otel-1', 'traced by otel', true, -1, NULL, now())`)
	c.waitRow("traced by otel")

	var names []string
	// The insert's message goes to its table's subject (streams/README.md).
	subject := streams.Shard{App: zeroAppID}.TableSubject("public", "issue")
	polltest.Until(t, 30*time.Second, "a trace from the insert's commit to the poke", func() bool {
		names = recv.chain(subject)
		return names != nil
	})
	want := []string{"postgres commit", "jetstream publish", "replica apply", "view-syncer advance", "group advance", "poke"}
	if strings.Join(names, " > ") != strings.Join(want, " > ") {
		t.Errorf("trace %v; want %v", names, want)
	}

	polltest.Until(t, 30*time.Second, "metrics", func() bool {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		for _, n := range []string{"zero.replication.transactions", "zero.replication.slot_retained_wal_bytes", "zero.sync.active-clients", "zero.sync.active-client-groups", "zero.sync.poke.transactions", "zero.sync.poke.time", "zero.sync.hydration-time",
			"jetsync_stream_last_seq", "jetsync_replica_stream_seq"} {
			if _, ok := recv.metrics[n]; !ok {
				return false
			}
		}
		return true
	})
	recv.mu.Lock()
	res := recv.metrics["zero.replication.transactions"]
	_, promName := recv.metrics["zero_replication_transactions_total"]
	recv.mu.Unlock()
	if res["service.name"] != "jetsync-e2e" || res["process.worker"] != "run" {
		t.Errorf("resource %v: want service.name jetsync-e2e (OTEL_SERVICE_NAME) and process.worker run", res)
	}
	if promName {
		t.Error("zero_replication_transactions_total exported under its Prometheus name, not zero-cache's")
	}
}
