package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/jetsync/jetsync/bench/internal/syncclient"
)

type serverRun struct {
	took  time.Duration
	rows  int
	bytes int
	// cpu is jetsync's CPU time over the run: the put, the del, and what
	// of the previous run's background work fell in it.
	cpu time.Duration
}

// measureServer times one new group's query over the whole issue table
// (syncclient.Hydrate).
func measureServer(base string, run int) (serverRun, error) {
	h, err := syncclient.Hydrate(base, fmt.Sprintf("bench-server-%d-%d", time.Now().UnixNano(), run), syncclient.AllIssues, nil)
	return serverRun{took: h.Took, rows: h.Rows, bytes: h.Bytes}, err
}

// queries makes each benchmark client's five legacy queries, the ASTs the
// real client sends for the e2e app's shapes (e2e/client/app/queries.mjs)
// with their default limits, and arguments that differ between clients.
type queries struct{ issues, users int }

func newQueries(issues int) queries { return queries{issues: issues, users: max(10, issues/100)} }

// shapes names the five queries, in the order of queries.of.
var shapes = []string{"openByModified", "issueWithComments", "issuesWithLabels", "issuesWithLabel", "closedOrOwnedBy"}

func (q queries) of(client int) []syncclient.Query {
	issue := fmt.Sprintf("i%07d", 1+(client*1999)%q.issues)
	label := fmt.Sprintf("l%02d", 1+client%20)
	owner := fmt.Sprintf("u%06d", 1+client%q.users)
	return []syncclient.Query{
		// openByModified({limit: 50})
		syncclient.NewQuery(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},"related":[{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"},"system":"client"}],"limit":50,"orderBy":[["modified","desc"]]}`),
		// issueWithComments({id})
		syncclient.NewQuery(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"` + issue + `"},"op":"="},"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","asc"]]},"system":"client"}],"limit":1}`),
		// issuesWithLabels({limit: 30})
		syncclient.NewQuery(`{"table":"issue","related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"hidden":true,"subquery":{"table":"issue_label","alias":"labels","related":[{"correlation":{"parentField":["label_id"],"childField":["id"]},"subquery":{"table":"label","alias":"labels"},"system":"client"}]},"system":"client"}],"limit":30,"orderBy":[["id","asc"]]}`),
		// issuesWithLabel({labelID, limit: 40})
		syncclient.NewQuery(`{"table":"issue","where":{"type":"correlatedSubquery","related":{"system":"client","correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"issue_label","alias":"zsubq_labels","where":{"type":"correlatedSubquery","related":{"system":"client","correlation":{"parentField":["label_id"],"childField":["id"]},"subquery":{"table":"label","alias":"zsubq_zhidden_labels","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"` + label + `"},"op":"="}}},"op":"EXISTS"}}},"op":"EXISTS"},"limit":40,"orderBy":[["modified","desc"]]}`),
		// closedOrOwnedBy({ownerID, limit: 60})
		syncclient.NewQuery(`{"table":"issue","where":{"type":"or","conditions":[{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":false},"op":"="},{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"literal","value":"` + owner + `"},"op":"="}]},"limit":60,"orderBy":[["id","asc"]]}`),
	}
}

// named picks the queries of client whose shapes are named.
func (q queries) named(client int, names []string) ([]syncclient.Query, error) {
	all := q.of(client)
	var qs []syncclient.Query
	for _, n := range names {
		i := slices.Index(shapes, n)
		if i < 0 {
			return nil, fmt.Errorf("unknown shape %q (have %s)", n, strings.Join(shapes, ", "))
		}
		qs = append(qs, all[i])
	}
	return qs, nil
}

// connectGroup dials a new group whose initConnection (in the header, as
// the real client sends it) desires qs with the client's default TTL.
func connectGroup(base, group string, qs []syncclient.Query) (*syncclient.Client, error) {
	puts := make([]string, len(qs))
	for i, q := range qs {
		puts[i] = q.Put(300000)
	}
	return syncclient.Dial(base, syncclient.Options{Group: group, Client: "c", Init: syncclient.InitConnection(puts...), ReadBufferSize: 64 << 10})
}

func hashes(qs []syncclient.Query) []string {
	hs := make([]string, len(qs))
	for i, q := range qs {
		hs[i] = q.Hash
	}
	return hs
}

// measureGroups connects n clients at once, each its own group with five
// queries, and times until every query of every client is complete.
func measureGroups(ctx context.Context, base string, q queries, n, run int) (time.Duration, error) {
	prefix := fmt.Sprintf("bench-groups-%d-%d", time.Now().UnixNano(), run)
	var mu sync.Mutex
	var last time.Time
	var clients []*syncclient.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	g, _ := errgroup.WithContext(ctx)
	start := time.Now()
	for i := range n {
		g.Go(func() error {
			qs := q.of(i)
			c, err := connectGroup(base, fmt.Sprintf("%s-%d", prefix, i), qs)
			if err != nil {
				return err
			}
			mu.Lock()
			clients = append(clients, c)
			mu.Unlock()
			end, _, err := c.WaitGot(hashes(qs)...)
			if err != nil {
				return fmt.Errorf("client %d: %w", i, err)
			}
			mu.Lock()
			if end.After(last) {
				last = end
			}
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	return last.Sub(start), nil
}

type latencies struct {
	n, queries    int
	p50, p95, p99 time.Duration
}

// measureLatency connects one client with the first benchmark client's
// queries (those named; issuesWithLabels must be one), then commits n single-row UPDATEs at rate per second, each
// retitling one of the 30 issues its issuesWithLabels query shows, and
// times each from its commit returning to the pokeEnd carrying the new
// title.
func measureLatency(ctx context.Context, base, pgURL string, q queries, names []string, n, rate int) (*latencies, error) {
	if !slices.Contains(names, "issuesWithLabels") {
		return nil, errors.New("the latency client must hold issuesWithLabels, whose rows the updates change")
	}
	qs, err := q.named(0, names)
	if err != nil {
		return nil, err
	}
	c, err := connectGroup(base, fmt.Sprintf("bench-latency-%d", time.Now().UnixNano()), qs)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, _, err := c.WaitGot(hashes(qs)...); err != nil {
		return nil, err
	}
	pg, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return nil, err
	}
	defer pg.Close(context.WithoutCancel(ctx))

	marker := fmt.Sprintf("lat-%d-", time.Now().UnixNano())
	committed := make([]time.Time, n)
	arrived := make([]time.Time, n)
	done := awaitMarkers(c, marker, n, func(t string, end time.Time) int {
		i, err := strconv.Atoi(strings.TrimPrefix(t, marker))
		if err != nil || i < 0 || i >= n || !arrived[i].IsZero() {
			return 0
		}
		arrived[i] = end
		return 1
	})
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		id := fmt.Sprintf("i%07d", 1+i%30)
		if _, err := pg.Exec(ctx, `UPDATE issue SET title = $1 WHERE id = $2`, marker+strconv.Itoa(i), id); err != nil {
			return nil, err
		}
		committed[i] = time.Now()
	}
	select {
	case err := <-done:
		if err != nil {
			return nil, err
		}
	case <-time.After(time.Minute):
		c.Close()
		return nil, fmt.Errorf("not every update reached the client within a minute of the last commit: %w", errTimeout)
	}
	ds := make([]time.Duration, n)
	for i := range n {
		ds[i] = max(0, arrived[i].Sub(committed[i]))
	}
	slices.Sort(ds)
	return &latencies{n: n, queries: len(qs), p50: ds[n/2], p95: ds[n*95/100], p99: ds[n*99/100]}, nil
}

// measureClient runs client.mjs: the real Zero client, under Node 22,
// materializing the whole issue table runs times, each a new client group.
func measureClient(ctx context.Context, node, base string, runs, issues int) ([]time.Duration, error) {
	cmd := exec.CommandContext(ctx, node, "bench/viewsyncer/client.mjs", base, strconv.Itoa(runs))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var ds []time.Duration
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var r struct {
			Run   int     `json:"run"`
			MS    float64 `json:"ms"`
			Rows  int     `json:"rows"`
			Error string  `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("client.mjs printed %q", sc.Text())
		}
		if r.Error != "" {
			return nil, fmt.Errorf("client.mjs: %s", r.Error)
		}
		if r.Rows != issues {
			return nil, fmt.Errorf("client.mjs run %d: %d rows; want %d", r.Run, r.Rows, issues)
		}
		ds = append(ds, time.Duration(r.MS*float64(time.Millisecond)))
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("client.mjs: %w\n%s", err, stderr.String())
	}
	if len(ds) != runs {
		return nil, fmt.Errorf("client.mjs reported %d runs; want %d\n%s", len(ds), runs, stderr.String())
	}
	return ds, nil
}

// measureLoaded is measureLatency at an offered rate one connection cannot
// commit: conns Postgres connections each commit n/conns single-row UPDATEs
// at rate/conns per second. Each connection retitles its own share of the
// 30 issues the client's issuesWithLabels query shows, so that the updates
// of one row are in commit order: a poke that carries a row's newest title
// delivers its earlier updates too (several may be batched into one poke).
// It returns the latencies and the rate Postgres actually committed at.
func measureLoaded(ctx context.Context, base, pgURL string, q queries, names []string, n, rate, conns int) (*latencies, float64, error) {
	if !slices.Contains(names, "issuesWithLabels") {
		return nil, 0, errors.New("the latency client must hold issuesWithLabels, whose rows the updates change")
	}
	if conns < 1 || conns > 30 || rate < conns {
		return nil, 0, fmt.Errorf("need 1 to 30 connections and at least one update per second each; have %d connections at %d/s", conns, rate)
	}
	qs, err := q.named(0, names)
	if err != nil {
		return nil, 0, err
	}
	c, err := connectGroup(base, fmt.Sprintf("bench-loaded-%d", time.Now().UnixNano()), qs)
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	if _, _, err := c.WaitGot(hashes(qs)...); err != nil {
		return nil, 0, err
	}
	per := n / conns
	n = per * conns
	pgs := make([]*pgx.Conn, conns)
	for k := range pgs {
		if pgs[k], err = pgx.Connect(ctx, pgURL); err != nil {
			return nil, 0, err
		}
		defer pgs[k].Close(context.WithoutCancel(ctx))
	}

	// Update (k, s) is connection k's s-th, of its row s % len(rows[k]);
	// its title is marker + "k-s".
	marker := fmt.Sprintf("load-%d-", time.Now().UnixNano())
	rows := make([][]string, conns)
	for r := range 30 {
		rows[r%conns] = append(rows[r%conns], fmt.Sprintf("i%07d", 1+r))
	}
	committed := make([][]time.Time, conns)
	arrived := make([][]time.Time, conns)
	for k := range conns {
		committed[k] = make([]time.Time, per)
		arrived[k] = make([]time.Time, per)
	}
	done := awaitMarkers(c, marker, n, func(t string, end time.Time) int {
		ks, ss, ok := strings.Cut(strings.TrimPrefix(t, marker), "-")
		k, err1 := strconv.Atoi(ks)
		s, err2 := strconv.Atoi(ss)
		if !ok || err1 != nil || err2 != nil || k < 0 || k >= conns || s < 0 || s >= per {
			return 0
		}
		// Every earlier update of the row is delivered with it.
		delivered := 0
		for e := s; e >= 0 && arrived[k][e].IsZero(); e -= len(rows[k]) {
			arrived[k][e] = end
			delivered++
		}
		return delivered
	})
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for k := range conns {
		g.Go(func() error {
			tick := time.NewTicker(time.Second * time.Duration(conns) / time.Duration(rate))
			defer tick.Stop()
			for s := range per {
				<-tick.C
				title := marker + strconv.Itoa(k) + "-" + strconv.Itoa(s)
				if _, err := pgs[k].Exec(gctx, `UPDATE issue SET title = $1 WHERE id = $2`, title, rows[k][s%len(rows[k])]); err != nil {
					return err
				}
				committed[k][s] = time.Now()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, err
	}
	achieved := float64(n) / time.Since(start).Seconds()
	select {
	case err := <-done:
		if err != nil {
			return nil, 0, err
		}
	case <-time.After(time.Minute):
		c.Close()
		return nil, 0, fmt.Errorf("not every update reached the client within a minute of the last commit: %w", errTimeout)
	}
	ds := make([]time.Duration, 0, n)
	for k := range conns {
		for s := range per {
			ds = append(ds, max(0, arrived[k][s].Sub(committed[k][s])))
		}
	}
	slices.Sort(ds)
	return &latencies{n: n, queries: len(qs), p50: ds[n/2], p95: ds[n*95/100], p99: ds[n*99/100]}, achieved, nil
}

// awaitMarkers reads c's pokes carrying marker in the background until
// arrive has counted n updates delivered; arrive gets each marker title of
// a poke and the poke's end, and returns how many updates it delivers that
// were not delivered before. The channel gets nil then, or the read's error.
func awaitMarkers(c *syncclient.Client, marker string, n int, arrive func(title string, end time.Time) int) <-chan error {
	done := make(chan error, 1)
	go func() {
		for seen := 0; seen < n; {
			p, err := c.NextPoke(marker)
			if err != nil {
				done <- err
				return
			}
			for _, t := range p.Markers {
				seen += arrive(t, p.End)
			}
		}
		done <- nil
	}()
	return done
}
