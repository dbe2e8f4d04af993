package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/consumers/backup"
	"github.com/jetsync/jetsync/consumers/backup/backuptest"
	"github.com/jetsync/jetsync/consumers/restore"
	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/producers/pgrepl"
)

// TestRestore_R5_R8_R9_R12_R13_R16_ColdStartPostgres is acceptance 1 on the
// real spine, in one process: Postgres → pgrepl → change stream → backup
// replica → snapshot; the stream is purged past the initial sync; a cold
// view-syncer restores, catches up while writes go on, and equals Postgres.
// It lives here, not in consumers/restore, because it drives a producer.
func TestRestore_R5_R8_R9_R12_R13_R16_ColdStartPostgres(t *testing.T) {
	cl := pgtest.Start(t)
	url := pgtest.NewDB(t, cl)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE item (id int8 PRIMARY KEY, v text)`)
	exec(`INSERT INTO item SELECT g, 'row ' || g FROM generate_series(1, 5000) g`)

	e := backuptest.New(t)
	src, err := pgrepl.New(pgrepl.Config{UpstreamURL: url, Shard: e.Shard, Logger: backuptest.Logger()}, e.JS)
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	srcDone := make(chan error, 1)
	go func() { srcDone <- src.Run(sctx) }()
	t.Cleanup(func() { cancel(); <-srcDone })
	cs := e.StartReplica(filepath.Join(t.TempDir(), "backup-replica.db"), "cs")
	pgRows := func() []string {
		t.Helper()
		rs, err := conn.Query(ctx, `SELECT id, coalesce(v, '') FROM item ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		var out []string
		for rs.Next() {
			var id int64
			var v string
			if err := rs.Scan(&id, &v); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%d|%s", id, v))
		}
		return out
	}
	replicaRows := func(file string) []string {
		db, err := sql.Open("sqlite", "file:"+file+"?mode=ro")
		if err != nil {
			return nil
		}
		defer db.Close()
		rs, err := db.Query(`SELECT id, coalesce(v, '') FROM item ORDER BY id`)
		if err != nil {
			return nil
		}
		defer rs.Close()
		var out []string
		for rs.Next() {
			var id int64
			var v string
			if err := rs.Scan(&id, &v); err != nil {
				return nil
			}
			out = append(out, fmt.Sprintf("%d|%s", id, v))
		}
		return out
	}
	equal := func(what, file string) {
		t.Helper()
		want := pgRows()
		polltest.Until(t, 60*time.Second, what+" equal to Postgres", func() bool { return slices.Equal(want, replicaRows(file)) })
	}
	write := func(round int) {
		t.Helper()
		for i := range 20 {
			exec(`UPDATE item SET v = $1 WHERE id = $2`, fmt.Sprintf("r%d-%d", round, i), 1+(round*37+i*101)%5000)
		}
		exec(`INSERT INTO item VALUES ($1, 'new')`, 10000+round)
		exec(`DELETE FROM item WHERE id = $1`, 1+round*13)
	}
	equal("the backup replica", cs.File)

	clock := backuptest.NewClock()
	p, err := backup.New(backup.Config{File: cs.File, Shard: e.Shard, TaskID: "cs", Now: clock.Now, Logger: backuptest.Logger(), InitialGrace: time.Hour, PurgeWait: -1}, e.JS)
	if err != nil {
		t.Fatal(err)
	}
	write(1)
	equal("the backup replica", cs.File)
	s, err := p.Snapshot(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	write(2)
	equal("the backup replica", cs.File)
	clock.Advance(time.Minute)
	if err := p.Check(ctx); err != nil {
		t.Fatal(err)
	}
	up := cs.C.State()
	first, _ := e.StreamState()
	if first != s.StreamSeq+1 || first <= up.ResetSeq {
		t.Fatalf("stream starts at %d after the purge; want %d, past the initial sync at %d", first, s.StreamSeq+1, up.ResetSeq)
	}

	file := filepath.Join(t.TempDir(), "view-syncer.db")
	r, err := restore.New(restore.Config{File: file, Shard: e.Shard, TaskID: "vs", PollInterval: 20 * time.Millisecond,
		Heartbeat: 50 * time.Millisecond, ReservationTTL: time.Second, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()}, e.JS)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	h, err := r.Restore(rctx)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	t.Cleanup(h.Abandon)
	if r := h.Result(); !r.Restored || r.Snapshot.Name != s.Name {
		t.Fatalf("Result = %+v; want %s restored", r, s.Name)
	}
	vs := e.StartReplica(file, "vs")
	write(3) // while catching up
	if err := h.EndWhenCaughtUp(ctx, vs.C); err != nil {
		t.Fatal(err)
	}
	write(4)
	equal("the restored replica", file)
	t.Logf("restored %s (%d bytes) at seq %d; stream starts at %d", s.Name, s.Size, s.StreamSeq, first)
}
