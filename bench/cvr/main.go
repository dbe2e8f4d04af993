// Command cvr measures the durable CVR (issue 5) on an embedded NATS server
// configured as `jetsync run` configures it (fsync on every write): what a
// poke costs to make durable, how long a view-syncer takes to take over a
// group with 10,000 synced rows, and how large the local projection grows
// per client group and per synced row.
//
//	go run ./bench/cvr [-rows 10000] [-pokes 500] [-groups 200]
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/streams"
)

func main() {
	rows := flag.Int("rows", 10000, "rows synced by the group taken over")
	pokes := flag.Int("pokes", 500, "pokes timed per size")
	groups := flag.Int("groups", 200, "client groups for the projection size")
	flag.Parse()
	if err := run(*rows, *pokes, *groups); err != nil {
		fmt.Fprintln(os.Stderr, "bench/cvr:", err)
		os.Exit(1)
	}
}

var shard = streams.Shard{App: "bench"}

func run(rows, pokes, groups int) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bench-cvr-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ns, err := benchenv.StartNATS(filepath.Join(dir, "nats"), nil)
	if err != nil {
		return err
	}
	defer ns.Close()
	js := ns.JS
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	open := func(owner, file string) (*cvrstore.Store, error) {
		return cvrstore.Open(ctx, cvrstore.Config{JS: js, Shard: shard, File: filepath.Join(dir, file), OwnerID: owner, Logger: quiet})
	}
	a, err := open("vs-a", "a.db")
	if err != nil {
		return err
	}
	defer a.Close()

	fmt.Println("CVR write per poke (JetStream publish, fsynced, + local projection apply):")
	for _, n := range []int{1, 10, 100} {
		g, err := a.Load(ctx, fmt.Sprintf("poke-%d", n), nil)
		if err != nil {
			return err
		}
		if err := g.Publish(ctx, version(0), groupEvents(version(0), 0)); err != nil {
			return err
		}
		var took []time.Duration
		var bytes int
		for i := 1; i <= pokes; i++ {
			v := version(i)
			evs := append([]streams.CVREvent{instance(v)}, rowEvents(v, i*n, n)...)
			msgs, err := streams.EncodeCVRUpdate(streams.CVRMessage{Group: g.ID(), Owner: "vs-a", Version: v, Prev: g.Seq()}, evs, 0)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				bytes += len(m)
			}
			start := time.Now()
			if err := g.Publish(ctx, v, evs); err != nil {
				return err
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		fmt.Printf("  %3d row(s) changed: p50 %6.0f µs  p99 %6.0f µs  %6d bytes/poke (%d B/row)\n",
			n, us(took[len(took)/2]), us(took[len(took)*99/100]), bytes/pokes, bytes/pokes/n)
	}

	fmt.Printf("Take over a group with %d rows synced (lease, load into an empty projection, read it):\n", rows)
	big := "takeover"
	g, err := a.Load(ctx, big, nil)
	if err != nil {
		return err
	}
	v := version(1)
	if err := g.Publish(ctx, v, append(groupEvents(v, 0), rowEvents(v, 0, rows)...)); err != nil {
		return err
	}
	// The hydration, then a day of small pokes.
	for i := 2; i < 200; i++ {
		v = version(i)
		if err := g.Publish(ctx, v, append([]streams.CVREvent{instance(v)}, rowEvents(v, i*7%rows, 5)...)); err != nil {
			return err
		}
	}
	takeover := func(label, file string) error {
		s, err := open("vs-"+file, file)
		if err != nil {
			return err
		}
		defer s.Close()
		start := time.Now()
		l, err := s.Acquire(ctx, big)
		if err != nil {
			return err
		}
		w, err := s.Load(ctx, big, l)
		if err != nil {
			return err
		}
		st, err := w.State(ctx)
		if err != nil {
			return err
		}
		el := time.Since(start)
		if len(st.Rows) != rows {
			return fmt.Errorf("%s: %d rows loaded; want %d", label, len(st.Rows), rows)
		}
		fmt.Printf("  %-44s %6.0f ms (%d messages replayed)\n", label, ms(el), w.Info().Replayed)
		return s.Release(ctx, l)
	}
	if err := takeover("history of 200 updates:", "b.db"); err != nil {
		return err
	}
	if err := g.Compact(ctx); err != nil {
		return err
	}
	if err := takeover("after compaction (one snapshot):", "c.db"); err != nil {
		return err
	}
	// A peer whose local projection is current replays nothing.
	if err := takeover("again, with its local projection current:", "c.db"); err != nil {
		return err
	}

	fmt.Println("Local projection size:")
	base, err := projectionSize(ctx, js, dir, open, groups, 0)
	if err != nil {
		return err
	}
	withRows, err := projectionSize(ctx, js, dir, open, groups, 100)
	if err != nil {
		return err
	}
	fmt.Printf("  per client group (1 client, 1 query, no rows): %6d bytes\n", base/int64(groups))
	fmt.Printf("  per synced row:                                %6d bytes\n", (withRows-base)/int64(groups*100))
	return nil
}

// projectionSize is the size of a projection holding groups groups of rows
// rows each, checkpointed.
func projectionSize(ctx context.Context, js jetstream.JetStream, dir string,
	open func(owner, file string) (*cvrstore.Store, error), groups, rows int) (int64, error) {
	file := fmt.Sprintf("size-%d.db", rows)
	s, err := open("vs-size", file)
	if err != nil {
		return 0, err
	}
	for i := range groups {
		g, err := s.Load(ctx, fmt.Sprintf("size-%d-%d", rows, i), nil)
		if err != nil {
			s.Close()
			return 0, err
		}
		v := version(1)
		if err := g.Publish(ctx, v, append(groupEvents(v, i), rowEvents(v, i*rows, rows)...)); err != nil {
			s.Close()
			return 0, err
		}
	}
	if err := s.Close(); err != nil {
		return 0, err
	}
	path := filepath.Join(dir, file)
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return 0, err
	}
	var pages, size int64
	if err := db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		return 0, err
	}
	if err := db.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&size); err != nil {
		return 0, err
	}
	return pages * size, nil
}

// version is a CVR version as the view-syncer makes them: a replica state
// version, lexi-encoded.
func version(i int) string { return fmt.Sprintf("4g6t%04x", i) }

const queryHash = "2pl4o0i1n4b0c"

func instance(v string) streams.CVREvent {
	return streams.CVREvent{Op: streams.CVROpInstance, Instance: &streams.CVRInstance{
		Version: v, ReplicaVersion: "4g6s00", TTLClockMs: 123456, LastActiveMs: time.Now().UnixMilli(), UserID: "u000001"}}
}

// groupEvents are a new group's records: instance, schema, one client, one
// query it desires and got.
func groupEvents(v string, i int) []streams.CVREvent {
	client := fmt.Sprintf("c%08d", i)
	return []streams.CVREvent{
		instance(v),
		{Op: streams.CVROpClientSchema, ClientSchema: json.RawMessage(`{"tables":{"issue":{"columns":{"id":{"type":"string"},"title":{"type":"string"},"open":{"type":"boolean"},"modified":{"type":"number"},"owner_id":{"type":"string"},"created":{"type":"number"}},"primaryKey":["id"]}}}`)},
		{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: client}},
		{Op: streams.CVROpPutQuery, Query: &streams.CVRQuery{Hash: queryHash, Got: true, PatchVersion: v,
			AST: json.RawMessage(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},"orderBy":[["modified","asc"],["id","asc"]],"limit":10}`)}},
		{Op: streams.CVROpPutDesire, Desire: &streams.CVRDesire{ClientID: client, Hash: queryHash, TTLMs: 300000, PatchVersion: v}},
	}
}

// rowEvents are n row records from the from-th issue on, held by the query,
// as the view-syncer writes them: one put-rows for a run that shares its
// patch version and refs.
func rowEvents(v string, from, n int) []streams.CVREvent {
	var b streams.CVRRowEvents
	refs := map[string]int{queryHash: 1}
	for i := range n {
		b.Add(streams.CVRRow{Table: "issue", Key: json.RawMessage(fmt.Sprintf(`{"id":"i%07d"}`, from+i)),
			RowVersion: v, PatchVersion: v, Refs: refs})
	}
	return b.Events()
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
