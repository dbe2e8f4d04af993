package main

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
)

// runOTelSide measures what exporting OpenTelemetry costs with the two
// `jetsync run`s side by side: in each round one without OTEL_* and one
// exporting run at once, on shards 0 and 1 of the same upstream (swapped
// every round), so that both replicate the same commits under the same
// load on the machine, which drifts too much between runs on a shared
// machine for alternating runs to settle a few percent. Each round is a
// pair; the verdicts are the medians of the pairs' differences.
func runOTelSide(ctx context.Context, o options, bin, root string, up *upstream) error {
	sink, err := startOTLPSink()
	if err != nil {
		return err
	}
	defer sink.srv.Stop()
	q := newQueries(o.issues)
	var off, on []otelRun
	var lag []time.Duration
	for round := range o.runs {
		spans0, points0 := sink.spans.Load(), sink.points.Load()
		rs, l, err := measureOTelRound(ctx, bin, root, up.url, q, o, sink, round)
		if err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		if sink.spans.Load() == spans0 && sink.points.Load() == points0 {
			return fmt.Errorf("round %d: the receiver got nothing", round)
		}
		if o.verbose {
			for i, r := range rs {
				fmt.Printf("round %d otel=%v: %.0f txn/s, %v CPU/txn; %v CPU/txn at %d/s offered; p50 %.2f ms, %.1f%% of a core at %d/s\n",
					round, i == 1, r.throughput, r.cpuPerTxn, r.pacedCPUPerTxn, o.otelRate, ms(r.p50), 100*r.steadyCPU, o.rate)
			}
		}
		off, on = append(off, rs[0]), append(on, rs[1])
		lag = append(lag, l...)
	}
	printOTel(o, off, on, sink, lag)
	return nil
}

// measureOTelRound runs the measures on the two processes at once: [0]
// without export, [1] with.
func measureOTelRound(ctx context.Context, bin, root, pgURL string, q queries, o options, sink *otlpSink, round int) ([2]otelRun, []time.Duration, error) {
	var js [2]*jetsync
	var profiles [2]string
	defer func() {
		for _, j := range js {
			if j != nil {
				j.Stop()
			}
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	for i := range js {
		env := []string{"JETSYNC_BACKUP=off",
			"JETSYNC_DATA_DIR=" + filepath.Join(root, fmt.Sprintf("data-%d-%d", round, i)),
			"ZERO_SHARD_NUM=" + strconv.Itoa((i+round)%2)}
		if i == 1 {
			env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+sink.addr, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
				"OTEL_METRIC_EXPORT_INTERVAL="+strconv.Itoa(otelMetricInterval))
		}
		if o.otelProfile != "" {
			profiles[i] = filepath.Join(o.otelProfile, fmt.Sprintf("%s-%d.pprof", []string{"off", "on"}[i], round))
			port, err := benchenv.FreePort()
			if err != nil {
				return [2]otelRun{}, nil, err
			}
			env = append(env, fmt.Sprintf("JETSYNC_PPROF_ADDR=127.0.0.1:%d", port))
		}
		if o.env != "" {
			env = append(env, o.env)
		}
		g.Go(func() error {
			j, err := startJetsync(gctx, bin, root, pgURL, strings.Join(env, ","))
			js[i] = j
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return [2]otelRun{}, nil, err
	}
	bases := []string{js[0].Base, js[1].Base}
	cpus := func() ([2]time.Duration, error) {
		var out [2]time.Duration
		for i, j := range js {
			c, err := benchenv.CPUTime(j.Cmd.Process.Pid)
			if err != nil {
				return out, err
			}
			out[i] = c
		}
		return out, nil
	}
	var pw sync.WaitGroup
	for i, p := range profiles {
		if p != "" {
			addr := ""
			for _, kv := range js[i].Cmd.Env {
				if v, ok := strings.CutPrefix(kv, "JETSYNC_PPROF_ADDR="); ok {
					addr = v
				}
			}
			pw.Go(func() {
				if err := fetchProfile(ctx, addr, p); err != nil {
					fmt.Println("cpu profile:", err)
				}
			})
		}
	}
	defer pw.Wait()
	c0, err := cpus()
	if err != nil {
		return [2]otelRun{}, nil, err
	}
	tput, err := measureThroughputs(ctx, bases, pgURL, q, o.otelTxns, 0)
	if err != nil {
		return [2]otelRun{}, nil, fmt.Errorf("throughput: %w", err)
	}
	c1, err := cpus()
	if err != nil {
		return [2]otelRun{}, nil, err
	}
	if _, err := measureThroughputs(ctx, bases, pgURL, q, o.otelPaced, o.otelRate); err != nil {
		return [2]otelRun{}, nil, fmt.Errorf("paced: %w", err)
	}
	c2, err := cpus()
	if err != nil {
		return [2]otelRun{}, nil, err
	}
	t2 := time.Now()
	p50s, lag, err := measureLatencies(ctx, bases, pgURL, q, strings.Split(o.latQs, ","), o.updates, o.rate)
	if err != nil {
		return [2]otelRun{}, nil, fmt.Errorf("latency: %w", err)
	}
	c3, err := cpus()
	if err != nil {
		return [2]otelRun{}, nil, err
	}
	el := time.Since(t2).Seconds()
	var out [2]otelRun
	for i, j := range js {
		if err := j.AliveNoError(); err != nil {
			return out, nil, err
		}
		out[i] = otelRun{throughput: tput[i], cpuPerTxn: (c1[i] - c0[i]) / time.Duration(o.otelTxns),
			pacedCPUPerTxn: (c2[i] - c1[i]) / time.Duration(o.otelPaced),
			steadyCPU:      (c3[i] - c2[i]).Seconds() / el, p50: p50s[i]}
	}
	return out, lag, nil
}

// measureThroughputs is measureThroughput with one client on each of
// bases, all replicating the same upstream: each one's figure is n over
// the time from the first commit to its own poke with the last titles.
func measureThroughputs(ctx context.Context, bases []string, pgURL string, q queries, n, rate int) ([]float64, error) {
	qs, err := q.named(0, []string{"issuesWithLabels"})
	if err != nil {
		return nil, err
	}
	const writers, rows = 4, 28
	marker := fmt.Sprintf("tput-%d-", time.Now().UnixNano())
	final := map[string]bool{}
	per := n / writers
	for w := range writers {
		for k := max(0, per-rows/writers); k < per; k++ {
			final[retitled(marker, w, writers, k)] = true
		}
	}
	dones := make([]<-chan error, len(bases))
	ends := make([]time.Time, len(bases))
	for i, base := range bases {
		c, err := connectGroup(base, fmt.Sprintf("bench-tput-%d-%d", time.Now().UnixNano(), i), qs)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if _, _, err := c.WaitGot(hashes(qs)...); err != nil {
			return nil, err
		}
		want := maps.Clone(final)
		dones[i] = awaitMarkers(c, marker, len(want), func(title string, end time.Time) int {
			if !want[title] {
				return 0
			}
			delete(want, title)
			ends[i] = end
			return 1
		})
	}
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	for w := range writers {
		goRetitle(g, gctx, pgURL, marker, w, writers, rows, per, rate)
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := make([]float64, len(bases))
	timeout := time.After(time.Minute)
	for i := range bases {
		select {
		case err := <-dones[i]:
			if err != nil {
				return nil, fmt.Errorf("client %d's connection failed before every last title arrived: %w", i, err)
			}
			out[i] = float64(writers*per) / ends[i].Sub(start).Seconds()
		case <-timeout:
			return nil, fmt.Errorf("not every last title reached client %d within a minute of the last commit: %w", i, errTimeout)
		}
	}
	return out, nil
}

// measureLatencies commits n single-row UPDATEs at rate per second, each
// retitling one of the first latencyRows issues, and returns, for a client on each
// of bases holding the queries named (issuesWithLabels shows those
// issues), the p50 of the time from a commit
// returning to the pokeEnd carrying its title.
func measureLatencies(ctx context.Context, bases []string, pgURL string, q queries, names []string, n, rate int) (p50s, lag []time.Duration, err error) {
	qs, err := q.named(0, names)
	if err != nil {
		return nil, nil, err
	}
	marker := fmt.Sprintf("lat-%d-", time.Now().UnixNano())
	committed := make([]time.Time, n)
	arrived := make([][]time.Time, len(bases))
	dones := make([]<-chan error, len(bases))
	for i, base := range bases {
		c, err := connectGroup(base, fmt.Sprintf("bench-latency-%d-%d", time.Now().UnixNano(), i), qs)
		if err != nil {
			return nil, nil, err
		}
		defer c.Close()
		if _, _, err := c.WaitGot(hashes(qs)...); err != nil {
			return nil, nil, err
		}
		arrived[i] = make([]time.Time, n)
		// An update that a stall let the next one of its row overwrite
		// before the poke never shows: the client waits for the last of
		// each row's, which always do.
		dones[i] = awaitMarkers(c, marker, min(n, latencyRows), func(title string, end time.Time) int {
			k, err := strconv.Atoi(strings.TrimPrefix(title, marker))
			if err != nil || k < 0 || k >= n || !arrived[i][k].IsZero() {
				return 0
			}
			arrived[i][k] = end
			if k >= n-latencyRows {
				return 1
			}
			return 0
		})
	}
	pg, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return nil, nil, err
	}
	defer pg.Close(context.WithoutCancel(ctx))
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for k := range n {
		<-tick.C
		id := fmt.Sprintf("i%07d", 1+k%latencyRows)
		if _, err := pg.Exec(ctx, `UPDATE issue SET title = $1 WHERE id = $2`, marker+strconv.Itoa(k), id); err != nil {
			return nil, nil, err
		}
		committed[k] = time.Now()
	}
	timeout := time.After(time.Minute)
	for i := range bases {
		select {
		case err := <-dones[i]:
			if err != nil {
				return nil, nil, fmt.Errorf("client %d: %w", i, err)
			}
		case <-timeout:
			return nil, nil, fmt.Errorf("not every update reached both clients within a minute of the last commit: %w", errTimeout)
		}
	}
	// The p50 is over the updates that every client saw, so that an
	// update one of them missed does not shift one side's figure alone.
	out := make([]time.Duration, len(bases))
	var both []int
	for k := range n {
		if !slices.ContainsFunc(arrived, func(a []time.Time) bool { return a[k].IsZero() }) {
			both = append(both, k)
		}
	}
	for i := range bases {
		var ds []time.Duration
		for _, k := range both {
			ds = append(ds, max(0, arrived[i][k].Sub(committed[k])))
		}
		slices.Sort(ds)
		out[i] = ds[len(ds)/2]
	}
	// Each update's arrival at the last client less its arrival at the
	// first: the same commit, so neither the commit's own time nor the
	// load of the moment is in it.
	for _, k := range both {
		lag = append(lag, arrived[len(bases)-1][k].Sub(arrived[0][k]))
	}
	return out, lag, nil
}

// latencyRows is how many issues measureLatencies retitles in turn: each
// is retitled every latencyRows/rate seconds.
const latencyRows = 30
