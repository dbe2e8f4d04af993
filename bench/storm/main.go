// Command storm measures a reconnect storm on `jetsync run` (issue 15,
// acceptance "Reconnect storm"): 50 client groups watch a hot query — the
// first 30 issues by ID, retitled one row at a time at a fixed rate — while
// 0, 100, 500 and then 1,000 other client groups reconnect at once. Each
// storm group reconnects from the cookie of its last poke after its view
// has been unloaded (JETSYNC_GROUP_IDLE), so the server loads its CVR and
// re-hydrates its two queries, as after a network outage or a deploy.
//
// For each step it prints the watchers' commit → client latency (p50, p99,
// max over every update and watcher), the storm's own time to caught up,
// and for the largest step the p99 over time around the storm. The aim is
// p99 under 250 ms with 1,000 groups reconnecting.
//
// All clients are Go protocol v51 clients (bench/internal/syncclient) in
// this process, sharing the machine's cores with the server, the upstream
// Postgres and the load.
//
// Usage: go run ./bench/storm [-steps 0,100,500,1000] [-watchers 50]
package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/bench/internal/syncclient"
)

const (
	appID       = "zero"
	publication = "zpeer_pub"
	windowSize  = 30
	aimP99      = 250 * time.Millisecond
)

type options struct {
	issues   int
	data     string
	bin      string
	steps    string
	watchers int
	rate     int
	before   time.Duration
	after    time.Duration
	idle     time.Duration
	keep     bool
	stay     bool
	env      string
}

func main() {
	var o options
	flag.IntVar(&o.issues, "issues", 10000, "seed.sh ISSUES")
	benchenv.DataFlag(&o.data)
	flag.StringVar(&o.bin, "bin", "bin/jetsync", "the jetsync binary (make build); built into a temporary folder when missing")
	flag.StringVar(&o.steps, "steps", "0,100,500,1000", "comma-separated numbers of client groups reconnecting at once, one step each")
	flag.IntVar(&o.watchers, "watchers", 50, "client groups watching the hot query")
	flag.IntVar(&o.rate, "rate", 50, "updates per second of the hot query's rows")
	flag.DurationVar(&o.before, "before", 2*time.Second, "updates before each storm starts")
	flag.DurationVar(&o.after, "after", 8*time.Second, "updates after each storm starts")
	flag.DurationVar(&o.idle, "group-idle", 5*time.Second, "JETSYNC_GROUP_IDLE: storm groups reconnect after their view was unloaded")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory")
	flag.BoolVar(&o.stay, "stay", true, "storm clients stay connected once caught up; false closes each at once, which leaves only the storm itself")
	flag.StringVar(&o.env, "env", "", "comma-separated KEY=VALUE settings added to jetsync's environment")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "storm:", err)
		os.Exit(1)
	}
}

// hotQuery is the watchers' query: the rows the updates retitle.
var hotQuery = syncclient.NewQuery(`{"table":"issue","limit":30,"orderBy":[["id","asc"]]}`)

// stormQueries are storm group g's two queries: one issue with its comments,
// and one owner's 20 latest issues, different for each group.
func stormQueries(ids []string, owners int, g int) []syncclient.Query {
	issue := ids[windowSize+g%(len(ids)-windowSize)]
	owner := fmt.Sprintf("u%06d", 1+g%owners)
	return []syncclient.Query{
		syncclient.NewQuery(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"` + issue + `"},"op":"="},"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","asc"]]},"system":"client"}],"limit":1}`),
		syncclient.NewQuery(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"literal","value":"` + owner + `"},"op":"="},"limit":20,"orderBy":[["modified","desc"],["id","asc"]]}`),
	}
}

// stormGroup is one client group of the storm: its queries and the cookie
// its client last completed a poke at.
type stormGroup struct {
	group, client string
	queries       []syncclient.Query
	cookie        string
}

func (g *stormGroup) init() string {
	var puts []string
	for _, q := range g.queries {
		puts = append(puts, q.Put(300000))
	}
	return syncclient.InitConnection(puts...)
}

// connect dials the group from its cookie, waits for its queries (or, from
// a cookie, the catch-up poke) and returns the client, still connected.
func (g *stormGroup) connect(base string) (*syncclient.Client, error) {
	c, err := syncclient.Dial(base, syncclient.Options{Group: g.group, Client: g.client, Init: g.init(), BaseCookie: g.cookie, ReadTimeout: time.Minute})
	if err != nil {
		return nil, err
	}
	pending := map[string]bool{}
	if g.cookie == "" {
		for _, q := range g.queries {
			pending[q.Hash] = true
		}
	}
	for {
		p, err := c.NextPoke("")
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("group %s: %w", g.group, err)
		}
		if p.Cookie != "" {
			g.cookie = p.Cookie
		}
		for h, op := range p.Got {
			if op == "put" {
				delete(pending, h)
			}
		}
		if len(pending) == 0 {
			return c, nil
		}
	}
}

// watcher is a client of the hot query and when each update reached it.
type watcher struct {
	c       *syncclient.Client
	arrived []atomic.Int64 // update index → Unix nanoseconds of its pokeEnd
	err     atomic.Pointer[error]
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var steps []int
	for _, s := range strings.Split(o.steps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return fmt.Errorf("-steps %q: %q is not a count", o.steps, s)
		}
		steps = append(steps, n)
	}
	root, cleanup, err := benchenv.TempRoot("storm", o.keep)
	if err != nil {
		return err
	}
	defer cleanup()
	bin, err := benchenv.JetsyncBin(ctx, o.bin, root)
	if err != nil {
		return err
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
	ids, err := benchenv.IssueIDs(ctx, pool)
	if err != nil {
		return err
	}
	if len(ids) < 2*windowSize {
		return fmt.Errorf("%d issues; want at least %d", len(ids), 2*windowSize)
	}
	owners := max(10, o.issues/100)

	js, err := startJetsync(ctx, bin, root, url, o.idle, o.env)
	if err != nil {
		return err
	}
	defer js.Stop()

	// Every update has an index; watchers note when each arrived.
	perStep := int((o.before + o.after).Seconds() * float64(o.rate))
	total := perStep * len(steps)
	marker := fmt.Sprintf("storm-%d-", time.Now().UnixNano())
	watchers := make([]*watcher, o.watchers)
	for w := range watchers {
		c, err := syncclient.Dial(js.Base, syncclient.Options{Group: fmt.Sprintf("watch-%d", w), Client: fmt.Sprintf("watch-%d", w),
			Init: syncclient.InitConnection(hotQuery.Put(300000)), ReadTimeout: time.Minute})
		if err != nil {
			return err
		}
		defer c.Close()
		if _, _, err := c.WaitGot(hotQuery.Hash); err != nil {
			return fmt.Errorf("watcher %d: %w", w, err)
		}
		wt := &watcher{c: c, arrived: make([]atomic.Int64, total)}
		watchers[w] = wt
		go wt.read(marker, total)
	}
	fmt.Printf("%d watchers hold the hot query\n", len(watchers))

	// The storm groups are created once, each hydrating its queries, and
	// closed: each step reconnects the first n of them.
	most := slices.Max(steps)
	groups := make([]*stormGroup, most)
	t0 := time.Now()
	if err := parallel(16, most, func(g int) error {
		sg := &stormGroup{group: fmt.Sprintf("storm-%d", g), client: fmt.Sprintf("storm-%d", g), queries: stormQueries(ids, owners, g)}
		c, err := sg.connect(js.Base)
		if err != nil {
			return err
		}
		c.Close()
		groups[g] = sg
		return nil
	}); err != nil {
		return fmt.Errorf("create storm groups: %w", err)
	}
	fmt.Printf("%d storm groups created in %v\n", most, time.Since(t0).Round(time.Millisecond))

	window := ids[:windowSize]
	type stepResult struct {
		n                int
		p50, p99, max    time.Duration
		samples, missing int
		caughtP50        time.Duration
		caughtP99        time.Duration
		caughtMax        time.Duration
		failed           int
		curve            []string
	}
	var results []stepResult
	for si, n := range steps {
		// Unloaded views: the storm re-hydrates from durable CVRs.
		time.Sleep(o.idle + 2*time.Second)
		first := si * perStep
		var (
			caught  []time.Duration
			failed  atomic.Int64
			cmu     sync.Mutex
			clients []*syncclient.Client
			stormAt atomic.Int64
			wg      sync.WaitGroup
		)
		wg.Go(func() {
			time.Sleep(o.before)
			stormAt.Store(time.Now().UnixNano())
			var inner sync.WaitGroup
			for _, g := range groups[:n] {
				inner.Go(func() {
					start := time.Now()
					c, err := g.connect(js.Base)
					if err != nil {
						failed.Add(1)
						fmt.Fprintln(os.Stderr, "storm reconnect:", err)
						return
					}
					cmu.Lock()
					caught = append(caught, time.Since(start))
					cmu.Unlock()
					if !o.stay {
						c.Close()
						return
					}
					cmu.Lock()
					clients = append(clients, c)
					cmu.Unlock()
					// Keep reading, as a connected client does.
					go func() {
						for {
							p, err := c.NextPoke("")
							if err != nil {
								return
							}
							if p.Cookie != "" {
								cmu.Lock()
								g.cookie = p.Cookie
								cmu.Unlock()
							}
						}
					}()
				})
			}
			inner.Wait()
		})
		committed := benchenv.PacedRetitles(ctx, pool, o.rate, perStep, 8, window, func(i int) string { return marker + strconv.Itoa(first+i) })
		wg.Wait()
		// Every update reaches every watcher, or the step fails.
		deadline := time.Now().Add(3 * time.Minute)
		for _, w := range watchers {
			for i := range perStep {
				for committed[i].Load() != 0 && w.arrived[first+i].Load() == 0 {
					if e := w.err.Load(); e != nil {
						return fmt.Errorf("watcher: %w", *e)
					}
					if time.Now().After(deadline) {
						return fmt.Errorf("step %d: update %d did not reach a watcher within 3 minutes", n, first+i)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
		cmu.Lock()
		for _, c := range clients {
			c.Close()
		}
		cmu.Unlock()
		r := stepResult{n: n, failed: int(failed.Load())}
		var lat []time.Duration
		type sample struct {
			at  int64
			lat time.Duration
		}
		var timed []sample
		for i := range perStep {
			at := committed[i].Load()
			if at == 0 {
				r.missing++
				continue
			}
			for _, w := range watchers {
				d := max(0, time.Duration(w.arrived[first+i].Load()-at))
				lat = append(lat, d)
				timed = append(timed, sample{at, d})
			}
		}
		r.samples = len(lat)
		r.p50, r.p99, r.max = pct(lat, 50), pct(lat, 99), pct(lat, 100)
		r.caughtP50, r.caughtP99, r.caughtMax = pct(caught, 50), pct(caught, 99), pct(caught, 100)
		// The curve: p99 per second of commit time, from the storm's
		// start.
		if s := stormAt.Load(); s != 0 {
			buckets := map[int][]time.Duration{}
			for _, x := range timed {
				b := int(math.Floor(float64(x.at-s) / float64(time.Second)))
				buckets[b] = append(buckets[b], x.lat)
			}
			keys := slices.Sorted(maps.Keys(buckets))
			for _, k := range keys {
				r.curve = append(r.curve, fmt.Sprintf("%+ds %.0f", k, ms(pct(buckets[k], 99))))
			}
		}
		results = append(results, r)
		fmt.Printf("step %d reconnecting: watchers p50 %.1f ms, p99 %.1f ms, max %.1f ms (%d samples); storm caught up p50 %.0f ms, p99 %.0f ms, max %.0f ms, %d failed\n",
			n, ms(r.p50), ms(r.p99), ms(r.max), r.samples, ms(r.caughtP50), ms(r.caughtP99), ms(r.caughtMax), r.failed)
		fmt.Printf("  watchers' p99 (ms) by second of commit from the storm's start: %s\n", strings.Join(r.curve, ", "))
		if err := js.AliveNoError(); err != nil {
			return err
		}
	}

	fmt.Println()
	fmt.Printf("| groups reconnecting at once (%d watchers, %d updates/s of the hot query, %d issues) | watchers' commit → client p50 / p99 / max | storm groups caught up p50 / p99 / max | failed reconnects |\n", o.watchers, o.rate, o.issues)
	fmt.Println("|---|---|---|---|")
	for _, r := range results {
		fmt.Printf("| %d | %.1f / %.1f / %.1f ms | %.0f / %.0f / %.0f ms | %d |\n", r.n, ms(r.p50), ms(r.p99), ms(r.max), ms(r.caughtP50), ms(r.caughtP99), ms(r.caughtMax), r.failed)
	}
	last := results[len(results)-1]
	fig := fmt.Sprintf("%.1f ms", ms(last.p99))
	if last.failed > 0 {
		fig += fmt.Sprintf(", %d reconnects failed", last.failed)
	}
	benchenv.Report(benchenv.Aim{Issue: 15, Name: fmt.Sprintf("reconnect storm: %d watchers' p99 with %d groups reconnecting, all served", o.watchers, last.n),
		Figure: fig, Target: fmt.Sprintf("< %v", aimP99), Met: last.p99 < aimP99 && last.failed == 0})
	return nil
}

// read notes when each marked update reached the watcher. A poke that
// catches up on several updates of one row carries only the last: it
// delivers the earlier ones too.
func (w *watcher) read(marker string, total int) {
	for {
		p, err := w.c.NextPoke(marker)
		if err != nil {
			w.err.Store(&err)
			return
		}
		for _, t := range p.Markers {
			k, ok := strings.CutPrefix(t, marker)
			if !ok {
				continue
			}
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= total {
				continue
			}
			for ; i >= 0; i -= windowSize {
				w.arrived[i].CompareAndSwap(0, p.End.UnixNano())
			}
		}
	}
}

// parallel runs f(0..n-1), at most k at once, and returns the first error.
func parallel(k, n int, f func(i int) error) error {
	sem := make(chan struct{}, k)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(i); err != nil {
				once.Do(func() { first = err })
			}
		})
	}
	wg.Wait()
	return first
}

// startJetsync runs `jetsync run` on the upstream with in-process NATS and
// no backups, and returns once it serves queries.
func startJetsync(ctx context.Context, bin, root, upstreamURL string, idle time.Duration, extraEnv string) (*benchenv.Proc, error) {
	return benchenv.StartRun(ctx, benchenv.Run{
		Bin: bin, Root: root, Extra: extraEnv,
		Env: []string{"ZERO_UPSTREAM_DB=" + upstreamURL, "ZERO_APP_ID=" + appID, "ZERO_APP_PUBLICATIONS=" + publication,
			"JETSYNC_BACKUP=off", "JETSYNC_GROUP_IDLE=" + idle.String()},
	})
}

// pct is the p-th percentile of d (p=100: the max); 0 for none.
func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
