// Command fanout measures how the sync server of `jetsync run` keeps up as
// more client groups watch the same rows (issue 17, aim 1):
//
//   - G client groups, each one client with 3 legacy (AST) queries: open
//     issues by modified (limit 50), one issue with its comments, and the
//     issues with label l01 by modified (limit 40). All three cover the same
//     20 hot issues, which are open, labelled l01 and the most recently
//     modified;
//   - writes are single-row UPDATEs of a hot issue (its title and modified)
//     at a fixed rate, each from its own autocommit transaction;
//   - the lag of one write in one group is from the commit returning to the
//     pokeEnd of the poke that carries the new title to that group.
//
// The clients are Go clients speaking protocol v51 (bench/internal/
// syncclient), not the real @rocicorp/zero client: 500 Node clients do not
// fit on 2 cores. A poke is what the real client applies at its pokeEnd, so
// the lag is the server's; the client's own work on the poke is not in it.
//
// For each number of groups (-groups, added to the same server one size
// after the other) it prints p50/p99 at 1 write/s, and for the sizes in
// -ramp-groups the highest rate of -rates whose p99 stays within the aim,
// beside the aims and zero-cache 1.9.0's figures from the issue.
//
// Usage: go run ./bench/fanout [-groups 10,50,200,500] [-slow-writes 20] [-rates 20,50,100,200,400,800]
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/bench/internal/syncclient"
)

const (
	appID       = "zero"
	publication = "zpeer_pub"
	hotIssues   = 20
	hotLabel    = "l01"
	// hotModified puts the hot issues above every seeded one (seed.sh's
	// modified stays below 1.1e9), and each write above the last.
	hotModified = 2e12
)

// The issue's figures: zero-cache 1.9.0 on this machine, with real clients.
type reference struct {
	groups        int
	aimP99MS      float64 // the p99 bound of the rate aim
	aimRate       int     // writes/s the aim wants within aimP99MS
	aimP50MS      float64 // p50 at 1 write/s; 0: no aim
	zcP50MS       float64 // zero-cache's lag p50 at its lowest rate
	zcRate100ms   string  // zero-cache's highest rate with p99 ≤ 100 ms
	zcRate1s      string  // zero-cache's highest rate with p99 ≤ 1 s
	jsBeforeP50MS float64 // jetsync before this work (the issue's table)
}

var references = map[int]reference{
	50:  {groups: 50, aimP99MS: 100, aimRate: 200, zcP50MS: 63, zcRate100ms: "none", zcRate1s: "100/s", jsBeforeP50MS: 31},
	200: {groups: 200, aimP99MS: 250, aimRate: 200, aimP50MS: 20, zcP50MS: 277, zcRate100ms: "none", zcRate1s: "3/s", jsBeforeP50MS: 113},
}

type options struct {
	issues     int
	data       string
	bin        string
	groups     string
	rampGroups string
	rates      string
	slowWrites int
	stepSecs   int
	env        string
	keep       bool
	verbose    bool
}

func main() {
	var o options
	flag.IntVar(&o.issues, "issues", 100000, "seed.sh ISSUES (100000 gives 451,020 rows)")
	benchenv.DataFlag(&o.data)
	flag.StringVar(&o.bin, "bin", "bin/jetsync", "the jetsync binary (make build); built into a temporary folder when missing")
	flag.StringVar(&o.groups, "groups", "10,50,200,500", "client group counts, ascending; each adds groups to those already connected")
	flag.StringVar(&o.rampGroups, "ramp-groups", "50,200", "group counts at which to find the highest rate within the aim's p99")
	flag.StringVar(&o.rates, "rates", "20,50,100,200,400,800", "write rates tried, ascending, until one misses the aim")
	flag.IntVar(&o.slowWrites, "slow-writes", 20, "writes at 1 write/s per group count")
	flag.IntVar(&o.stepSecs, "step-seconds", 5, "seconds of writes per rate tried")
	flag.StringVar(&o.env, "jetsync-env", "", "extra environment for jetsync, comma-separated KEY=VALUE pairs (such as JETSYNC_PPROF_ADDR=127.0.0.1:6060)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (Postgres, jetsync's data and log)")
	flag.BoolVar(&o.verbose, "v", false, "print each step")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "fanout:", err)
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(o options) error {
	sizes, err := ints(o.groups)
	if err != nil {
		return fmt.Errorf("-groups: %w", err)
	}
	rampAt, err := ints(o.rampGroups)
	if err != nil {
		return fmt.Errorf("-ramp-groups: %w", err)
	}
	rates, err := ints(o.rates)
	if err != nil {
		return fmt.Errorf("-rates: %w", err)
	}
	if !slices.IsSorted(sizes) || !slices.IsSorted(rates) {
		return errors.New("-groups and -rates must be ascending")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root, cleanup, err := benchenv.TempRoot("fanout", o.keep)
	if err != nil {
		return err
	}
	defer cleanup()
	bin, err := benchenv.JetsyncBin(ctx, o.bin, root)
	if err != nil {
		return err
	}
	pg, pgURL, err := benchenv.StartUpstream(ctx, root, o.data, o.issues, appID)
	if err != nil {
		return err
	}
	defer func() { _ = pg.Kill(context.Background()) }()
	if err := heatUp(ctx, pgURL); err != nil {
		return err
	}
	js, err := startJetsync(ctx, bin, root, pgURL, o.env)
	if err != nil {
		return err
	}
	defer js.Stop()

	w, err := newWriter(ctx, pgURL)
	if err != nil {
		return err
	}
	defer w.close()
	f := &fleet{base: js.Base, pid: js.Cmd.Process.Pid, marker: []byte(fmt.Sprintf("fan%d-", time.Now().UnixNano()%1e6))}
	defer f.close()

	var rows []row
	for _, g := range sizes {
		t0 := time.Now()
		if err := f.grow(ctx, g); err != nil {
			return fmt.Errorf("connect %d groups: %w", g, err)
		}
		if o.verbose {
			fmt.Printf("%d groups connected and hydrated in %v\n", g, time.Since(t0).Round(time.Millisecond))
		}
		r := row{groups: g}
		if r.slow, err = f.measure(ctx, w, 1, o.slowWrites); err != nil {
			return err
		}
		if o.verbose {
			fmt.Printf("%d groups at 1/s: %s\n", g, r.slow)
		}
		if ref, ok := references[g]; ok && slices.Contains(rampAt, g) {
			r.ramped = true
			for _, rate := range rates {
				st, err := f.measure(ctx, w, rate, rate*o.stepSecs)
				if err != nil {
					return err
				}
				if o.verbose {
					fmt.Printf("%d groups at %d/s: %s\n", g, rate, st)
				}
				r.steps = append(r.steps, st)
				if !st.within(ref.aimP99MS) {
					break
				}
				r.best = st
			}
		}
		rows = append(rows, r)
		if err := js.AliveNoError(); err != nil {
			return err
		}
	}
	print(rows)
	reportAims(rows)
	return nil
}

// heatUp makes the first 20 issues the hot ones: open, labelled l01, and
// the most recently modified, so that all three queries of every group
// hold them.
func heatUp(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for i := 1; i <= hotIssues; i++ {
		id := hotID(i)
		if _, err := conn.Exec(ctx, `UPDATE issue SET open = true, modified = $1 WHERE id = $2`, hotModified+float64(i), id); err != nil {
			return fmt.Errorf("heat up %s: %w", id, err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO issue_label (issue_id, label_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, id, hotLabel); err != nil {
			return fmt.Errorf("heat up %s: %w", id, err)
		}
	}
	return nil
}

func hotID(i int) string { return fmt.Sprintf("i%07d", i) }

// queries are group n's three queries, the ASTs the real client sends for
// the e2e app's shapes (e2e/client/app/queries.mjs).
func queries(n int) []syncclient.Query {
	issue := hotID(1 + n%hotIssues)
	return []syncclient.Query{
		// openByModified({limit: 50})
		syncclient.NewQuery(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},"related":[{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"},"system":"client"}],"limit":50,"orderBy":[["modified","desc"]]}`),
		// issueWithComments({id})
		syncclient.NewQuery(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"` + issue + `"},"op":"="},"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","asc"]]},"system":"client"}],"limit":1}`),
		// issuesWithLabel({labelID, limit: 40})
		syncclient.NewQuery(`{"table":"issue","where":{"type":"correlatedSubquery","related":{"system":"client","correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"issue_label","alias":"zsubq_labels","where":{"type":"correlatedSubquery","related":{"system":"client","correlation":{"parentField":["label_id"],"childField":["id"]},"subquery":{"table":"label","alias":"zsubq_zhidden_labels","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"` + hotLabel + `"},"op":"="}}},"op":"EXISTS"}}},"op":"EXISTS"},"limit":40,"orderBy":[["modified","desc"]]}`),
	}
}

// writer commits the single-row UPDATEs, numbering them across the run.
type writer struct {
	conn      *pgx.Conn
	next      int
	committed []time.Time
}

func newWriter(ctx context.Context, url string) (*writer, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	return &writer{conn: conn}, nil
}

func (w *writer) close() { _ = w.conn.Close(context.Background()) }

// write commits write number w.next, retitling a hot issue with marker
// and the number and moving it to the top, and records when the commit
// returned.
func (w *writer) write(ctx context.Context, marker []byte) error {
	i := w.next
	title := string(marker) + strconv.Itoa(i)
	if _, err := w.conn.Exec(ctx, `UPDATE issue SET title = $1, modified = $2 WHERE id = $3`,
		title, hotModified+float64(hotIssues+1+i), hotID(1+i%hotIssues)); err != nil {
		return fmt.Errorf("write %d: %w", i, err)
	}
	w.committed = append(w.committed, time.Now())
	w.next++
	return nil
}

// fleet is the connected groups, one client each, whose readers note when
// each write's title reached them.
type fleet struct {
	base string
	// pid is jetsync's, whose CPU time each step reports.
	pid     int
	marker  []byte
	members []*member
}

type member struct {
	c  *syncclient.Client
	mu sync.Mutex
	// at is when write i's poke ended, by i; zero: not yet.
	at  []time.Time
	err error
}

func (f *fleet) close() {
	for _, m := range f.members {
		m.c.Close()
	}
}

// grow connects groups until there are n, each hydrated before its reader
// starts; 50 connect at a time.
func (f *fleet) grow(ctx context.Context, n int) error {
	from := len(f.members)
	added := make([]*member, n-from)
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(50)
	for i := from; i < n; i++ {
		g.Go(func() error {
			qs := queries(i)
			puts := make([]string, len(qs))
			hs := make([]string, len(qs))
			for k, q := range qs {
				puts[k], hs[k] = q.Put(300000), q.Hash
			}
			c, err := syncclient.Dial(f.base, syncclient.Options{
				Group: fmt.Sprintf("fanout-%s%d", f.marker, i), Client: "c",
				Init: syncclient.InitConnection(puts...), ReadTimeout: 5 * time.Minute,
			})
			if err != nil {
				return err
			}
			added[i-from] = &member{c: c}
			if _, _, err := c.WaitGot(hs...); err != nil {
				return fmt.Errorf("group %d: %w", i, err)
			}
			return nil
		})
	}
	err := g.Wait()
	for _, m := range added {
		if m != nil {
			f.members = append(f.members, m)
		}
	}
	if err != nil {
		return err
	}
	for _, m := range added {
		go m.read(f.marker)
	}
	return nil
}

// read notes, for each poke, the writes whose titles it carried, at its
// pokeEnd, until the connection ends. It scans frames for the marker
// instead of decoding them: the bench shares the cores with the server.
func (m *member) read(marker []byte) {
	var pending []int
	for {
		tag, data, err := m.c.ReadFrame()
		if err != nil {
			m.mu.Lock()
			m.err = err
			m.mu.Unlock()
			return
		}
		switch tag {
		case "pokeStart":
			pending = pending[:0]
		case "pokePart":
			for rest := data; ; {
				i := bytes.Index(rest, marker)
				if i < 0 {
					break
				}
				rest = rest[i+len(marker):]
				j := 0
				for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
					j++
				}
				if n, err := strconv.Atoi(string(rest[:j])); err == nil {
					pending = append(pending, n)
				}
			}
		case "pokeEnd":
			if len(pending) == 0 {
				continue
			}
			now := time.Now()
			m.mu.Lock()
			for _, n := range pending {
				if n >= len(m.at) {
					m.at = append(m.at, make([]time.Time, n+1-len(m.at))...)
				}
				if m.at[n].IsZero() {
					m.at[n] = now
				}
			}
			m.mu.Unlock()
			pending = pending[:0]
		}
	}
}

// step is one rate's figures over every group and write.
type step struct {
	rate, writes, groups int
	actual               float64 // writes/s achieved
	p50, p99, max        time.Duration
	missing              int // write×group pairs not arrived within the wait
	// cpu is the CPU time jetsync used from the first write to the last
	// arrival: on a shared machine, steadier than the lags.
	cpu time.Duration
}

func (s step) within(p99MS float64) bool { return s.missing == 0 && ms(s.p99) <= p99MS }

func (s step) String() string {
	str := fmt.Sprintf("%d writes at %.0f/s × %d groups: p50 %.1f ms, p99 %.1f ms, max %.1f ms; jetsync CPU %.2f ms per write",
		s.writes, s.actual, s.groups, ms(s.p50), ms(s.p99), ms(s.max), ms(s.cpu)/float64(s.writes))
	if s.missing > 0 {
		str += fmt.Sprintf(", %d never arrived", s.missing)
	}
	return str
}

// measure commits n writes at rate per second and waits until every group
// has seen each of them (a minute at most after the last commit).
func (f *fleet) measure(ctx context.Context, w *writer, rate, n int) (step, error) {
	lo := w.next
	cpu0 := cpuTime(f.pid)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	t0 := time.Now()
	for range n {
		<-tick.C
		if err := w.write(ctx, f.marker); err != nil {
			return step{}, err
		}
	}
	st := step{rate: rate, writes: n, groups: len(f.members), actual: float64(n) / time.Since(t0).Seconds()}
	hi := w.next
	deadline := time.Now().Add(time.Minute)
	for {
		missing := 0
		for _, m := range f.members {
			m.mu.Lock()
			arr := shown(m.at, lo, hi)
			err := m.err
			m.mu.Unlock()
			for _, t := range arr {
				if t.IsZero() {
					missing++
				}
			}
			if err != nil {
				return step{}, fmt.Errorf("a client's connection ended: %w", err)
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			st.missing, st.cpu = missing, cpuTime(f.pid)-cpu0
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	lags := make([]time.Duration, 0, len(f.members)*(hi-lo))
	for _, m := range f.members {
		m.mu.Lock()
		arr := shown(m.at, lo, hi)
		m.mu.Unlock()
		for k, t := range arr {
			if !t.IsZero() {
				lags = append(lags, max(0, t.Sub(w.committed[lo+k])))
			}
		}
	}
	if len(lags) == 0 {
		return st, errors.New("no write reached any group")
	}
	slices.Sort(lags)
	st.p50, st.p99, st.max = lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1]
	return st, nil
}

// shown is, for each write from lo to hi, when a group's view first showed
// it or a later write of the same issue: writes to one row that land in
// one replica advance reach a client as one poke with the last value, as
// they should, so an earlier title may never be sent. Zero: not yet.
func shown(at []time.Time, lo, hi int) []time.Time {
	out := make([]time.Time, hi-lo)
	var first [hotIssues]time.Time // per issue, the earliest arrival of a later write
	for i := hi - 1; i >= lo; i-- {
		k := i % hotIssues
		if i < len(at) && !at[i].IsZero() && (first[k].IsZero() || at[i].Before(first[k])) {
			first[k] = at[i]
		}
		out[i-lo] = first[k]
	}
	return out
}

type row struct {
	groups int
	slow   step
	ramped bool
	steps  []step
	best   step // the highest rate within the aim; zero: none
}

func print(rows []row) {
	fmt.Println()
	fmt.Println("Fan-out (issue 17, aim 1): G groups × 3 queries over the same 20 hot issues, single-row UPDATEs;")
	fmt.Println("lag = commit → pokeEnd carrying the row, measured by Go protocol-v51 clients (not the real client).")
	fmt.Println("zero-cache 1.9.0 figures: the issue's table, measured earlier on this machine with real clients.")
	fmt.Println()
	fmt.Println("| groups | lag at 1 write/s, p50 / p99 | vs 10 groups (p50 ratio ÷ group ratio) | highest rate within the aim's p99 | aim | zero-cache 1.9.0 |")
	fmt.Println("|---|---|---|---|---|---|")
	var base *row
	for i := range rows {
		r := &rows[i]
		if base == nil {
			base = r
		}
		growth := ""
		if r != base && base.slow.p50 > 0 {
			lr, gr := float64(r.slow.p50)/float64(base.slow.p50), float64(r.groups)/float64(base.groups)
			growth = fmt.Sprintf("%.2f× for %.0f× the groups (%s)", lr, gr, sub(lr < gr))
		}
		slow := fmt.Sprintf("%.1f / %.1f ms (jetsync CPU %.1f ms per write)", ms(r.slow.p50), ms(r.slow.p99), ms(r.slow.cpu)/float64(r.slow.writes))
		if r.slow.missing > 0 {
			slow += fmt.Sprintf(" (%d never arrived)", r.slow.missing)
		}
		ref, hasRef := references[r.groups]
		rate, aim, zc := "not measured", "", ""
		if r.ramped {
			rate = "none"
			if r.best.rate > 0 {
				rate = fmt.Sprintf("%d/s (p99 %.1f ms)", r.best.rate, ms(r.best.p99))
			}
			if n := len(r.steps); n > 0 && r.steps[n-1].rate != r.best.rate {
				miss := r.steps[n-1]
				rate += fmt.Sprintf("; %d/s: p99 %.1f ms", miss.rate, ms(miss.p99))
				if miss.missing > 0 {
					rate += fmt.Sprintf(", %d never arrived", miss.missing)
				}
			}
		}
		if hasRef {
			aim = fmt.Sprintf("≥ %d writes/s at p99 ≤ %.0f ms %s", ref.aimRate, ref.aimP99MS, met(r.ramped && r.best.rate >= ref.aimRate))
			if ref.aimP50MS > 0 {
				aim += fmt.Sprintf("; p50 ≤ %.0f ms at 1 write/s %s", ref.aimP50MS, met(r.slow.missing == 0 && ms(r.slow.p50) <= ref.aimP50MS))
			}
			zc = fmt.Sprintf("p50 %.0f ms at its lowest rate; p99 ≤ 100 ms up to %s, ≤ 1 s up to %s (jetsync before: p50 %.0f ms)",
				ref.zcP50MS, ref.zcRate100ms, ref.zcRate1s, ref.jsBeforeP50MS)
		}
		fmt.Printf("| %d | %s | %s | %s | %s | %s |\n", r.groups, slow, growth, rate, aim, zc)
	}
	fmt.Println()
	fmt.Println("Rates tried:")
	for _, r := range rows {
		for _, s := range r.steps {
			fmt.Printf("  %d groups, %d/s: %s\n", r.groups, s.rate, s)
		}
	}
}

// reportAims hands aim 1's figures to benchenv.Report for make bench's
// table: each referenced size's rate and 1 write/s aims, and the lag's
// growth from the smallest size to each larger one.
func reportAims(rows []row) {
	for _, r := range rows {
		ref, ok := references[r.groups]
		if !ok {
			continue
		}
		zc := fmt.Sprintf("p99 ≤ 100 ms up to %s, ≤ 1 s up to %s", ref.zcRate100ms, ref.zcRate1s)
		if r.ramped {
			fig := "none within the p99"
			if r.best.rate > 0 {
				fig = fmt.Sprintf("%d writes/s at p99 %.1f ms", r.best.rate, ms(r.best.p99))
			}
			benchenv.Report(benchenv.Aim{Issue: 17, Name: fmt.Sprintf("fan-out, %d groups, highest rate within p99 ≤ %.0f ms", r.groups, ref.aimP99MS),
				Figure: fig, Target: fmt.Sprintf("≥ %d writes/s", ref.aimRate), Ref: zc, Met: r.best.rate >= ref.aimRate})
		}
		if ref.aimP50MS > 0 {
			fig := fmt.Sprintf("%.1f ms", ms(r.slow.p50))
			if r.slow.missing > 0 {
				fig += fmt.Sprintf(", %d never arrived", r.slow.missing)
			}
			benchenv.Report(benchenv.Aim{Issue: 17, Name: fmt.Sprintf("fan-out, %d groups, lag p50 at 1 write/s", r.groups),
				Figure: fig, Target: fmt.Sprintf("≤ %.0f ms", ref.aimP50MS), Ref: fmt.Sprintf("%.0f ms", ref.zcP50MS),
				Met: r.slow.missing == 0 && ms(r.slow.p50) <= ref.aimP50MS})
		}
	}
	if len(rows) < 2 || rows[0].slow.p50 <= 0 {
		return
	}
	base := rows[0]
	var figs []string
	sublinear := true
	for _, r := range rows[1:] {
		lr, gr := float64(r.slow.p50)/float64(base.slow.p50), float64(r.groups)/float64(base.groups)
		figs = append(figs, fmt.Sprintf("%d: %.2f× for %.0f×", r.groups, lr, gr))
		sublinear = sublinear && lr < gr && r.slow.missing == 0
	}
	benchenv.Report(benchenv.Aim{Issue: 17, Name: fmt.Sprintf("fan-out, lag p50 at 1 write/s vs %d groups", base.groups),
		Figure: strings.Join(figs, "; "), Target: "sublinear in groups", Met: sublinear})
}

func sub(ok bool) string {
	if ok {
		return "sublinear"
	}
	return "not sublinear"
}

func met(ok bool) string {
	if ok {
		return "(met)"
	}
	return "(not met)"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// startJetsync runs `jetsync run` on the upstream with its own data folder
// and in-process NATS, and returns once its replica has applied the
// initial sync, its first backup is taken and its HTTP server answers.
func startJetsync(ctx context.Context, bin, root, upstreamURL, extraEnv string) (*benchenv.Proc, error) {
	return benchenv.StartRun(ctx, benchenv.Run{
		Bin: bin, Root: root, Extra: extraEnv, AfterBackup: true,
		Env: []string{"ZERO_UPSTREAM_DB=" + upstreamURL, "ZERO_APP_ID=" + appID, "ZERO_APP_PUBLICATIONS=" + publication},
	})
}

// cpuTime is process pid's CPU time so far, 0 when /proc does not say.
func cpuTime(pid int) time.Duration {
	d, _ := benchenv.CPUTime(pid)
	return d
}
