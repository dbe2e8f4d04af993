// Command spine measures the spine — Postgres → JetStream → SQLite replica —
// on the benchmark dataset in testdata/bench, in one process, as `jetsync
// run` wires it:
//
//   - start → stream-complete and start → replica-ready after seeding
//     (zero-cache 1.9.0: 4,225 ms to ready);
//   - the single-row transactions per second carried end to end, beside what
//     Postgres alone commits under the same load (zero-cache: about 2,000/s);
//   - commit → replica-applied latency at a fixed rate, p50 and p99.
//
// Usage: go run ./bench/spine [-issues 100000] [-bench-data testdata/bench]
package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	_ "modernc.org/sqlite"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/pglocal"
	"github.com/jetsync/jetsync/producers/pgrepl"
	"github.com/jetsync/jetsync/streams"
)

type options struct {
	issues   int
	data     string
	duration time.Duration
	clients  int
	rate     int
	latN     int
	pgFsync  bool
	keep     bool
	profile  string
	copiers  int
}

func main() {
	var o options
	flag.IntVar(&o.issues, "issues", 100000, "seed.sh ISSUES (100000 gives 451,020 rows)")
	benchenv.DataFlag(&o.data)
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "how long the throughput load runs")
	flag.IntVar(&o.clients, "clients", 16, "concurrent Postgres clients for the throughput load")
	flag.IntVar(&o.rate, "rate", 1000, "transactions per second for the latency run")
	flag.IntVar(&o.latN, "latency-n", 5000, "transactions in the latency run")
	flag.BoolVar(&o.pgFsync, "pg-fsync", false, "run the benchmark Postgres with fsync on")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directories")
	flag.IntVar(&o.copiers, "copy-workers", 0, "parallel table copies (ZERO_INITIAL_SYNC_TABLE_COPY_WORKERS); 0 is the default")
	flag.StringVar(&o.profile, "profile", "", "write CPU profiles of the initial sync and the throughput run into this folder")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "spine:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	root, err := os.MkdirTemp("", "jetsync-bench-")
	if err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(root)
	}
	pg, err := pglocal.Start(ctx, pglocal.Config{Dir: filepath.Join(root, "pg"), FsyncOff: !o.pgFsync, Logger: log})
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	defer pg.Kill(context.Background())
	if err := pg.CreateDatabase(ctx, "zpeer"); err != nil {
		return err
	}
	url := pg.URL("zpeer")

	data, err := benchenv.DataDir(o.data)
	if err != nil {
		return err
	}
	seedStart := time.Now()
	seed := exec.CommandContext(ctx, filepath.Join(data, "seed.sh"), fmt.Sprint(o.issues))
	seed.Env = append(os.Environ(), fmt.Sprintf("PSQL=/usr/lib/postgresql/15/bin/psql %s -v ON_ERROR_STOP=1 -q", url))
	if out, err := seed.CombinedOutput(); err != nil {
		return fmt.Errorf("seed: %w\n%s", err, out)
	} else {
		fmt.Printf("seeded in %v: %s", time.Since(seedStart).Round(time.Millisecond), lastLine(out))
	}

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	ids, err := benchenv.IssueIDs(ctx, pool)
	if err != nil {
		return err
	}

	// Postgres alone, before any slot exists: the ceiling for the end-to-end figure.
	cpuAlone := sampleCPU()
	aloneStart := time.Now()
	aloneCommits, err := benchenv.LoadCount(ctx, pool, ids, o.clients, o.duration/2)
	if err != nil {
		return err
	}
	pgRate := float64(aloneCommits) / time.Since(aloneStart).Seconds()
	cpuAlone = sampleCPU().sub(cpuAlone)

	// Start the spine, as `jetsync run` does.
	stopProfile, err := startProfile(o.profile, "initial-sync.pprof")
	if err != nil {
		return err
	}
	t0 := time.Now()
	ns, err := benchenv.StartNATS(filepath.Join(root, "nats"), log)
	if err != nil {
		return err
	}
	defer ns.Close()
	nc, js := ns.Conn, ns.JS
	shard := streams.Shard{App: "zero", Num: 0}
	src, err := pgrepl.New(pgrepl.Config{UpstreamURL: url, Shard: shard, Publications: []string{"zpeer_pub"}, CopyWorkers: o.copiers, Logger: log}, js)
	if err != nil {
		return err
	}
	rep, err := replicator.New(replicator.Config{File: filepath.Join(root, "replica.db"), Shard: shard, TaskID: "bench", Logger: log}, js)
	if err != nil {
		return err
	}
	sub := rep.Subscribe()
	defer sub.Close()
	g, gctx := errgroup.WithContext(ctx)
	runCtx, stop := context.WithCancel(gctx)
	g.Go(func() error { return src.Run(runCtx) })
	g.Go(func() error { return rep.Run(runCtx) })
	defer func() { stop(); _ = g.Wait() }()

	kv, err := js.KeyValue(ctx, shard.StateBucket())
	for err != nil {
		if time.Since(t0) > time.Minute {
			return err
		}
		time.Sleep(5 * time.Millisecond)
		kv, err = js.KeyValue(ctx, shard.StateBucket())
	}
	var up streams.Upstream
	tStream, err := poll(runCtx, t0, time.Minute, func() (bool, error) {
		e, err := kv.Get(runCtx, streams.KeyUpstream)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		if err := json.Unmarshal(e.Value(), &up); err != nil {
			return false, err
		}
		return up.Complete, nil
	})
	if err != nil {
		return fmt.Errorf("wait for stream-complete: %w", err)
	}
	tReady, err := poll(runCtx, t0, time.Minute, func() (bool, error) {
		st := rep.State()
		return st.ReplicaVersion == up.ReplicaVersion && st.Watermark >= up.ReplicaVersion, nil
	})
	if err != nil {
		return fmt.Errorf("wait for replica-ready: %w", err)
	}
	stopProfile()
	rows, err := countRows(filepath.Join(root, "replica.db"))
	if err != nil {
		return err
	}

	// Throughput: the same load, now carried into the replica.
	drainUpdates(sub)
	if stopProfile, err = startProfile(o.profile, "throughput.pprof"); err != nil {
		return err
	}
	loadStart := time.Now()
	cpuE2E := sampleCPU()
	e2eCommits, err := benchenv.LoadCount(ctx, pool, ids, o.clients, o.duration)
	if err != nil {
		return err
	}
	committedIn := time.Since(loadStart)
	marker := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, `UPDATE issue SET title = $1 WHERE id = $2`, marker, ids[0]); err != nil {
		return err
	}
	if err := waitTitle(runCtx, sub, marker, 5*time.Minute); err != nil {
		return fmt.Errorf("wait for the replica to catch up: %w", err)
	}
	caughtUpIn := time.Since(loadStart)
	cpuE2E = sampleCPU().sub(cpuE2E)
	stopProfile()
	e2eRate := float64(e2eCommits) / caughtUpIn.Seconds()
	pgDuringRate := float64(e2eCommits) / committedIn.Seconds()

	// Latency at a fixed rate.
	lat, err := latency(runCtx, pool, sub, nc, shard, ids, o.rate, o.latN)
	if err != nil {
		return err
	}

	fmt.Println()
	fmt.Println("| measure | jetsync | aim | zero-cache 1.9.0 |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| start → stream-complete (%d rows) | %d ms | | |\n", rows, tStream.Milliseconds())
	fmt.Printf("| start → replica-ready | %d ms | ≤ 2,100 ms | 4,225 ms |\n", tReady.Milliseconds())
	fmt.Printf("| single-row txn/s carried into the replica (%d clients, %v) | %.0f/s | ≥ 10,000/s or Postgres's own | ~2,000/s |\n", o.clients, o.duration, e2eRate)
	fmt.Printf("| Postgres alone, same load / while streaming | %.0f/s / %.0f/s | | |\n", pgRate, pgDuringRate)
	// Where the two cores go, per transaction. The load generator runs in
	// this process: its cost per transaction is what this process spent
	// while Postgres ran alone.
	gen := cpuAlone.self / time.Duration(aloneCommits)
	fmt.Printf("| CPU per transaction, Postgres alone: Postgres %v, load generator %v | | | |\n",
		(cpuAlone.postgres / time.Duration(aloneCommits)).Round(time.Microsecond), gen.Round(time.Microsecond))
	fmt.Printf("| CPU per transaction, streaming: Postgres %v (walsender included), jetsync %v | | | |\n",
		(cpuE2E.postgres / time.Duration(e2eCommits)).Round(time.Microsecond), (cpuE2E.self/time.Duration(e2eCommits) - gen).Round(time.Microsecond))
	fmt.Printf("| commit → in the stream at %d txn/s, p50 / p99 | %.2f / %.2f ms | | |\n", o.rate, ms(lat.streamP50), ms(lat.streamP99))
	fmt.Printf("| commit → replica-applied at %d txn/s, p50 / p99 | %.2f / %.2f ms | | zero-cache commit → client: 5.8 / 15.3 ms |\n", o.rate, ms(lat.replicaP50), ms(lat.replicaP99))
	return nil
}

// startProfile starts a CPU profile into dir/name; with no dir it does
// nothing.
func startProfile(dir, name string) (stop func(), err error) {
	if dir == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// cpu is CPU time spent by this process and by every postgres process.
type cpu struct{ self, postgres time.Duration }

func (c cpu) sub(o cpu) cpu { return cpu{c.self - o.self, c.postgres - o.postgres} }

func sampleCPU() cpu {
	var c cpu
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: fields 14 and 15.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || !bytes.Contains(b[:i], []byte("(postgres")) {
			continue
		}
		f := strings.Fields(string(b[i+2:]))
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks := u + st
		if ppid, _ := strconv.Atoi(f[1]); !isPostgres(ppid) {
			// The postmaster: add what its exited children used.
			cu, _ := strconv.ParseInt(f[13], 10, 64)
			cs, _ := strconv.ParseInt(f[14], 10, 64)
			ticks += cu + cs
		}
		c.postgres += time.Duration(ticks) * time.Second / 100 // USER_HZ
	}
	return c
}

func isPostgres(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && bytes.Contains(b, []byte("(postgres)"))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1] + "\n"
}

// poll calls f until it reports done, and returns the time since t0.
func poll(ctx context.Context, t0 time.Time, limit time.Duration, f func() (bool, error)) (time.Duration, error) {
	deadline := time.Now().Add(limit)
	for {
		ok, err := f()
		if err != nil {
			return 0, err
		}
		if ok {
			return time.Since(t0), nil
		}
		if time.Now().After(deadline) {
			return 0, errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func drainUpdates(sub *replicator.Subscription) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := sub.Next(ctx)
		cancel()
		if err != nil {
			return
		}
	}
}

func waitTitle(ctx context.Context, sub *replicator.Subscription, title string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		u, err := sub.Next(ctx)
		if err != nil {
			return err
		}
		for _, c := range u.Changes {
			if c.New != nil && c.New["title"] == title {
				return nil
			}
		}
	}
}

type latencies struct {
	streamP50, streamP99, replicaP50, replicaP99 time.Duration
}

// latency runs n single-row updates at rate per second, and times each from
// its commit returning to the client until the stream carries it (a core
// NATS subscription on the change subjects) and until the replica applied it
// (the changed-rows subscription).
func latency(ctx context.Context, pool *pgxpool.Pool, sub *replicator.Subscription, nc *nats.Conn, shard streams.Shard, ids []string, rate, n int) (latencies, error) {
	drainUpdates(sub)
	applied := make([]int64, n)
	streamed := make([]atomic.Int64, n)
	prefix := fmt.Sprintf("lat-%d-", time.Now().UnixNano())
	index := func(title string) int {
		k, ok := strings.CutPrefix(title, prefix)
		if !ok {
			return -1
		}
		var i int
		if _, err := fmt.Sscan(k, &i); err != nil || i < 0 || i >= n {
			return -1
		}
		return i
	}
	ns, err := nc.Subscribe(shard.ChangesFilter(), func(msg *nats.Msg) {
		now := time.Now().UnixNano()
		for _, t := range benchenv.NewTitles(msg.Data) {
			if i := index(t); i >= 0 {
				streamed[i].CompareAndSwap(0, now)
			}
		}
	})
	if err != nil {
		return latencies{}, err
	}
	defer ns.Unsubscribe()
	done := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, time.Minute+time.Duration(n/rate)*time.Second)
		defer cancel()
		for seen := 0; seen < n; {
			u, err := sub.Next(rctx)
			if err != nil {
				done <- err
				return
			}
			now := time.Now().UnixNano()
			for _, c := range u.Changes {
				t, _ := c.New["title"].(string)
				if i := index(t); i >= 0 && applied[i] == 0 {
					applied[i] = now
					seen++
				}
			}
		}
		done <- nil
	}()
	committed := benchenv.PacedRetitles(ctx, pool, rate, n, 32, ids, func(i int) string { return fmt.Sprint(prefix, i) })
	if err := <-done; err != nil {
		return latencies{}, err
	}
	var toStream, toReplica []time.Duration
	for i := range n {
		c := committed[i].Load()
		if c == 0 {
			continue
		}
		toReplica = append(toReplica, max(0, time.Duration(applied[i]-c)))
		if s := streamed[i].Load(); s != 0 {
			toStream = append(toStream, max(0, time.Duration(s-c)))
		}
	}
	var l latencies
	l.streamP50, l.streamP99 = percentiles(toStream)
	l.replicaP50, l.replicaP99 = percentiles(toReplica)
	return l, nil
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}

func countRows(file string) (int64, error) {
	db, err := sql.Open("sqlite", "file:"+file+"?mode=ro")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var total int64
	for _, t := range []string{"user", "issue", "comment", "label", "issue_label"} {
		var n int64
		if err := db.QueryRow(`SELECT count(*) FROM "` + t + `"`).Scan(&n); err != nil {
			return 0, fmt.Errorf("count %s: %w", t, err)
		}
		total += n
	}
	return total, nil
}
