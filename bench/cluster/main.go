// Command cluster measures jetsync's multi-process topology — nats-servers,
// `jetsync change-streamer` and `jetsync view-syncer`, each its own process
// on 127.0.0.1 — on the 3-node NATS cluster of nats-config/cluster with R3
// streams, against one nats-server with R1 streams (issue 8, acceptance 5):
//
//   - commit → client latency, p50 / p99: a websocket client holds a query on
//     30 issues; single-row UPDATEs retitle them at a fixed rate, each timed
//     from its commit returning to the pokeEnd carrying the new title;
//   - commit → stored in the change stream, p50 / p99, for the same updates
//     (an ordered consumer), which isolates what R3 replication costs;
//   - sustained single-row transactions/s: bench/spine's load (16 clients
//     updating random issues) for a while, then a marker update, timed until
//     the client has it.
//
// Both topologies fsync every write (sync_interval: always), back up nothing
// (JETSYNC_BACKUP=off) and restore nothing, so that only the broker differs.
// Everything shares this machine's cores, the load generator included.
//
// Usage: go run ./bench/cluster [-issues 10000] [-bench-data testdata/bench]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/streams"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/bench/internal/syncclient"
)

type options struct {
	issues     int
	data       string
	bin        string
	natsServer string
	duration   time.Duration
	clients    int
	rate       int
	latN       int
	keep       bool
}

func main() {
	var o options
	flag.IntVar(&o.issues, "issues", 10000, "seed.sh ISSUES")
	benchenv.DataFlag(&o.data)
	flag.StringVar(&o.bin, "bin", "bin/jetsync", "the jetsync binary (make build)")
	flag.StringVar(&o.natsServer, "nats-server", "bin/nats-server", "the nats-server binary; built from the module's nats-server version when missing")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "how long the throughput load runs")
	flag.IntVar(&o.clients, "clients", 16, "concurrent Postgres clients for the throughput load")
	flag.IntVar(&o.rate, "rate", 200, "updates per second for the latency run")
	flag.IntVar(&o.latN, "latency-n", 2000, "updates in the latency run")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directories")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

// topology is one broker set-up under test.
type topology struct {
	name     string
	nodes    int
	replicas int
}

var topologies = []topology{
	{name: "single node, R1", nodes: 1, replicas: 1},
	{name: "3-node cluster, R3", nodes: 3, replicas: 3},
}

// result is what one topology measured.
type result struct {
	ready                time.Duration // change-streamer start → the client has its query
	clientP50, clientP99 time.Duration
	streamP50, streamP99 time.Duration
	txRate, pgDuringRate float64
	commits              int64
	latencyN             int
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var err error
	if o.bin, err = filepath.Abs(o.bin); err != nil {
		return err
	}
	if _, err := os.Stat(o.bin); err != nil {
		return fmt.Errorf("%s: %w (run make build)", o.bin, err)
	}
	if o.natsServer, err = natsServerBin(o.natsServer); err != nil {
		return err
	}
	root, err := os.MkdirTemp("", "jetsync-bench-cluster-")
	if err != nil {
		return err
	}
	if err := os.Chmod(root, 0o711); err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(root)
	}
	pg, url, err := benchenv.StartUpstream(ctx, root, o.data, o.issues, appID)
	if err != nil {
		return err
	}
	defer pg.Kill(context.Background())
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	ids, err := issueIDs(ctx, pool)
	if err != nil {
		return err
	}
	aloneStart := time.Now()
	alone, err := benchenv.LoadCount(ctx, pool, ids, o.clients, o.duration/2)
	if err != nil {
		return err
	}
	pgRate := float64(alone) / time.Since(aloneStart).Seconds()

	results := make([]result, len(topologies))
	for i, tp := range topologies {
		fmt.Printf("== %s\n", tp.name)
		r, err := measure(ctx, o, tp, filepath.Join(root, strconv.Itoa(i)), url, pool, ids)
		if err != nil {
			return fmt.Errorf("%s: %w", tp.name, err)
		}
		results[i] = r
		// The next topology starts from an empty broker, so with a new
		// initial sync and slot: drop the old one's.
		if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active`); err != nil {
			return fmt.Errorf("drop slots: %w", err)
		}
	}

	one, three := results[0], results[1]
	fmt.Println()
	fmt.Printf("| measure (%d issues, processes on 127.0.0.1) | %s | %s |\n", o.issues, topologies[0].name, topologies[1].name)
	fmt.Println("|---|---|---|")
	fmt.Printf("| commit → client at %d txn/s, p50 / p99 (%d updates, 1 client, 1 query of 30 rows) | %.1f / %.1f ms | %.1f / %.1f ms |\n",
		o.rate, one.latencyN, ms(one.clientP50), ms(one.clientP99), ms(three.clientP50), ms(three.clientP99))
	fmt.Printf("| commit → stored in the change stream, same updates, p50 / p99 | %.1f / %.1f ms | %.1f / %.1f ms |\n",
		ms(one.streamP50), ms(one.streamP99), ms(three.streamP50), ms(three.streamP99))
	fmt.Printf("| sustained single-row txn/s carried to the client (%d Postgres clients, %v) | %.0f/s | %.0f/s |\n",
		o.clients, o.duration, one.txRate, three.txRate)
	fmt.Printf("| Postgres's own rate during that load (alone, before: %.0f/s) | %.0f/s | %.0f/s |\n",
		pgRate, one.pgDuringRate, three.pgDuringRate)
	fmt.Printf("| change-streamer start → client has its query (initial sync of %d issues included) | %d ms | %d ms |\n",
		o.issues, one.ready.Milliseconds(), three.ready.Milliseconds())
	return nil
}

// measure starts tp's brokers, a change-streamer and a view-syncer, runs the
// measurements and stops them all.
func measure(ctx context.Context, o options, tp topology, dir, url string, pool *pgxpool.Pool, ids []string) (result, error) {
	var r result
	var procs []*benchenv.Proc
	defer func() {
		for _, p := range slices.Backward(procs) {
			p.Stop()
		}
	}()
	natsURLs, err := startNATS(ctx, o.natsServer, tp.nodes, dir, &procs)
	if err != nil {
		return r, err
	}
	nc, err := nats.Connect(strings.Join(natsURLs, ","), nats.MaxReconnects(-1), nats.UserInfo("admin", natsPasswords["NATS_ADMIN_PASSWORD"]))
	if err != nil {
		return r, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return r, err
	}
	if err := waitJetStream(ctx, js); err != nil {
		return r, err
	}
	env := []string{
		"JETSYNC_NATS_URL=" + strings.Join(natsURLs, ","),
		"JETSYNC_STREAM_REPLICAS=" + strconv.Itoa(tp.replicas),
		"ZERO_APP_ID=" + appID,
		"ZERO_APP_PUBLICATIONS=" + publication,
		"ZERO_PORT=0",
		"ZERO_LOG_FORMAT=json",
		"JETSYNC_BACKUP=off",
		"JETSYNC_RESTORE=off",
	}
	t0 := time.Now()
	cs, err := startJetsync(ctx, o.bin, filepath.Join(dir, "change-streamer"), "change-streamer",
		append(append(env, natsUser("change-streamer", "NATS_CHANGE_STREAMER_PASSWORD")...), "ZERO_UPSTREAM_DB="+url, "ZERO_TASK_ID=change-streamer"))
	if err != nil {
		return r, err
	}
	procs = append(procs, cs)
	vs, err := startJetsync(ctx, o.bin, filepath.Join(dir, "view-syncer"), "view-syncer",
		append(append(env, natsUser("view-syncer", "NATS_VIEW_SYNCER_PASSWORD")...), "ZERO_TASK_ID=view-syncer"))
	if err != nil {
		return r, err
	}
	procs = append(procs, vs)
	if _, err := vs.WaitLog(ctx, "initial sync applied", 5*time.Minute); err != nil {
		return r, err
	}
	c, err := syncclient.Dial(vs.Base, syncclient.Options{Group: fmt.Sprintf("bench-cluster-%d", time.Now().UnixNano()), Client: "c", Init: syncclient.InitConnection(windowQuery.Put(300000)), ReadBufferSize: 64 << 10})
	if err != nil {
		return r, err
	}
	defer c.Close()
	if _, _, err := c.WaitGot(windowQuery.Hash); err != nil {
		return r, err
	}
	r.ready = time.Since(t0)
	fmt.Printf("ready in %v\n", r.ready.Round(time.Millisecond))

	window := ids[:windowSize]
	lat, err := latency(ctx, pool, c, js, o.rate, o.latN, window)
	if err != nil {
		return r, err
	}
	r.latencyN = o.latN
	r.clientP50, r.clientP99 = percentiles(lat.client)
	r.streamP50, r.streamP99 = percentiles(lat.stream)
	fmt.Printf("commit → client p50 %.1f ms, p99 %.1f ms; → stream p50 %.1f ms, p99 %.1f ms\n",
		ms(r.clientP50), ms(r.clientP99), ms(r.streamP50), ms(r.streamP99))

	if r.commits, r.txRate, r.pgDuringRate, err = throughput(ctx, o, pool, c, ids); err != nil {
		return r, err
	}
	fmt.Printf("%d transactions: %.0f/s carried to the client, %.0f/s committed\n", r.commits, r.txRate, r.pgDuringRate)
	for _, p := range []*benchenv.Proc{cs, vs} {
		if err := alive(p); err != nil {
			return r, err
		}
	}
	return r, nil
}

const (
	appID       = "zero"
	publication = "zpeer_pub"
	windowSize  = 30
)

// windowQuery is the first 30 issues by ID: the rows the latency run
// retitles.
var windowQuery = syncclient.NewQuery(`{"table":"issue","limit":30,"orderBy":[["id","asc"]]}`)

type latencySample struct{ client, stream []time.Duration }

// latency commits n single-row UPDATEs at rate per second, each retitling
// one issue of the client's window, and times each from its commit
// returning to the pokeEnd carrying it, and to an ordered consumer of the
// change stream getting it.
func latency(ctx context.Context, pool *pgxpool.Pool, c *syncclient.Client, js jetstream.JetStream, rate, n int, window []string) (latencySample, error) {
	var s latencySample
	marker := fmt.Sprintf("lat-%d-", time.Now().UnixNano())
	index := func(title string) int {
		k, ok := strings.CutPrefix(title, marker)
		if !ok {
			return -1
		}
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 || i >= n {
			return -1
		}
		return i
	}
	streamed := make([]atomic.Int64, n)
	arrived := make([]int64, n)
	// An ordered consumer gets a message once the stream has stored it
	// (on a cluster, once a quorum has), unlike a core subscription, which
	// sees the publish itself.
	cons, err := js.OrderedConsumer(ctx, streams.Shard{App: appID}.ChangesStream(), jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return s, err
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		now := time.Now().UnixNano()
		for _, t := range benchenv.NewTitles(msg.Data()) {
			if i := index(t); i >= 0 {
				streamed[i].CompareAndSwap(0, now)
			}
		}
	})
	if err != nil {
		return s, err
	}
	defer cc.Stop()
	done := make(chan error, 1)
	go func() {
		for seen := 0; seen < n; {
			p, err := c.NextPoke(marker)
			if err != nil {
				done <- err
				return
			}
			for _, t := range p.Markers {
				// A poke that catches up on several updates of one
				// row carries only the last: it delivers the
				// earlier ones too.
				for i := index(t); i >= 0; i -= len(window) {
					if arrived[i] == 0 {
						arrived[i] = p.End.UnixNano()
						seen++
					}
				}
			}
		}
		done <- nil
	}()
	// A few connections, so that a slow commit does not hold the rate back.
	committed := benchenv.PacedRetitles(ctx, pool, rate, n, 8, window, func(i int) string { return marker + strconv.Itoa(i) })
	select {
	case err := <-done:
		if err != nil {
			return s, err
		}
	case <-time.After(time.Minute):
		c.Close()
		return s, errors.New("not every update reached the client within a minute of the last commit")
	}
	for i := range n {
		at := committed[i].Load()
		if at == 0 {
			continue
		}
		s.client = append(s.client, max(0, time.Duration(arrived[i]-at)))
		if st := streamed[i].Load(); st != 0 {
			s.stream = append(s.stream, max(0, time.Duration(st-at)))
		}
	}
	return s, nil
}

// throughput runs the load for o.duration, then commits a marker in the
// client's window and waits for the client to have it: the rate carried to
// the client is the load's commits over that whole time.
func throughput(ctx context.Context, o options, pool *pgxpool.Pool, c *syncclient.Client, ids []string) (commits int64, carried, committed float64, err error) {
	marker := fmt.Sprintf("tput-%d", time.Now().UnixNano())
	seen := make(chan error, 1)
	// The client reads all along, as a real one does: a client that stops
	// reading is disconnected.
	go func() {
		for {
			p, err := c.NextPoke(marker)
			if err != nil {
				seen <- err
				return
			}
			if len(p.Markers) > 0 {
				seen <- nil
				return
			}
		}
	}()
	start := time.Now()
	if commits, err = benchenv.LoadCount(ctx, pool, ids, o.clients, o.duration); err != nil {
		return 0, 0, 0, err
	}
	committedIn := time.Since(start)
	if _, err := pool.Exec(ctx, `UPDATE issue SET title = $1 WHERE id = $2`, marker, ids[0]); err != nil {
		return 0, 0, 0, err
	}
	select {
	case err := <-seen:
		if err != nil {
			return 0, 0, 0, err
		}
	case <-time.After(5 * time.Minute):
		c.Close()
		return 0, 0, 0, errors.New("the client did not see the load's end within 5 minutes")
	}
	return commits, float64(commits) / time.Since(start).Seconds(), float64(commits) / committedIn.Seconds(), nil
}

func issueIDs(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	ids, err := benchenv.IssueIDs(ctx, pool)
	if err != nil {
		return nil, err
	}
	if len(ids) < windowSize {
		return nil, fmt.Errorf("%d issues; want at least %d", len(ids), windowSize)
	}
	return ids, nil
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
