// Command custom measures what synced queries and custom mutators cost
// (issue 6), on seed.sh data, with the app's API server
// (e2e/client/api-server.mjs under Node 22: the package's
// handleQueryRequest, handleMutateRequest and postgres.js adapter) behind
// ZERO_QUERY_URL and ZERO_MUTATE_URL:
//
//   - mutation: a Go client speaking protocol v51 holds a query over ten
//     issues and pushes custom mutations (issue.setTitle on one of them) one
//     at a time; each is timed from its push to the pokeEnd of the poke that
//     confirms it (lastMutationIDChanges reaching its id), which must also
//     carry the retitled row. zero-cache 1.9.0 took about 20 ms on this
//     machine (testdata/bench/README.md, and the transcript
//     testdata/spec/transcripts/mutation-push.jsonl).
//   - hydration: five shapes of the e2e app (e2e/client/app/queries.mjs),
//     each as the legacy AST query the real client sends and as the synced
//     query (name and args) that the API server transforms into the same
//     AST; each run a new client group and a new query hash, so no transform
//     is cached; from the put to the pokeEnd carrying its gotQueriesPatch.
//     Both must bring the same number of rows. The report gives the medians
//     and the synced query's extra time.
//
// -server zero-cache runs the same measures against zero-cache 1.9.0 from
// the e2e install (as make e2e-reference does), for reference figures.
//
// Usage: go run ./bench/custom [-server jetsync|zero-cache] [-issues 1000] [-mutations 300] [-rounds 21]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/bench/internal/syncclient"
)

// zcMutationMS is zero-cache 1.9.0's custom-mutator round trip, push to
// confirmed, on seed.sh 1000 (testdata/bench/README.md).
const zcMutationMS = 20

// authSecret signs the client's token. Auth is on, as in a real app: the
// servers verify the JWT, and the API server verifies what they forward.
const authSecret = "jetsync-bench-secret-0123456789abcdef"

// readTimeout bounds the wait for any one frame.
const readTimeout = time.Minute

type options struct {
	server    string
	issues    int
	data      string
	bin       string
	mutations int
	rounds    int
	keep      bool
	verbose   bool
	load      string // loadAvg when the run started
}

func main() {
	var o options
	flag.StringVar(&o.server, "server", "jetsync", "the sync server measured: jetsync or zero-cache (1.9.0, from make node-deps)")
	flag.IntVar(&o.issues, "issues", 1000, "seed.sh ISSUES (zero-cache's mutation figure is on 1000)")
	benchenv.DataFlag(&o.data)
	flag.StringVar(&o.bin, "bin", "bin/jetsync", "the jetsync binary (make build); built into a temporary folder when missing")
	flag.IntVar(&o.mutations, "mutations", 300, "custom mutations timed (after 10 unmeasured)")
	flag.IntVar(&o.rounds, "rounds", 21, "hydrations of each shape in each form (after one unmeasured round)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (Postgres, the servers' data and logs)")
	flag.BoolVar(&o.verbose, "v", false, "print each hydration")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "custom:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.server != "jetsync" && o.server != "zero-cache" {
		return fmt.Errorf("-server %q: want jetsync or zero-cache", o.server)
	}
	if o.mutations < 20 || o.rounds < 1 {
		return errors.New("-mutations must be at least 20 and -rounds at least 1")
	}
	o.load = loadAvg()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node, err := nodeBin()
	if err != nil {
		// As bench/viewsyncer's client measure: make bench does not install
		// Node before the bench/* loop runs.
		fmt.Println("custom: skipped:", err)
		return nil
	}
	root, err := os.MkdirTemp("", "jetsync-bench-custom-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("temporary folder:", root)
	} else {
		defer os.RemoveAll(root)
	}

	pg, upstream, err := benchenv.StartUpstream(ctx, root, o.data, o.issues, appID)
	if err != nil {
		return err
	}
	defer func() { _ = pg.Kill(context.WithoutCancel(ctx)) }()
	api, err := startAPIServer(ctx, node, root, upstream)
	if err != nil {
		return err
	}
	defer api.Stop()

	token, err := signToken("u000001", time.Hour)
	if err != nil {
		return err
	}
	var srv *benchenv.Proc
	t0 := time.Now()
	if o.server == "jetsync" {
		bin, err := benchenv.JetsyncBin(ctx, o.bin, root)
		if err != nil {
			return err
		}
		srv, err = startJetsync(ctx, bin, root, upstream, api.Base)
		if err != nil {
			return err
		}
	} else {
		srv, err = startZeroCache(ctx, node, root, upstream, api.Base)
		if err != nil {
			return err
		}
	}
	defer srv.Stop()
	fmt.Printf("%s ready in %v, sync endpoint %s, API server %s\n", o.server, time.Since(t0).Round(time.Millisecond), srv.Base, api.Base)

	hyd, err := measureHydration(srv.Base, token, shapesOf(o.issues), o.rounds, o.verbose)
	if err != nil {
		return fmt.Errorf("hydration: %w", err)
	}
	mut, err := measureMutations(srv.Base, token, o.mutations)
	if err != nil {
		return fmt.Errorf("mutations: %w", err)
	}
	for _, p := range []*benchenv.Proc{srv, api} {
		if err := p.Alive(); err != nil {
			return err
		}
	}
	printReport(o, mut, hyd)
	return nil
}

// shape is one of the e2e app's queries in both forms: the AST the real
// client sends for shapes.<name>(z.query, args), and name and args for
// queries.<name>(args).
type shape struct {
	name, args, ast string
}

// shapesOf gives the shapes bench/viewsyncer's groups measure uses, with
// their default limits.
func shapesOf(issues int) []shape {
	issue := fmt.Sprintf("i%07d", min(7, issues))
	return []shape{
		{"openByModified", `{"limit":50}`,
			`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},"related":[{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"},"system":"client"}],"limit":50,"orderBy":[["modified","desc"]]}`},
		{"issueWithComments", `{"id":"` + issue + `"}`,
			`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"` + issue + `"},"op":"="},"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","asc"]]},"system":"client"}],"limit":1}`},
		{"issuesWithLabels", `{"limit":30}`,
			`{"table":"issue","related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"hidden":true,"subquery":{"table":"issue_label","alias":"labels","related":[{"correlation":{"parentField":["label_id"],"childField":["id"]},"subquery":{"table":"label","alias":"labels"},"system":"client"}]},"system":"client"}],"limit":30,"orderBy":[["id","asc"]]}`},
		{"issuesWithLabel", `{"labelID":"l03","limit":40}`,
			`{"table":"issue","where":{"type":"correlatedSubquery","related":{"system":"client","correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"issue_label","alias":"zsubq_labels","where":{"type":"correlatedSubquery","related":{"system":"client","correlation":{"parentField":["label_id"],"childField":["id"]},"subquery":{"table":"label","alias":"zsubq_zhidden_labels","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"l03"},"op":"="}}},"op":"EXISTS"}}},"op":"EXISTS"},"limit":40,"orderBy":[["modified","desc"]]}`},
		{"closedOrOwnedBy", `{"ownerID":"u000002","limit":60}`,
			`{"table":"issue","where":{"type":"or","conditions":[{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":false},"op":"="},{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"literal","value":"u000002"},"op":"="}]},"limit":60,"orderBy":[["id","asc"]]}`},
	}
}

// shapeTimes are one shape's hydrations in each form.
type shapeTimes struct {
	name        string
	ast, synced []time.Duration
	// extra are the synced hydration's differences from the AST one of the
	// same round: pairs run back to back, so they see the same load.
	extra []time.Duration
	rows  int
}

// measureHydration hydrates every shape rounds times in each form,
// alternating which form goes first, after one unmeasured round.
func measureHydration(base, token string, shapes []shape, rounds int, verbose bool) ([]shapeTimes, error) {
	out := make([]shapeTimes, len(shapes))
	for i, s := range shapes {
		out[i].name = s.name
	}
	for r := -1; r < rounds; r++ {
		for i, s := range shapes {
			forms := []bool{false, true}
			if r%2 != 0 {
				forms = []bool{true, false}
			}
			var took [2]time.Duration
			for _, synced := range forms {
				d, rows, err := hydrateOnce(base, token, s, synced)
				if err != nil {
					return nil, fmt.Errorf("%s (synced %v): %w", s.name, synced, err)
				}
				if verbose {
					fmt.Printf("round %d %s synced=%v: %v, %d rows\n", r, s.name, synced, d.Round(time.Microsecond), rows)
				}
				if out[i].rows == 0 {
					out[i].rows = rows
				} else if rows != out[i].rows {
					return nil, fmt.Errorf("%s: %d rows synced=%v; another hydration brought %d", s.name, rows, synced, out[i].rows)
				}
				if synced {
					took[1] = d
				} else {
					took[0] = d
				}
			}
			if r >= 0 {
				out[i].ast = append(out[i].ast, took[0])
				out[i].synced = append(out[i].synced, took[1])
				out[i].extra = append(out[i].extra, took[1]-took[0])
			}
		}
	}
	return out, nil
}

// hydrateOnce connects a new group, puts the query once connected, and times
// the put to the pokeEnd carrying its gotQueriesPatch. The query then goes
// with a del (its TTL 0), so that no run's rows stay in the server.
func hydrateOnce(base, token string, s shape, synced bool) (time.Duration, int, error) {
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	c, err := syncclient.Dial(base, syncclient.Options{Group: "bench-hyd-" + id, Client: "c", AuthToken: token, ReadTimeout: readTimeout})
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if err := c.Expect("connected"); err != nil {
		return 0, 0, err
	}
	hash := "h" + id
	put := syncclient.ASTPut(hash, s.ast, 0)
	if synced {
		put = syncclient.SyncedPut(hash, s.name, s.args, 0)
	}
	start := time.Now()
	if err := c.Send(syncclient.InitConnection(put)); err != nil {
		return 0, 0, err
	}
	end, rows, err := c.WaitGot(hash)
	if err != nil {
		return 0, 0, err
	}
	if err := c.Send(syncclient.DelQuery(hash)); err != nil {
		return 0, 0, err
	}
	if err := c.WaitGone(hash); err != nil {
		return 0, 0, fmt.Errorf("await the query's removal: %w", err)
	}
	return end.Sub(start), rows, nil
}

type mutationTimes struct {
	n             int
	p50, p95, p99 time.Duration
	max           time.Duration
	apart         int // confirmations whose poke did not carry the row
}

// measureMutations pushes n custom mutations, after 10 unmeasured ones, one
// at a time from one client that views the rows they change.
func measureMutations(base, token string, n int) (*mutationTimes, error) {
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = strconv.Quote(fmt.Sprintf("i%07d", i+1))
	}
	view := `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":[` + strings.Join(ids, ",") + `]},"op":"IN"},"orderBy":[["id","asc"]]}`
	group := fmt.Sprintf("bench-mut-%d", time.Now().UnixNano())
	c, err := syncclient.Dial(base, syncclient.Options{Group: group, Client: "c", AuthToken: token, Init: syncclient.InitConnection(syncclient.ASTPut("view", view, 300000)), ReadTimeout: readTimeout})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, _, err := c.WaitGot("view"); err != nil {
		return nil, err
	}
	marker := fmt.Sprintf("mut-%d-", time.Now().UnixNano())
	const warmup = 10
	var ds []time.Duration
	m := &mutationTimes{n: n}
	for i := range warmup + n {
		title := marker + strconv.Itoa(i)
		args := fmt.Sprintf(`{"id":%s,"title":%q,"modified":%d.5}`, ids[i%len(ids)], title, i)
		start := time.Now()
		id, err := c.Push("issue.setTitle", args)
		if err != nil {
			return nil, err
		}
		for {
			p, err := c.NextPoke(marker)
			if err != nil {
				return nil, fmt.Errorf("mutation %d: %w", id, err)
			}
			if p.LMIDs[c.ID()] < id {
				continue
			}
			if i >= warmup {
				ds = append(ds, p.End.Sub(start))
				if !slices.Contains(p.Markers, title) {
					m.apart++
				}
			}
			break
		}
	}
	slices.Sort(ds)
	m.p50, m.p95, m.p99, m.max = ds[n/2], ds[n*95/100], ds[n*99/100], ds[n-1]
	return m, nil
}

func printReport(o options, m *mutationTimes, hyd []shapeTimes) {
	fmt.Println()
	fmt.Printf("| measure (%s, seed.sh %d) | figure | reference |\n", o.server, o.issues)
	fmt.Println("|---|---|---|")
	fmt.Printf("| custom mutator issue.setTitle, push → pokeEnd confirming it (lastMutationIDChanges), %d sequential, p50 / p95 / p99 / max | %.1f / %.1f / %.1f / %.1f ms | zero-cache 1.9.0 about %d ms |\n",
		m.n, ms(m.p50), ms(m.p95), ms(m.p99), ms(m.max), zcMutationMS)
	if m.apart > 0 {
		fmt.Printf("| confirmations whose poke lacked the mutation's row | %d of %d | 0 (same poke) |\n", m.apart, m.n)
	}
	var extra []time.Duration
	for _, h := range hyd {
		extra = append(extra, h.extra...)
		fmt.Printf("| hydration of %s (%d rows), put → pokeEnd with gotQueriesPatch, medians of %d: AST / synced / synced − AST of the same round | %.1f / %.1f / %+.1f ms | AST |\n",
			h.name, h.rows, len(h.ast), ms(median(h.ast)), ms(median(h.synced)), ms(median(h.extra)))
	}
	fmt.Printf("| extra hydration time of a synced query over its AST query (uncached transform), median of all %d pairs | %+.1f ms | |\n", len(extra), ms(median(extra)))
	fmt.Printf("load average at the start / end: %s / %s\n", o.load, loadAvg())
}

// loadAvg is the machine's 1-minute load average: the cores are shared.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// signToken makes the HS256 JWT for sub that both servers verify with
// authSecret and forward to the API server, which verifies it too.
func signToken(sub string, ttl time.Duration) (string, error) {
	now := time.Now()
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": sub,
		"iat": now.Add(-time.Minute).Unix(),
		"exp": now.Add(ttl).Unix(),
	}).SignedString([]byte(authSecret))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
