// Command bigtx measures big transactions through `jetsync run` (issue 17,
// aim 4), with Postgres streaming them before their commit (pgoutput
// protocol 2) and a Go client speaking sync protocol v51 connected:
//
//   - a 1,000,000-row transaction (comments on a new issue, and the issue
//     last), from its BEGIN to the client's poke carrying the issue, beside
//     the time Postgres takes from BEGIN to COMMIT returned; aim ≤ 2×;
//   - replica throughput for 1,000-row transactions: 300 of them committed
//     by 4 clients at once, from the first BEGIN until the replica holds
//     them all, in rows per second; aim ≥ 150,000 rows/s. Postgres's own
//     commit rate is printed beside it: the figure cannot exceed it.
//
// Usage: go run ./bench/bigtx [-rows 1000000] [-txs 300] [-issues 1000]
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
	_ "modernc.org/sqlite"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/bench/internal/syncclient"
)

const (
	appID       = "zero"
	publication = "zpeer_pub"
	// ratioAim and rateAim are issue 17's.
	ratioAim = 2.0
	rateAim  = 150_000
)

type options struct {
	rows, txs, txRows, clients, issues int
	data, bin                          string
	workMem, env                       string
	keep                               bool
}

func main() {
	var o options
	flag.IntVar(&o.rows, "rows", 1_000_000, "rows of the big transaction")
	flag.IntVar(&o.txs, "txs", 300, "transactions of the throughput measure")
	flag.IntVar(&o.txRows, "tx-rows", 1000, "rows per transaction of the throughput measure")
	flag.IntVar(&o.clients, "clients", 4, "Postgres clients of the throughput measure")
	flag.IntVar(&o.issues, "issues", 1000, "seed.sh ISSUES")
	flag.StringVar(&o.workMem, "logical-decoding-work-mem", "64MB", "the upstream's logical_decoding_work_mem: past it, Postgres streams a transaction before its commit")
	benchenv.DataFlag(&o.data)
	flag.StringVar(&o.bin, "bin", "bin/jetsync", "the jetsync binary (make build); built into a temporary folder when missing")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder")
	flag.StringVar(&o.env, "jetsync-env", "", "extra environment for jetsync, comma-separated KEY=VALUE pairs (such as JETSYNC_PPROF_ADDR=127.0.0.1:6060)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bigtx:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root, err := os.MkdirTemp("", "jetsync-bench-bigtx-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("temporary folder:", root)
	} else {
		defer os.RemoveAll(root)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	pg, upstream, err := benchenv.StartUpstream(ctx, root, o.data, o.issues, appID)
	if err != nil {
		return err
	}
	defer func() { _ = pg.Kill(context.WithoutCancel(ctx)) }()
	conn, err := pgx.Connect(ctx, upstream)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, fmt.Sprintf(`ALTER DATABASE zpeer SET logical_decoding_work_mem = '%s'`, o.workMem)); err != nil {
		return err
	}

	bin, err := benchenv.JetsyncBin(ctx, o.bin, root)
	if err != nil {
		return err
	}
	data := filepath.Join(root, "data")
	cmd := exec.Command(bin, "run")
	cmd.Env = benchenv.ServerEnv(append([]string{
		"ZERO_UPSTREAM_DB=" + upstream,
		"ZERO_APP_ID=" + appID,
		"ZERO_APP_PUBLICATIONS=" + publication,
		"JETSYNC_DATA_DIR=" + data,
		"ZERO_PORT=0",
		"JETSYNC_NATS_LISTEN=",
		"ZERO_LOG_FORMAT=json",
	}, benchenv.SplitEnv(o.env)...)...)
	srv, err := benchenv.StartProc("jetsync", cmd, root)
	if err != nil {
		return err
	}
	defer srv.Stop()
	if err := srv.WaitListening(ctx, time.Minute); err != nil {
		return err
	}
	if _, err := srv.WaitLog(ctx, "initial sync applied", 5*time.Minute); err != nil {
		return err
	}
	if err := srv.WaitHealthy(ctx, time.Minute, 50*time.Millisecond); err != nil {
		return err
	}

	// The client watches the newest issue and its comments: the big
	// transaction's issue and the first of its rows.
	const marker = "bigtx-"
	view := `{"table":"issue","orderBy":[["created","desc"],["id","asc"]],"limit":1,"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["id","asc"]],"limit":20},"system":"client"}]}`
	c, err := syncclient.Dial(srv.Base, syncclient.Options{Group: "bench-bigtx", Client: "c", Init: syncclient.InitConnection(syncclient.ASTPut("view", view, 300000)), ReadTimeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, _, err := c.WaitGot("view"); err != nil {
		return err
	}

	// The big transaction.
	issue := fmt.Sprintf("%s%d", marker, time.Now().UnixNano())
	begin := time.Now()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO comment SELECT $1 || '-' || lpad(g::text, 8, '0'), $1, 'comment body ' || md5(g::text), now() FROM generate_series(1, $2::int) g`, issue, o.rows); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO issue VALUES ($1, $1, true, 1e15, NULL, now() + interval '1 day')`, issue); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	committed := time.Now()
	var seen time.Time
	for seen.IsZero() {
		p, err := c.NextPoke(marker)
		if err != nil {
			return fmt.Errorf("wait for the big transaction's poke: %w", err)
		}
		for _, m := range p.Markers {
			if m == issue {
				seen = p.End
			}
		}
	}
	pgTime, clientTime := committed.Sub(begin), seen.Sub(begin)
	ratio := float64(clientTime) / float64(pgTime)
	fmt.Printf("big transaction: %d rows; Postgres BEGIN → COMMIT returned %s; BEGIN → client poke %s (%s after the commit)\n",
		o.rows, pgTime.Round(time.Millisecond), clientTime.Round(time.Millisecond), seen.Sub(committed).Round(time.Millisecond))
	blocks, txns := streamStats(ctx, conn)
	fmt.Printf("Postgres streamed %d transactions in %d blocks before their commit\n", txns, blocks)

	// Throughput: 1,000-row transactions from several clients at once.
	replica := filepath.Join(data, "replica.db")
	per := o.txs / o.clients
	// Each client commits in order: its last row in the replica means all
	// of its rows are.
	var lasts []string
	for cl := range o.clients {
		lasts = append(lasts, fmt.Sprintf("'tp-%09d'", (cl+1)*per*o.txRows))
	}
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for cl := range o.clients {
		g.Go(func() error {
			cc, err := pgx.Connect(gctx, upstream)
			if err != nil {
				return err
			}
			defer cc.Close(context.WithoutCancel(gctx))
			for i := range per {
				first := (cl*per+i)*o.txRows + 1
				if _, err := cc.Exec(gctx, `INSERT INTO comment SELECT 'tp-' || lpad(g::text, 9, '0'), 'tp', 'comment body ' || md5(g::text), now() FROM generate_series($1::int, $2::int) g`, first, first+o.txRows-1); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	pgDone := time.Since(start)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		n, err := countRows(replica, `SELECT count(*) FROM comment WHERE id IN (`+strings.Join(lasts, ",")+`)`)
		if err != nil {
			return err
		}
		if n == o.clients {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the replica does not hold the throughput measure's rows after 5 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	repDone := time.Since(start)
	rows := per * o.clients * o.txRows
	pgRate, repRate := float64(rows)/pgDone.Seconds(), float64(rows)/repDone.Seconds()
	fmt.Printf("throughput: %d transactions of %d rows from %d clients; Postgres committed them in %s (%.0f rows/s), the replica held them all after %s (%.0f rows/s)\n",
		per*o.clients, o.txRows, o.clients, pgDone.Round(time.Millisecond), pgRate, repDone.Round(time.Millisecond), repRate)

	fmt.Println()
	fmt.Printf("| %-58s | %-14s | %-10s | %-4s |\n", "measure", "figure", "aim", "met")
	fmt.Printf("|%s|%s|%s|%s|\n", strings.Repeat("-", 60), strings.Repeat("-", 16), strings.Repeat("-", 12), strings.Repeat("-", 6))
	fmt.Printf("| %-58s | %-14s | %-10s | %-4s |\n", fmt.Sprintf("%d-row transaction: BEGIN → client ÷ BEGIN → COMMIT", o.rows),
		fmt.Sprintf("%.2f×", ratio), fmt.Sprintf("≤ %.0f×", ratioAim), met(ratio <= ratioAim))
	fmt.Printf("| %-58s | %-14s | %-10s | %-4s |\n", fmt.Sprintf("replica throughput, %d-row transactions", o.txRows),
		fmt.Sprintf("%.0f rows/s", repRate), fmt.Sprintf("≥ %d", rateAim), met(repRate >= rateAim))
	keptUp := ""
	if repRate < rateAim && repDone < pgDone*11/10 {
		fmt.Println("(the replica kept up with Postgres: the figure is Postgres's commit rate, a lower bound)")
		keptUp = " (kept up with Postgres: a lower bound)"
	}
	benchenv.Report(benchenv.Aim{Issue: 17, Name: fmt.Sprintf("big transaction, %d rows: BEGIN → client ÷ BEGIN → COMMIT", o.rows),
		Figure: fmt.Sprintf("%.2f×", ratio), Target: fmt.Sprintf("≤ %.0f×", ratioAim), Met: ratio <= ratioAim})
	benchenv.Report(benchenv.Aim{Issue: 17, Name: fmt.Sprintf("replica throughput, %d-row transactions", o.txRows),
		Figure: fmt.Sprintf("%.0f rows/s%s", repRate, keptUp), Target: fmt.Sprintf("≥ %d rows/s", rateAim), Met: repRate >= rateAim})
	return srv.AliveNoError()
}

func met(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func streamStats(ctx context.Context, conn *pgx.Conn) (blocks, txns int64) {
	_ = conn.QueryRow(ctx, `SELECT coalesce(sum(stream_count), 0), coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots`).Scan(&blocks, &txns)
	return blocks, txns
}

// countRows runs a count query on the replica, reading the file as any
// reader would.
func countRows(file, query string) (int, error) {
	db, err := sql.Open("sqlite", "file:"+file+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var n int
	err = db.QueryRow(query).Scan(&n)
	return n, err
}
