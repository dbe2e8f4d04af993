package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/jetsync/jetsync/consumers/backup"
	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/consumers/restore"
	"github.com/jetsync/jetsync/consumers/viewsyncer"
	"github.com/jetsync/jetsync/internal/telemetry"
	"github.com/jetsync/jetsync/producers/pgrepl"
	"github.com/jetsync/jetsync/streams"
)

// allMetrics registers every component's metrics, as `jetsync run` and
// the change-streamer do, and gathers them.
func allMetrics(t *testing.T) ([]*dto.MetricFamily, *recorder) {
	t.Helper()
	dir := t.TempDir()
	shard := streams.Shard{App: "zero", Num: 0}
	set := newMetricSet()
	rec := &recorder{owners: map[string][]string{}, counters: map[string]bool{}}
	reg := func(component string) prometheus.Registerer { return &recording{rec, component, set.For(component)} }
	if _, err := pgrepl.New(pgrepl.Config{UpstreamURL: "postgres://x@127.0.0.1/db", Shard: shard, Registerer: reg("change-streamer")}, nil); err != nil {
		t.Fatal(err)
	}
	cons, err := replicator.New(replicator.Config{File: filepath.Join(dir, "r.db"), Shard: shard, TaskID: "t", Registerer: reg("replica")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := viewsyncer.New(viewsyncer.Config{ReplicaFile: filepath.Join(dir, "r.db"), Replica: cons, Shard: shard, AuthSecret: "s", Registerer: reg("view-syncer")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vs.Close() })
	if _, err := backup.New(backup.Config{File: filepath.Join(dir, "b.db"), TaskID: "t", Shard: shard, Registerer: reg("backup")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := restore.New(restore.Config{File: filepath.Join(dir, "r.db"), TaskID: "t", Shard: shard, Registerer: reg("restore")}, nil); err != nil {
		t.Fatal(err)
	}
	mfs, err := set.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs, rec
}

// recorder notes the names each component registers, from the
// collectors' descriptions: a vector with no series yet is described but
// not gathered.
type recorder struct {
	owners   map[string][]string
	counters map[string]bool
}

type recording struct {
	rec       *recorder
	component string
	prometheus.Registerer
}

var fqNameRe = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recording) Register(c prometheus.Collector) error {
	// A Gauge has a Counter's methods too.
	_, gauge := c.(prometheus.Gauge)
	_, counter := c.(prometheus.Counter)
	counter = counter && !gauge
	_, counterVec := c.(*prometheus.CounterVec)
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqNameRe.FindStringSubmatch(d.String()); m != nil {
			r.rec.owners[m[1]] = append(r.rec.owners[m[1]], r.component)
			r.rec.counters[m[1]] = r.rec.counters[m[1]] || counter || counterVec
		}
	}
	return r.Registerer.Register(c)
}

func (r *recording) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// TestMetricNames_PrometheusConventions: counters end in _total, units are
// in the names, and no name is registered by two components (which would
// give it two meanings, as zero_replication_transactions once counted
// what the change-streamer published and what a replica applied).
func TestMetricNames_PrometheusConventions(t *testing.T) {
	mfs, rec := allMetrics(t)
	var ours []*dto.MetricFamily
	for _, mf := range mfs {
		if n := mf.GetName(); strings.HasPrefix(n, "zero_") || strings.HasPrefix(n, "jetsync_") {
			ours = append(ours, mf)
		}
	}
	if len(ours) < 50 {
		t.Fatalf("only %d jetsync metrics gathered", len(ours))
	}
	problems, err := promlint.NewWithMetricFamilies(ours).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	for name, o := range rec.owners {
		if rec.counters[name] && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
		if len(o) > 1 {
			t.Errorf("%s is registered by %v: one name, more than one meaning", name, o)
		}
	}
}

// TestMetricNames_ZeroNamesExist: every Prometheus name the OTLP export
// renames to a zero-cache name is one jetsync registers, so that the
// README's table and the export name real figures.
func TestMetricNames_ZeroNamesExist(t *testing.T) {
	_, rec := allMetrics(t)
	for _, n := range telemetry.ZeroNames {
		if len(rec.owners[n.Prom]) == 0 {
			t.Errorf("%s (for %s) is not registered by any component", n.Prom, n.Zero)
		}
	}
}

// TestREADMEMetricNames: the README's table of zero-cache's metric names
// has a row for each pair the OTLP export renames, naming both with no
// note, and every other row with a jetsync name says how it differs.
func TestREADMEMetricNames(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows, notes := map[string]string{}, map[string]string{}
	row := regexp.MustCompile("(?m)^\\| `(zero\\.[a-z0-9_.-]+)` \\| (.*?) \\| (.*?) ?\\|$")
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		rows[m[1]], notes[m[1]] = m[2], m[3]
	}
	if len(rows) < 90 {
		t.Fatalf("README lists %d of zero-cache's metric names; want them all", len(rows))
	}
	exact := map[string]bool{}
	for _, n := range telemetry.ZeroNames {
		exact[n.Zero] = true
		if got, want := rows[n.Zero], "`"+n.Prom+"`"; got != want || notes[n.Zero] != "" {
			t.Errorf("README row for %s: %q, note %q; the export maps it to %s, exactly", n.Zero, got, notes[n.Zero], want)
		}
	}
	for z, j := range rows {
		if !exact[z] && j != "—" && notes[z] == "" {
			t.Errorf("README maps %s to %s with no note, but the export does not rename it", z, j)
		}
	}
}
