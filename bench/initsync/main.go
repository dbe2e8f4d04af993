// Command initsync times a fresh `jetsync run`, from its start until its
// replica is ready to serve (/ answers 200), on two sizes of seed.sh data
// (100,000 and 300,000 issues: 451,020 and 1,353,020 rows). The slope
// between the sizes is the initial sync's rate per extra row, and what is
// left at zero rows its fixed start-up cost: issue 17's aim 6.
//
// -bin takes several binaries, comma-separated, whose runs alternate (a,
// b, a, b...) against the same upstream, so that a before/after comparison
// sees the same load; the aims are reported for the first.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
)

const (
	appID       = "zero"
	publication = "zpeer_pub"
)

// tables are seed.sh's tables, which the replica must hold whole.
var tables = []string{"user", "issue", "comment", "label", "issue_label"}

func main() {
	var o options
	flag.StringVar(&o.bins, "bin", "bin/jetsync", "jetsync binaries, comma-separated, whose runs alternate; the first is built from ./cmd/jetsync when missing")
	benchenv.DataFlag(&o.data)
	flag.StringVar(&o.sizes, "issues", "100000,300000", "two seed.sh sizes (issues), smaller first")
	flag.IntVar(&o.runs, "runs", 3, "initial syncs per size and binary (the median is reported)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (logs, data)")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the first binary's last initial sync of the larger size to this file, as long as its first one took")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/initsync:", err)
		os.Exit(1)
	}
}

type options struct {
	bins, data, sizes string
	cpuprofile        string
	runs              int
	keep              bool
}

// sample is one initial sync.
type sample struct {
	ready time.Duration // start -> / answers 200
	cpu   time.Duration // the process's user+sys CPU until then
	copy  time.Duration // the change-streamer's own figure for its copy
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sizes []int
	for s := range strings.SplitSeq(o.sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-issues %q: want two positive sizes", o.sizes)
		}
		sizes = append(sizes, n)
	}
	if len(sizes) != 2 || sizes[0] >= sizes[1] {
		return fmt.Errorf("-issues %q: want two sizes, smaller first", o.sizes)
	}
	root, cleanup, err := benchenv.TempRoot("initsync", o.keep)
	if err != nil {
		return err
	}
	defer cleanup()
	var bins []string
	for i, b := range strings.Split(o.bins, ",") {
		if i == 0 {
			b, err = benchenv.JetsyncBin(ctx, b, root)
		} else {
			b, err = filepath.Abs(b)
		}
		if err != nil {
			return err
		}
		bins = append(bins, b)
	}

	rows := make([]int64, len(sizes))
	samples := make([][][]sample, len(bins)) // [bin][size][run]
	for b := range bins {
		samples[b] = make([][]sample, len(sizes))
	}
	for si, issues := range sizes {
		pg, url, err := benchenv.StartUpstream(ctx, filepath.Join(root, fmt.Sprint(issues)), o.data, issues, appID)
		if err != nil {
			return err
		}
		want, err := upstreamCounts(ctx, url)
		if err != nil {
			_ = pg.Kill(context.WithoutCancel(ctx))
			return err
		}
		for _, n := range want {
			rows[si] += n
		}
		for r := range o.runs {
			for b, bin := range bins {
				dir := filepath.Join(root, fmt.Sprint(issues), fmt.Sprintf("run-%d-%d", b, r))
				var prof *profile
				if o.cpuprofile != "" && b == 0 && si == 1 && r == o.runs-1 {
					prof = &profile{file: o.cpuprofile}
					if r == 0 {
						prof.d = samples[0][0][0].ready * time.Duration(sizes[1]) / time.Duration(sizes[0])
					} else {
						prof.d = samples[0][1][0].ready
					}
				}
				s, err := syncOnce(ctx, bin, dir, url, want, prof)
				if err != nil {
					_ = pg.Kill(context.WithoutCancel(ctx))
					return fmt.Errorf("%s, %d issues: %w", bin, issues, err)
				}
				fmt.Printf("%d rows, %s: ready in %s, CPU %s (%.2f µs/row), copy %s\n", rows[si], filepath.Base(bin),
					s.ready.Round(time.Millisecond), s.cpu.Round(time.Millisecond), float64(s.cpu.Microseconds())/float64(rows[si]), s.copy.Round(time.Millisecond))
				samples[b][si] = append(samples[b][si], s)
				if !o.keep {
					if err := os.RemoveAll(dir); err != nil {
						return err
					}
				}
			}
		}
		if err := pg.Kill(context.WithoutCancel(ctx)); err != nil {
			return err
		}
	}

	type fit struct {
		ready [2]time.Duration
		cpu   [2]time.Duration
		slope float64       // rows/s per extra row
		fixed time.Duration // ready time at zero rows
	}
	fits := make([]fit, len(bins))
	for b := range bins {
		f := &fits[b]
		for si := range sizes {
			f.ready[si] = median(samples[b][si], func(s sample) time.Duration { return s.ready })
			f.cpu[si] = median(samples[b][si], func(s sample) time.Duration { return s.cpu })
		}
		dt := (f.ready[1] - f.ready[0]).Seconds()
		if dt > 0 {
			f.slope = float64(rows[1]-rows[0]) / dt
			f.fixed = f.ready[0] - time.Duration(float64(rows[0])/f.slope*float64(time.Second))
		}
		fmt.Printf("%s: ready median %s (%d rows), %s (%d rows); CPU %.2f, %.2f µs/row; per extra row %.0f rows/s; fixed cost %s\n",
			bins[b], f.ready[0].Round(time.Millisecond), rows[0], f.ready[1].Round(time.Millisecond), rows[1],
			float64(f.cpu[0].Microseconds())/float64(rows[0]), float64(f.cpu[1].Microseconds())/float64(rows[1]),
			f.slope, f.fixed.Round(time.Millisecond))
	}
	for b := 1; b < len(bins); b++ {
		fmt.Printf("%s / %s: ready %.2f× and %.2f×, CPU %.2f× and %.2f×\n", filepath.Base(bins[b]), filepath.Base(bins[0]),
			fits[b].ready[0].Seconds()/fits[0].ready[0].Seconds(), fits[b].ready[1].Seconds()/fits[0].ready[1].Seconds(),
			fits[b].cpu[0].Seconds()/fits[0].cpu[0].Seconds(), fits[b].cpu[1].Seconds()/fits[0].cpu[1].Seconds())
	}
	f := fits[0]
	benchenv.Report(benchenv.Aim{Issue: 17, Name: "initial sync per extra row (Postgres to replica ready)",
		Figure: fmt.Sprintf("%.0f rows/s", f.slope), Target: "≥ 1,000,000 rows/s", Ref: "≈ 680,000 rows/s",
		Met: f.slope >= 1e6})
	benchenv.Report(benchenv.Aim{Issue: 17, Name: "initial sync fixed start-up cost",
		Figure: f.fixed.Round(time.Millisecond).String(), Target: "< 500ms",
		// A negative intercept is noise, not a cost under the aim.
		Met: f.slope > 0 && f.fixed >= 0 && f.fixed < 500*time.Millisecond})
	return nil
}

func median(ss []sample, f func(sample) time.Duration) time.Duration {
	ds := make([]time.Duration, len(ss))
	for i, s := range ss {
		ds[i] = f(s)
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// syncOnce starts bin's `jetsync run` from an empty data folder, times it
// until / answers 200, stops it and checks that its replica holds every row
// of want.
func syncOnce(ctx context.Context, bin, dir, url string, want map[string]int64, prof *profile) (sample, error) {
	var s sample
	natsPort, err := benchenv.FreePort()
	if err != nil {
		return s, err
	}
	env := []string{"ZERO_UPSTREAM_DB=" + url, "ZERO_APP_ID=" + appID, "ZERO_APP_PUBLICATIONS=" + publication,
		"ZERO_PORT=0", "ZERO_LOG_FORMAT=json", "ZERO_TASK_ID=initsync", "JETSYNC_DATA_DIR=" + filepath.Join(dir, "data"),
		fmt.Sprintf("JETSYNC_NATS_LISTEN=127.0.0.1:%d", natsPort)}
	var profDone chan error
	if prof != nil {
		port, err := benchenv.FreePort()
		if err != nil {
			return s, err
		}
		prof.addr = fmt.Sprintf("127.0.0.1:%d", port)
		env = append(env, "JETSYNC_PPROF_ADDR="+prof.addr)
		profDone = make(chan error, 1)
	}
	cmd := exec.Command(bin, "run")
	cmd.Env = benchenv.ServerEnv(env...)
	t0 := time.Now()
	p, err := benchenv.StartProc("run", cmd, dir)
	if err != nil {
		return s, err
	}
	defer p.Stop()
	if prof != nil {
		go func() { profDone <- prof.take(ctx) }()
	}
	if err := p.WaitHealthy(ctx, 10*time.Minute, 5*time.Millisecond); err != nil {
		return s, err
	}
	s.ready = time.Since(t0)
	if profDone != nil {
		if err := <-profDone; err != nil {
			return s, err
		}
		fmt.Printf("CPU profile of the initial sync's first %s: %s\n", prof.d.Round(time.Millisecond), prof.file)
	}
	if s.cpu, err = cpuTime(p.Cmd.Process.Pid); err != nil {
		return s, err
	}
	if rec := p.Log.Find("initial sync done"); rec != nil {
		s.copy = time.Duration(num(rec["took"]))
	}
	p.Stop()
	if err := checkReplica(ctx, filepath.Join(dir, "data", "replica.db"), want); err != nil {
		return s, err
	}
	return s, nil
}

// profile is a CPU profile to take from a jetsync process's pprof server.
type profile struct {
	file, addr string
	d          time.Duration
}

// take waits for the pprof server, which starts before anything else, and
// profiles for d.
func (p *profile) take(ctx context.Context) error {
	secs := max(1, int(p.d.Round(time.Second)/time.Second))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.addr, secs)
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("cpu profile: %s", resp.Status)
			}
			f, err := os.Create(p.file)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, resp.Body); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cpu profile: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func num(v any) float64 { f, _ := v.(float64); return f }

// cpuTime reads a live process's user+sys CPU time from /proc.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which may hold spaces, closed by ')'.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad times", pid)
	}
	const hz = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / hz, nil
}

func upstreamCounts(ctx context.Context, url string) (map[string]int64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	out := map[string]int64{}
	for _, t := range tables {
		var n int64
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{t}.Sanitize()).Scan(&n); err != nil {
			return nil, fmt.Errorf("count %s: %w", t, err)
		}
		out[t] = n
	}
	return out, nil
}

// checkReplica fails unless the replica file holds want's row counts: a
// fast sync that lost rows is no figure.
func checkReplica(ctx context.Context, file string, want map[string]int64) error {
	db, err := sql.Open("sqlite", "file:"+file)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, t := range tables {
		var n int64
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM "`+t+`"`).Scan(&n); err != nil {
			return fmt.Errorf("replica: count %s: %w", t, err)
		}
		if n != want[t] {
			return fmt.Errorf("replica: %s has %d rows, Postgres %d", t, n, want[t])
		}
	}
	return nil
}
