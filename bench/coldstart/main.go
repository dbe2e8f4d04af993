// Command coldstart times a cold view-syncer, one with an empty data folder
// started against a stack whose change stream was purged past its initial
// sync, from its start to serving (its / answers and a query is hydrated),
// next to a fresh `jetsync run` doing the initial sync of the same data:
// seed.sh's 100,000 issues (451,020 rows).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/bench/internal/syncclient"
	"github.com/jetsync/jetsync/streams"
)

const (
	appID       = "zero"
	publication = "zpeer_pub"
)

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin/jetsync", "jetsync binary; built from ./cmd/jetsync when missing")
	benchenv.DataFlag(&o.data)
	flag.IntVar(&o.issues, "issues", 100000, "issues seed.sh creates (100000 makes 451,020 rows)")
	flag.IntVar(&o.txs, "txs", 2000, "one-row transactions committed after the snapshot, for the cold view-syncer to catch up")
	flag.IntVar(&o.runs, "runs", 3, "cold view-syncers to start, one after another (the median is reported)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (logs, data)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/coldstart:", err)
		os.Exit(1)
	}
}

type options struct {
	bin, data   string
	issues, txs int
	runs        int
	keep        bool
}

// backupEnv makes the change-streamer verify and purge at benchmark speed;
// snapshots after the first come from jetsync backup now.
var backupEnv = []string{
	"JETSYNC_BACKUP_CHECK_INTERVAL=500ms",
	"JETSYNC_BACKUP_CLEANUP_DELAY=1s",
	"JETSYNC_BACKUP_PURGE_WAIT=0",
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root, err := os.MkdirTemp("", "jetsync-bench-coldstart-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("temporary folder:", root)
	} else {
		defer os.RemoveAll(root)
	}
	bin, err := benchenv.JetsyncBin(ctx, o.bin, root)
	if err != nil {
		return err
	}
	pg, pgURL, err := benchenv.StartUpstream(ctx, root, o.data, o.issues, appID)
	if err != nil {
		return err
	}
	defer pg.Kill(context.WithoutCancel(ctx))
	natsPort, err := benchenv.FreePort()
	if err != nil {
		return err
	}
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	q := syncclient.NewQuery(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"i0000001"},"op":"="},"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","asc"]]},"system":"client"}],"limit":1}`)

	// 1. A fresh initial sync: jetsync run from an empty data folder.
	common := []string{"ZERO_UPSTREAM_DB=" + pgURL, "ZERO_APP_ID=" + appID, "ZERO_APP_PUBLICATIONS=" + publication, "ZERO_PORT=0", "ZERO_LOG_FORMAT=json"}
	t0 := time.Now()
	full, err := start(bin, root, "run", "run", append(append([]string{"JETSYNC_DATA_DIR=" + filepath.Join(root, "run"),
		fmt.Sprintf("JETSYNC_NATS_LISTEN=127.0.0.1:%d", natsPort), "ZERO_TASK_ID=run"}, common...), backupEnv...))
	if err != nil {
		return err
	}
	defer full.Stop()
	fresh, err := serving(ctx, full, t0, q)
	if err != nil {
		return fmt.Errorf("jetsync run: %w", err)
	}
	fmt.Printf("fresh initial sync (jetsync run, empty data folder): start -> serving %s (/ answers %s)\n",
		fresh.serving.Round(time.Millisecond), fresh.health.Round(time.Millisecond))

	// 2. History after the initial sync, a snapshot past it, and a purge
	// of everything before the snapshot.
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	shard := streams.Shard{App: appID, Num: 0}
	if err := updates(ctx, pgURL, 200); err != nil {
		return err
	}
	if err := waitCaughtUp(ctx, js, shard); err != nil {
		return err
	}
	now := exec.CommandContext(ctx, bin, "backup", "now")
	now.Env = append(os.Environ(), "JETSYNC_NATS_URL="+natsURL, "ZERO_APP_ID="+appID)
	if out, err := now.CombinedOutput(); err != nil {
		return fmt.Errorf("jetsync backup now: %w\n%s", err, out)
	}
	snap, err := waitPurged(ctx, js, shard, 3*time.Minute)
	if err != nil {
		return err
	}
	fmt.Printf("snapshot %s: %.0f MB at seq %d; the stream was purged past the initial sync\n", snap.Name, float64(snap.Size)/1e6, snap.StreamSeq)
	if err := updates(ctx, pgURL, o.txs); err != nil {
		return err
	}
	// The view-syncer inside jetsync run has applied them.
	if err := waitCaughtUp(ctx, js, shard); err != nil {
		return err
	}

	// 3. Cold view-syncers: empty data folder, the stream purged past its
	// start, so that each must restore the snapshot.
	var colds []time.Duration
	for i := range o.runs {
		t0 = time.Now()
		vs, err := start(bin, root, "view-syncer", fmt.Sprintf("view-syncer-%d", i+1), append([]string{"JETSYNC_DATA_DIR=" + filepath.Join(root, fmt.Sprintf("vs%d", i+1)),
			"JETSYNC_NATS_URL=" + natsURL, fmt.Sprintf("ZERO_TASK_ID=cold-vs-%d", i+1)}, common...))
		if err != nil {
			return err
		}
		cold, err := serving(ctx, vs, t0, q)
		if err == nil {
			err = report(ctx, vs, t0, cold)
		}
		vs.Stop()
		if err != nil {
			return fmt.Errorf("jetsync view-syncer: %w", err)
		}
		colds = append(colds, cold.serving)
	}
	slices.Sort(colds)
	cold := colds[len(colds)/2]
	fmt.Printf("cold view-syncer start -> serving: median %s of %d (min %s, max %s); fresh initial sync %s\n",
		cold.Round(time.Millisecond), len(colds), colds[0].Round(time.Millisecond), colds[len(colds)-1].Round(time.Millisecond), fresh.serving.Round(time.Millisecond))
	fmt.Printf("cold view-syncer / fresh initial sync: %.2f\n", cold.Seconds()/fresh.serving.Seconds())
	return nil
}

func num(v any) float64 { f, _ := v.(float64); return f }

// dur reads a duration from a JSON log record (slog writes nanoseconds).
func dur(v any) time.Duration { return time.Duration(num(v)).Round(time.Millisecond) }

// report prints a cold view-syncer's times and the steps of its restore,
// once it has caught up.
func report(ctx context.Context, p *benchenv.Proc, t0 time.Time, st servingTimes) error {
	if p.Log.Find("snapshot restored; catching up from the change stream") == nil {
		return fmt.Errorf("the cold view-syncer did not restore a snapshot:\n%s", p.Log.Tail())
	}
	if _, err := p.WaitLog(ctx, "caught up after the restore", 5*time.Minute); err != nil {
		return err
	}
	fmt.Printf("cold view-syncer (restore from snapshot + catch-up): start -> serving %s (/ answers %s)\n",
		st.serving.Round(time.Millisecond), st.health.Round(time.Millisecond))
	for _, m := range []string{"downloading snapshot", "snapshot downloaded", "snapshot restored; catching up from the change stream",
		"http listening", "caught up after the restore"} {
		if at, ok := p.Log.At(m); ok {
			fmt.Printf("  %-55s +%s\n", m, at.Sub(t0).Round(time.Millisecond))
		}
	}
	if rec := p.Log.Find("snapshot downloaded"); rec != nil {
		fmt.Printf("  download: %.0f MB in %s (%v MB/s)\n", num(rec["bytes"])/1e6, dur(rec["took"]), rec["mb_per_s"])
	}
	if rec := p.Log.Find("caught up after the restore"); rec != nil {
		fmt.Printf("  catch-up: %.0f stream messages in %s\n", num(rec["messages"]), dur(rec["took"]))
	}
	return nil
}

// updates commits n one-row transactions.
func updates(ctx context.Context, url string, n int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for i := range n {
		if _, err := conn.Exec(ctx, `UPDATE issue SET modified = modified + 1 WHERE id = $1`, fmt.Sprintf("i%07d", 1+i%1000)); err != nil {
			return fmt.Errorf("update: %w", err)
		}
	}
	return nil
}

// waitPurged waits for a verified snapshot past the initial sync and a
// purge of the stream past the initial sync.
func waitPurged(ctx context.Context, js jetstream.JetStream, shard streams.Shard, limit time.Duration) (streams.Snapshot, error) {
	deadline := time.Now().Add(limit)
	for {
		var up streams.Upstream
		snap, ok, info, err := position(ctx, js, shard, &up)
		if err == nil && ok && up.ResetSeq > 0 && snap.StreamSeq > up.ResetSeq && info.State.FirstSeq > up.ResetSeq {
			return snap, nil
		}
		if time.Now().After(deadline) {
			return snap, fmt.Errorf("no purge past the initial sync within %s (snapshot %v at %d, reset %d, err %v)", limit, ok, snap.StreamSeq, up.ResetSeq, err)
		}
		select {
		case <-ctx.Done():
			return snap, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func position(ctx context.Context, js jetstream.JetStream, shard streams.Shard, up *streams.Upstream) (streams.Snapshot, bool, *jetstream.StreamInfo, error) {
	kv, err := js.KeyValue(ctx, shard.StateBucket())
	if err != nil {
		return streams.Snapshot{}, false, nil, err
	}
	e, err := kv.Get(ctx, streams.KeyUpstream)
	if err != nil {
		return streams.Snapshot{}, false, nil, err
	}
	if err := json.Unmarshal(e.Value(), up); err != nil {
		return streams.Snapshot{}, false, nil, err
	}
	bkv, err := js.KeyValue(ctx, shard.BackupBucket())
	if err != nil {
		return streams.Snapshot{}, false, nil, err
	}
	snap, ok, err := streams.ReadSnapshot(ctx, bkv, streams.KeyBackupVerified)
	if err != nil {
		return snap, false, nil, err
	}
	st, err := js.Stream(ctx, shard.ChangesStream())
	if err != nil {
		return snap, ok, nil, err
	}
	info, err := st.Info(ctx)
	return snap, ok, info, err
}

// start runs jetsync sub with env (and none of this process's ZERO_ or
// JETSYNC_ settings), logging to root/logName.log.
func start(bin, root, sub, logName string, env []string) (*benchenv.Proc, error) {
	cmd := exec.Command(bin, sub)
	cmd.Env = benchenv.ServerEnv(env...)
	return benchenv.StartProc(logName, cmd, root)
}

type servingTimes struct{ health, serving time.Duration }

// serving waits until p's / answers 200 and q, put by a new client group,
// is hydrated, and returns both times since t0. / is polled every 5 ms,
// the precision of the health time.
func serving(ctx context.Context, p *benchenv.Proc, t0 time.Time, q syncclient.Query) (servingTimes, error) {
	var st servingTimes
	if err := p.WaitHealthy(ctx, 10*time.Minute, 5*time.Millisecond); err != nil {
		return st, err
	}
	st.health = time.Since(t0)
	if err := hydrate(p.Base, q); err != nil {
		return st, fmt.Errorf("query: %w\n%s", err, p.Log.Tail())
	}
	st.serving = time.Since(t0)
	return st, nil
}

// waitCaughtUp waits until the stream's last message is acked by every
// consumer of the stream (jetsync run's own replica's).
func waitCaughtUp(ctx context.Context, js jetstream.JetStream, shard streams.Shard) error {
	st, err := js.Stream(ctx, shard.ChangesStream())
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		behind := false
		for name := range st.ConsumerNames(ctx).Name() {
			c, err := st.Consumer(ctx, name)
			if err != nil {
				continue
			}
			ci, err := c.Info(ctx)
			if err == nil && ci.AckFloor.Stream < info.State.LastSeq {
				behind = true
			}
		}
		if !behind {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("jetsync run did not catch up within 5 minutes")
}

// hydrate connects a new client group desiring q (in the initConnection
// carried in the header, as the real client sends it) and reads until a
// finished poke has put q in its gotQueriesPatch.
func hydrate(base string, q syncclient.Query) error {
	c, err := syncclient.Dial(base, syncclient.Options{
		Group:  fmt.Sprintf("coldstart-%d", time.Now().UnixNano()),
		Client: "c",
		Init:   syncclient.InitConnection(q.Put(0)),
	})
	if err != nil {
		return err
	}
	defer c.Close()
	_, _, err = c.WaitGot(q.Hash)
	return err
}
