package pgrepl_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/internal/pglocal"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/producers/pgrepl"
)

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines decodes the JSON log lines whose message is one of msgs.
func (b *lockedBuffer) lines(t *testing.T, msgs ...string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	data := bytes.Clone(b.buf.Bytes())
	b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		for _, want := range msgs {
			if m["msg"] == want {
				out = append(out, m)
			}
		}
	}
	return out
}

// seedBench runs testdata/bench/seed.sh against url.
func seedBench(t *testing.T, url string, issues int) {
	t.Helper()
	bin := os.Getenv("PGBIN")
	if bin == "" {
		bin = pglocal.DefaultBinDir
	}
	cmd := exec.Command("bash", filepath.Join("..", "..", "testdata", "bench", "seed.sh"), strconv.Itoa(issues))
	cmd.Env = append(os.Environ(), fmt.Sprintf("PSQL=%s %s -v ON_ERROR_STOP=1 -q", filepath.Join(bin, "psql"), url))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("seed.sh %d: %v\n%s", issues, err, out)
	}
}

// TestSource_Progress runs an initial sync of the bench dataset, then a
// schema change that copies a table again, with a short progress interval:
// each table's lines count its rows up to the table's row count, with a
// rate and an ETA, and end with a line saying it is done; the metrics agree.
// PROGRESS_ISSUES sets the dataset's size (seed.sh ISSUES), and
// PROGRESS_INTERVAL the interval.
func TestSource_Progress(t *testing.T) {
	issues := 20000
	if s := os.Getenv("PROGRESS_ISSUES"); s != "" {
		var err error
		if issues, err = strconv.Atoi(s); err != nil {
			t.Fatalf("PROGRESS_ISSUES=%q: %v", s, err)
		}
	}
	// The copy takes well under a second here: lines every 25ms show it
	// under way.
	every := 25 * time.Millisecond
	if s := os.Getenv("PROGRESS_INTERVAL"); s != "" {
		var err error
		if every, err = time.ParseDuration(s); err != nil {
			t.Fatalf("PROGRESS_INTERVAL=%q: %v", s, err)
		}
	}
	e := newEnv(t, "")
	seedBench(t, e.url, issues)
	counts := map[string]int64{}
	for _, table := range []string{"user", "label", "issue", "comment", "issue_label"} {
		var n int64
		if err := e.conn.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %q`, table)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		counts["public."+table] = n
	}

	logs := &lockedBuffer{}
	t.Cleanup(func() {
		// Missing estimates would show as failures above: say why.
		for _, l := range logs.lines(t, "no row and size estimates for progress reports") {
			t.Errorf("%v", l)
		}
	})
	reg := prometheus.NewRegistry()
	src, err := pgrepl.New(pgrepl.Config{
		UpstreamURL:   e.url,
		Shard:         shard,
		CopyWorkers:   2,
		ProgressEvery: every,
		Logger:        slog.New(slog.NewJSONHandler(logs, nil)),
		Registerer:    reg,
	}, e.js)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	start := time.Now()
	e.waitSynced(t, "")
	t.Logf("initial sync of %d issues (%d rows): %s", issues, sum(counts), time.Since(start).Round(time.Millisecond))

	lines := logs.lines(t, "initial sync progress", "table copied")
	for _, l := range lines[:min(len(lines), 3)] {
		t.Logf("%v", l)
	}
	checkProgress(t, "initial sync", lines, counts)
	// The whole copy's lines count every table's rows.
	whole := 0
	var last float64
	for _, l := range lines {
		if l["table"] != nil || l["msg"] != "initial sync progress" {
			continue
		}
		whole++
		rows := l["rows"].(float64)
		if rows < last || l["tables"].(float64) < float64(len(counts)) {
			t.Errorf("whole-copy line %v: rows went from %v, or it counts other tables", l, last)
		}
		last = rows
		checkRateETA(t, l)
	}
	if whole == 0 {
		t.Error("no progress line for the whole initial sync")
	}
	for table, n := range counts {
		if got := counterValue(t, reg, "jetsync_initial_sync_rows_total", table); got != float64(n) {
			t.Errorf("jetsync_initial_sync_rows_total{table=%q} = %v; want %d", table, got, n)
		}
	}

	// A volatile default is computed by Postgres: the table is copied again.
	start = time.Now()
	e.exec(t, `ALTER TABLE comment ADD COLUMN score float8 DEFAULT random()`)
	comment := map[string]int64{"public.comment": counts["public.comment"]}
	polltest.Until(t, 60*time.Second, "the backfill", func() bool { return len(logs.lines(t, "backfilled")) > 0 })
	t.Logf("backfill of %d rows: %s", comment["public.comment"], time.Since(start).Round(time.Millisecond))
	checkProgress(t, "backfill", logs.lines(t, "backfill progress", "backfilled"), comment)
}

// checkProgress checks each table's lines: at least one progress line for
// the biggest table, rows never going down, and a last line saying done
// with the table's row count.
func checkProgress(t *testing.T, what string, lines []map[string]any, counts map[string]int64) {
	t.Helper()
	byTable := map[string][]map[string]any{}
	for _, l := range lines {
		if name, ok := l["table"].(string); ok {
			byTable[name] = append(byTable[name], l)
		}
	}
	biggest := ""
	for table, n := range counts {
		if biggest == "" || n > counts[biggest] {
			biggest = table
		}
		ls := byTable[table]
		if len(ls) == 0 {
			t.Errorf("%s: no line for %s", what, table)
			continue
		}
		var prev float64
		for i, l := range ls {
			rows, ok := l["rows"].(float64)
			if !ok || rows < prev {
				t.Errorf("%s: %s: rows went from %v to %v", what, table, prev, l["rows"])
			}
			prev = rows
			if done := l["msg"] != what+" progress"; done != (i == len(ls)-1) {
				t.Errorf("%s: %s: line %d of %d is %q; want progress lines, then one saying done", what, table, i+1, len(ls), l["msg"])
			}
			if i < len(ls)-1 {
				checkRateETA(t, l)
				// seed.sh ANALYZEs: Postgres knows about how many rows there are.
				if est := l["est_rows"].(float64); est < 0.8*float64(counts[table]) || est > 1.2*float64(counts[table]) {
					t.Errorf("%s: %s: est_rows = %v; want about %d", what, table, est, counts[table])
				}
			}
		}
		if prev != float64(counts[table]) {
			t.Errorf("%s: %s: the last line says %v rows; want %d", what, table, prev, counts[table])
		}
	}
	if n := len(byTable[biggest]); n < 2 {
		t.Errorf("%s: %s has %d lines; want progress lines before the one saying done", what, biggest, n)
	}
}

// checkRateETA checks that a progress line has a rate and an ETA, once
// rows came.
func checkRateETA(t *testing.T, l map[string]any) {
	t.Helper()
	if l["rows"].(float64) == 0 {
		if l["eta"] != "unknown" {
			t.Errorf("%v: eta = %v before the first row; want unknown", l, l["eta"])
		}
		return
	}
	rate, err := strconv.ParseFloat(fmt.Sprint(l["rows_per_s"]), 64)
	if err != nil || rate <= 0 {
		t.Errorf("%v: rows_per_s = %v; want a positive rate", l, l["rows_per_s"])
	}
	if _, err := strconv.ParseFloat(fmt.Sprint(l["mb_per_s"]), 64); err != nil {
		t.Errorf("%v: mb_per_s = %v", l, l["mb_per_s"])
	}
	eta, _ := l["eta"].(string)
	if d, err := time.ParseDuration(eta); err != nil || d < 0 {
		t.Errorf("%v: eta = %q; want a duration", l, eta)
	}
	if b, ok := l["bytes"].(float64); !ok || b <= 0 {
		t.Errorf("%v: bytes = %v", l, l["bytes"])
	}
	if strings.TrimSpace(fmt.Sprint(l["table_bytes"])) == "0" {
		t.Errorf("%v: table_bytes = 0; want Postgres's size", l)
	}
}

// counterValue is the counter name{table=table} in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, table string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "table" && lp.GetValue() == table {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{table=%q}", name, table)
	return 0
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}
