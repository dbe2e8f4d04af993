package progress_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/progress"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRateETA(t *testing.T) {
	rate, eta := progress.RateETA(100, 300, 2*time.Second)
	if rate != 50 || eta != 6*time.Second {
		t.Errorf("RateETA(100, 300, 2s) = %v, %v; want 50, 6s", rate, eta)
	}
	if _, eta := progress.RateETA(100, -5, time.Second); eta != 0 {
		t.Errorf("RateETA past the estimate: eta %v; want 0", eta)
	}
}

func TestCopy(t *testing.T) {
	buf := &syncBuf{}
	reg := prometheus.NewRegistry()
	m, err := progress.NewMetrics(reg, "test_copy", "the test copy")
	if err != nil {
		t.Fatal(err)
	}
	c := progress.NewCopy(slog.New(slog.NewTextHandler(buf, nil)), m, "test copy", 10*time.Millisecond)
	a, b := c.Add("a", 1000, 1<<20), c.Add("b", 0, 0)
	c.Start()
	a.Begin()
	a.Add(250, 1000)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "tables_done=0") {
		if time.Now().After(deadline) {
			t.Fatalf("no whole-copy line in %q", buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	a.Add(750, 3000)
	a.Done("a done")
	b.Begin()
	b.Done("b done")
	c.End()
	c.End()
	out := buf.String()
	for _, want := range []string{
		`msg="test copy progress" table=a rows=250 est_rows=1000 bytes=1000 table_bytes=1048576`,
		`msg="a done" table=a rows=1000 bytes=4000`,
		`msg="b done" table=b rows=0 bytes=0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "table=b rows=0 est_rows") {
		t.Errorf("a table not begun got a progress line:\n%s", out)
	}
	n := strings.Count(out, "\n")
	time.Sleep(50 * time.Millisecond)
	if strings.Count(buf.String(), "\n") != n {
		t.Error("lines after End")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			k := mf.GetName()
			for _, l := range mm.GetLabel() {
				k += "{" + l.GetValue() + "}"
			}
			got[k] = mm.GetCounter().GetValue() + mm.GetGauge().GetValue()
		}
	}
	for k, want := range map[string]float64{
		"test_copy_rows_total{a}": 1000, "test_copy_bytes_total{a}": 4000,
		"test_copy_estimated_rows{a}": 1000, "test_copy_table_size_bytes{a}": 1 << 20,
		"test_copy_tables": 2, "test_copy_tables_done": 2, "test_copy_eta_seconds": 0, "test_copy_table_eta_seconds{a}": 0,
	} {
		if got[k] != want {
			t.Errorf("%s = %v; want %v", k, got[k], want)
		}
	}
	m.Forget()
	if mfs, err = reg.Gather(); err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if n := mf.GetName(); n == "test_copy_estimated_rows" || n == "test_copy_table_eta_seconds" {
			t.Errorf("%s survives Forget", n)
		}
		if n := mf.GetName(); n == "test_copy_rows_total" && len(mf.GetMetric()) != 1 {
			t.Errorf("Forget dropped the row counters")
		}
	}
}
