// Command restore measures jetsync's snapshot restore: a replica of -mb
// megabytes is snapshotted into the object store of an embedded NATS
// server (the production server.conf), then restored into a new file.
// It reports the download (with its SHA-256 digest, fsync and rename) in
// MB/s, the quick_check apart, and the catch-up of -txs transactions
// published after the snapshot.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/consumers/backup"
	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/consumers/restore"
	"github.com/jetsync/jetsync/streams"
)

func main() {
	mb := flag.Int("mb", 1100, "replica size to build, in MB")
	flag.IntVar(&runs, "runs", 3, "restores to run (the median is reported)")
	txs := flag.Int("txs", 20000, "transactions published after the snapshot, for the catch-up")
	dir := flag.String("dir", "", "working directory; default a temporary one, removed afterwards")
	flag.BoolVar(&verbose, "v", false, "log the restore (at debug level) to stderr")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the restore (download, digest, quick_check) to this file")
	flag.Parse()
	if err := run(*mb, *txs, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "bench/restore:", err)
		os.Exit(1)
	}
}

var (
	cpuProfile string
	verbose    bool
	runs       int
)

type env struct {
	js      jetstream.JetStream
	shard   streams.Shard
	lsn     uint64
	wm      string
	version string
}

func (e *env) next() string { e.lsn += 8; return streams.Lexi(e.lsn) }

func (e *env) publish(ctx context.Context, m *streams.Message) (uint64, error) {
	data, err := streams.Encode(m)
	if err != nil {
		return 0, err
	}
	subj := e.shard.TxSubject()
	if m.Table != "" {
		subj = e.shard.TableSubject(m.Schema, m.Table)
	}
	ack, err := e.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: data, Header: streams.Header(m.Parts, e.version)})
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

func raw(v any) json.RawMessage { b, _ := json.Marshal(v); return b }

// initialSync publishes an initial sync of an empty table item.
func (e *env) initialSync(ctx context.Context, kv jetstream.KeyValue) error {
	v := e.next()
	e.version = v
	resetSeq, err := e.publish(ctx, &streams.Message{Parts: []streams.Part{{Watermark: v, Num: 0, Changes: []streams.Change{{
		Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: v, Publications: []string{"zero_data"}, SystemID: "1", Slot: "s"},
	}}}}})
	if err != nil {
		return err
	}
	spec := streams.TableSpec{Schema: "public", Name: "item", PrimaryKey: []string{"id"}, Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "int8", Kind: streams.KindNumber, NotNull: true},
		{Name: "v", Pos: 2, DataType: "text", Kind: streams.KindString},
	}}
	if _, err := e.publish(ctx, &streams.Message{Schema: "public", Table: "item", Parts: []streams.Part{{Watermark: v, Num: 1, Changes: []streams.Change{{Op: streams.OpCreateTable, Spec: &spec}}}}}); err != nil {
		return err
	}
	if _, err := e.publish(ctx, &streams.Message{Parts: []streams.Part{{Watermark: v, Num: 2, Last: true, Changes: []streams.Change{}}}}); err != nil {
		return err
	}
	e.wm = v
	b, _ := json.Marshal(streams.Upstream{SystemID: "1", Slot: "s", ReplicaVersion: v, Publications: []string{"zero_data"}, ResetSeq: resetSeq, Complete: true})
	_, err = kv.Put(ctx, streams.KeyUpstream, b)
	return err
}

func (e *env) tx(ctx context.Context, id int) (uint64, error) {
	wm := e.next()
	seq, err := e.publish(ctx, &streams.Message{Schema: "public", Table: "item", Parts: []streams.Part{{
		Watermark: wm, Prev: e.wm, Num: 0, Last: true, CommitTimeMs: float64(time.Now().UnixMilli()),
		Changes: []streams.Change{{Op: streams.OpInsert, New: streams.Row{"id": raw(id), "v": raw("tx " + strconv.Itoa(id))}}},
	}}})
	e.wm = wm
	return seq, err
}

func waitSeq(ctx context.Context, c *replicator.Consumer, seq uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for c.State().StreamSeq < seq {
		if time.Now().After(deadline) {
			return fmt.Errorf("replica at %d, want %d after %s", c.State().StreamSeq, seq, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// runReplica runs a replica consumer until the returned stop is called.
func runReplica(js jetstream.JetStream, shard streams.Shard, file, task string) (*replicator.Consumer, func() error, error) {
	c, err := replicator.New(replicator.Config{File: file, Shard: shard, TaskID: task, Logger: slog.New(slog.DiscardHandler)}, js)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return c, func() error { cancel(); return <-done }, nil
}

// fill grows the replica's item table to about mb megabytes, directly, at
// the replica version (the stream need not carry the rows to measure a
// restore).
func fill(file, version string, mb int) error {
	db, err := sql.Open("sqlite", "file:"+file+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)&_pragma=synchronous(off)")
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	pad := make([]byte, 900)
	for i := range pad {
		pad[i] = 'a' + byte(i%26)
	}
	rows := mb * 1000 // about 1 KB a row
	const batch = 20000
	for lo := 1_000_000; lo < 1_000_000+rows; lo += batch {
		tx, err := db.Begin()
		if err != nil {
			return err
		}
		st, err := tx.Prepare(`INSERT INTO item (id, v, _0_version) VALUES (?, ?, ?)`)
		if err != nil {
			tx.Rollback()
			return err
		}
		for id := lo; id < min(lo+batch, 1_000_000+rows); id++ {
			if _, err := st.Exec(id, strconv.Itoa(id)+string(pad), version); err != nil {
				tx.Rollback()
				return err
			}
		}
		st.Close()
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	_, err = db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
	return err
}

func histSum(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetHistogram().GetSampleSum()
		}
	}
	return 0
}

func run(mb, txs int, dir string) error {
	ctx := context.Background()
	if dir == "" {
		d, err := os.MkdirTemp("", "jetsync-bench-restore-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	quiet := slog.New(slog.DiscardHandler)
	ns, err := benchenv.StartNATS(filepath.Join(dir, "nats"), quiet)
	if err != nil {
		return err
	}
	defer ns.Close()
	js := ns.JS
	e := &env{js: js, shard: streams.Shard{App: "zero", Num: 0}, lsn: 0x1000}
	_, kv, err := streams.Ensure(ctx, js, streams.Config{Shard: e.shard})
	if err != nil {
		return err
	}
	if err := e.initialSync(ctx, kv); err != nil {
		return err
	}

	// The backup replica: an initial sync from the stream, then grown.
	src := filepath.Join(dir, "backup-replica.db")
	cs, stopCS, err := runReplica(js, e.shard, src, "cs")
	if err != nil {
		return err
	}
	if err := waitSeq(ctx, cs, 3, time.Minute); err != nil {
		return err
	}
	if err := stopCS(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	t0 := time.Now()
	if err := fill(src, e.version, mb); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	fi, _ := os.Stat(src)
	fmt.Printf("replica built: %.0f MB in %s\n", float64(fi.Size())/1e6, time.Since(t0).Round(time.Millisecond))

	p, err := backup.New(backup.Config{File: src, Shard: e.shard, TaskID: "cs", Logger: quiet, PurgeWait: -1}, js)
	if err != nil {
		return err
	}
	t0 = time.Now()
	snap, err := p.Snapshot(ctx, false)
	if err != nil {
		return err
	}
	took := time.Since(t0)
	fmt.Printf("snapshot (VACUUM INTO + sha256 + upload): %.0f MB in %s, %.0f MB/s\n", float64(snap.Size)/1e6, took.Round(time.Millisecond), float64(snap.Size)/1e6/took.Seconds())
	t0 = time.Now()
	if err := p.Check(ctx); err != nil {
		return err
	}
	fmt.Printf("verification (read back + sha256): %s\n", time.Since(t0).Round(time.Millisecond))

	// Transactions after the snapshot, for the catch-up.
	var last uint64
	for i := range txs {
		if last, err = e.tx(ctx, i); err != nil {
			return err
		}
	}

	dst := filepath.Join(dir, "view-syncer.db")
	rlog := quiet
	if verbose {
		rlog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	// The setup's gigabytes of dirty pages (the replica, the snapshot's
	// copy) would otherwise be written back during the first restore.
	syscall.Sync()
	// The disk and CPUs of a shared machine vary by run: restore several
	// times and report the median too. The last restore is caught up.
	var h *restore.Hold
	var rates []float64
	for i := range runs {
		if h != nil {
			if err := h.End(ctx); err != nil {
				return err
			}
			for _, s := range []string{"", "-wal", "-shm"} {
				os.Remove(dst + s)
			}
		}
		reg := prometheus.NewRegistry()
		r, err := restore.New(restore.Config{File: dst, Shard: e.shard, TaskID: "vs", Logger: rlog, Registerer: reg, ProgressEvery: time.Second}, js)
		if err != nil {
			return err
		}
		if cpuProfile != "" && i == 0 {
			pf, err := os.Create(cpuProfile)
			if err != nil {
				return err
			}
			if err := pprof.StartCPUProfile(pf); err != nil {
				return err
			}
		}
		t0 = time.Now()
		if h, err = r.Restore(ctx); err != nil {
			return err
		}
		total := time.Since(t0)
		if cpuProfile != "" && i == 0 {
			pprof.StopCPUProfile()
		}
		check := time.Duration(histSum(reg, "zero_replica_restore_validation_duration_seconds") * float64(time.Second))
		dl := total - check
		size := float64(h.Result().Bytes) / 1e6
		rates = append(rates, size/dl.Seconds())
		fmt.Printf("restore %d: %.0f MB; download + sha256 + fsync + rename %s = %.0f MB/s; quick_check (+ state read) %s = %.0f MB/s; total %s\n",
			i+1, size, dl.Round(time.Millisecond), size/dl.Seconds(), check.Round(time.Millisecond), size/check.Seconds(), total.Round(time.Millisecond))
	}
	slices.Sort(rates)
	fmt.Printf("restore (download + sha256 + fsync + rename): median %.0f MB/s of %d runs (min %.0f, max %.0f)\n",
		rates[len(rates)/2], len(rates), rates[0], rates[len(rates)-1])

	t0 = time.Now()
	vs, stopVS, err := runReplica(js, e.shard, dst, "vs")
	if err != nil {
		return err
	}
	if err := waitSeq(ctx, vs, last, 10*time.Minute); err != nil {
		return err
	}
	catch := time.Since(t0)
	if err := h.End(ctx); err != nil {
		return err
	}
	stopVS()
	fmt.Printf("catch-up: %d transactions in %s = %.0f tx/s (consumer start included)\n", txs, catch.Round(time.Millisecond), float64(txs)/catch.Seconds())
	return nil
}
