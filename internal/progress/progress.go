// Package progress reports a long copy while it runs: the tables of an
// initial sync, or a table copied again after a schema change. Every
// interval it logs one line per table under way (rows and bytes done, the
// totals Postgres estimates, the rate and an ETA) and, for a copy of more
// than one table, a line for the whole; the same figures are Prometheus
// metrics.
package progress

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/internal/promreg"
)

// DefaultInterval is how often a copy logs its progress.
const DefaultInterval = 5 * time.Second

// RateETA is the rate of done units over el, and the time left at that
// rate for left more.
func RateETA(done, left float64, el time.Duration) (rate float64, eta time.Duration) {
	rate = done / max(el.Seconds(), 1e-9)
	return rate, time.Duration(max(left, 0) / max(rate, 1) * float64(time.Second))
}

// Metrics are one kind of copy's figures, per table (label "table") and for
// the whole copy. A nil *Metrics records nothing.
type Metrics struct {
	rows, bytes        *prometheus.CounterVec
	estRows, tableSize *prometheus.GaugeVec
	tableETA           *prometheus.GaugeVec
	eta, tables, done  prometheus.Gauge
}

// NewMetrics makes the metrics named prefix_*, for copies described as
// what in their help, and registers them with reg if set.
func NewMetrics(reg prometheus.Registerer, prefix, what string) (*Metrics, error) {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefix + "_" + name, Help: help}, []string{"table"})
	}
	gaugeVec := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: prefix + "_" + name, Help: help}, []string{"table"})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: prefix + "_" + name, Help: help})
	}
	m := &Metrics{
		rows:      counter("rows_total", "Rows read from upstream by "+what+", per table."),
		bytes:     counter("bytes_total", "Bytes of COPY output read from upstream by "+what+", per table."),
		estRows:   gaugeVec("estimated_rows", "Rows Postgres estimates in each table of the "+what+" under way (pg_class.reltuples)."),
		tableSize: gaugeVec("table_size_bytes", "Size on disk of each table of the "+what+" under way (pg_table_size)."),
		tableETA:  gaugeVec("table_eta_seconds", "Estimated time left copying each table of the "+what+" under way; 0 once done."),
		eta:       gauge("eta_seconds", "Estimated time left in the "+what+" under way; 0 when none is."),
		tables:    gauge("tables", "Tables in the "+what+" under way, or the last one."),
		done:      gauge("tables_done", "Tables of the "+what+" under way (or the last one) copied so far."),
	}
	if err := promreg.Register(reg, &m.rows, &m.bytes); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.estRows, &m.tableSize, &m.tableETA); err != nil {
		return nil, err
	}
	if err := promreg.Register(reg, &m.eta, &m.tables, &m.done); err != nil {
		return nil, err
	}
	return m, nil
}

// Forget drops the per-table estimates and ETAs of earlier copies, so that
// a table no longer copied leaves none behind; the counters stay.
func (m *Metrics) Forget() {
	if m == nil {
		return
	}
	m.estRows.Reset()
	m.tableSize.Reset()
	m.tableETA.Reset()
}

// Copy is one copy under way. Its tables are added before it starts;
// workers report into them concurrently.
type Copy struct {
	log   *slog.Logger
	m     *Metrics
	what  string
	every time.Duration

	mu     sync.Mutex
	tables []*Table
	start  time.Time
	stop   chan struct{}
	wg     sync.WaitGroup
	ended  bool
}

// Table is one table of a copy.
type Table struct {
	c                 *Copy
	name              string
	estRows, estBytes int64 // 0: unknown
	rows, bytes       atomic.Int64
	// The table's counters, looked up on the first Add only: Add runs for
	// every row a COPY sends, and a label lookup costs more than the count.
	counters      sync.Once
	rowsC, bytesC prometheus.Counter

	// Under c.mu.
	began, finished bool
	start           time.Time
	took            time.Duration
}

// NewCopy returns a copy that logs to log as what ("initial sync",
// "backfill") every interval (DefaultInterval if 0) once started; m may be
// nil.
func NewCopy(log *slog.Logger, m *Metrics, what string, every time.Duration) *Copy {
	if every <= 0 {
		every = DefaultInterval
	}
	return &Copy{log: log, m: m, what: what, every: every}
}

// Add adds a table with Postgres's estimates of its rows and its size on
// disk (0 for unknown).
func (c *Copy) Add(name string, estRows, estBytes int64) *Table {
	t := &Table{c: c, name: name, estRows: max(estRows, 0), estBytes: max(estBytes, 0)}
	c.mu.Lock()
	c.tables = append(c.tables, t)
	c.mu.Unlock()
	if m := c.m; m != nil {
		m.estRows.WithLabelValues(name).Set(float64(t.estRows))
		m.tableSize.WithLabelValues(name).Set(float64(t.estBytes))
		m.tableETA.WithLabelValues(name).Set(0)
	}
	return t
}

// Start starts the clock and the periodic report. End stops them.
func (c *Copy) Start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start = time.Now()
	c.stop = make(chan struct{})
	if m := c.m; m != nil {
		m.tables.Set(float64(len(c.tables)))
		m.done.Set(0)
	}
	c.wg.Add(1)
	go c.report(c.stop)
}

// End stops the report, whether the copy finished or failed. Calling it
// again does nothing.
func (c *Copy) End() {
	c.mu.Lock()
	if c.ended || c.stop == nil {
		c.ended = true
		c.mu.Unlock()
		return
	}
	c.ended = true
	close(c.stop)
	c.mu.Unlock()
	c.wg.Wait()
	if m := c.m; m != nil {
		m.eta.Set(0)
	}
}

func (c *Copy) report(stop <-chan struct{}) {
	defer c.wg.Done()
	t := time.NewTicker(c.every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			c.logNow()
		}
	}
}

// logNow logs a line per table under way and one for the whole copy.
func (c *Copy) logNow() {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var rows, bytes, estRows, estBytes int64
	done := 0
	for _, t := range c.tables {
		r, b := t.rows.Load(), t.bytes.Load()
		rows += r
		bytes += b
		estRows += max(t.estRows, r)
		estBytes += t.estBytes
		if t.finished {
			done++
			continue
		}
		if !t.began {
			continue
		}
		el := now.Sub(t.start)
		rate, eta := RateETA(float64(r), float64(t.estRows-r), el)
		known := t.estRows > 0 && r > 0 // no rate yet before the first row
		brate, _ := RateETA(float64(b), 0, el)
		if c.m != nil {
			c.m.tableETA.WithLabelValues(t.name).Set(eta.Seconds())
		}
		c.log.Info(c.what+" progress", logkey.Table, t.name,
			"rows", r, "est_rows", t.estRows, "bytes", b, "table_bytes", t.estBytes,
			"rows_per_s", fmt.Sprintf("%.0f", rate), "mb_per_s", fmt.Sprintf("%.1f", brate/1e6), "eta", etaString(eta, known))
	}
	if len(c.tables) < 2 {
		return
	}
	el := now.Sub(c.start)
	rate, eta := RateETA(float64(rows), float64(estRows-rows), el)
	brate, _ := RateETA(float64(bytes), 0, el)
	known := estRows > 0 && rows > 0
	if !known {
		eta = 0
	}
	if c.m != nil {
		c.m.eta.Set(eta.Seconds())
	}
	c.log.Info(c.what+" progress", "tables_done", done, "tables", len(c.tables),
		"rows", rows, "est_rows", estRows, "bytes", bytes, "table_bytes", estBytes,
		"rows_per_s", fmt.Sprintf("%.0f", rate), "mb_per_s", fmt.Sprintf("%.1f", brate/1e6), "eta", etaString(eta, known))
}

func etaString(eta time.Duration, known bool) string {
	if !known {
		return "unknown"
	}
	return eta.Round(time.Second).String()
}

// Begin marks the start of t's copy.
func (t *Table) Begin() {
	t.c.mu.Lock()
	t.began, t.start = true, time.Now()
	t.c.mu.Unlock()
}

// Add counts rows and bytes read.
func (t *Table) Add(rows, bytes int64) {
	t.rows.Add(rows)
	t.bytes.Add(bytes)
	if m := t.c.m; m != nil {
		t.counters.Do(func() { t.rowsC, t.bytesC = m.rows.WithLabelValues(t.name), m.bytes.WithLabelValues(t.name) })
		t.rowsC.Add(float64(rows))
		t.bytesC.Add(float64(bytes))
	}
}

// Done marks t copied and logs msg with its figures.
func (t *Table) Done(msg string) {
	c := t.c
	c.mu.Lock()
	t.finished = true
	t.took = time.Since(t.start)
	done := 0
	for _, o := range c.tables {
		if o.finished {
			done++
		}
	}
	c.mu.Unlock()
	rows, bytes := t.rows.Load(), t.bytes.Load()
	rate, _ := RateETA(float64(rows), 0, t.took)
	brate, _ := RateETA(float64(bytes), 0, t.took)
	if m := c.m; m != nil {
		m.tableETA.WithLabelValues(t.name).Set(0)
		m.done.Set(float64(done))
	}
	c.log.Info(msg, logkey.Table, t.name, "rows", rows, "bytes", bytes, "took", t.took.Round(time.Millisecond),
		"rows_per_s", fmt.Sprintf("%.0f", rate), "mb_per_s", fmt.Sprintf("%.1f", brate/1e6))
}
