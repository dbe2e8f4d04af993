package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/producers/pgrepl"
	"github.com/jetsync/jetsync/streams"
)

// TestSpine_Degraded runs the change-streamer as a role that cannot create
// event triggers, as on hosted Postgres (README, "Bad conditions"): without
// schema changes it resumes across restarts, and a schema change under a
// live workload forces a new initial sync that the replica rebuilds from.
func TestSpine_Degraded(t *testing.T) {
	s := newSpine(t, spineSchema+`
		INSERT INTO every (id, t, i4) SELECT g, 'seed ' || g, g FROM generate_series(1, 200) g;
		INSERT INTO pair SELECT 'seed-' || g, g % 5, 'v' FROM generate_series(1, 100) g;
		-- FOR TABLES IN SCHEMA needs a superuser: an administrator creates
		-- it, and the app names it (ZERO_APP_PUBLICATIONS).
		CREATE PUBLICATION app FOR TABLES IN SCHEMA public;`)
	roleURL := pgtest.NewRole(t, s.url)
	startProducer := func() (stop func()) {
		src, err := pgrepl.New(pgrepl.Config{
			UpstreamURL: roleURL, Shard: s.shard, Publications: []string{"app"}, Stream: streams.Config{Shard: s.shard},
		}, s.js)
		if err != nil {
			t.Fatal(err)
		}
		return s.run("producer", src.Run)
	}
	stopProducer := startProducer()
	s.startReplica()
	s.waitCaughtUp(time.Minute)
	var ddlDetection bool
	if err := s.pg.QueryRow(context.Background(), `SELECT "ddlDetection" FROM zero_0."shardConfig"`).Scan(&ddlDetection); err != nil {
		t.Fatal(err)
	}
	if ddlDetection {
		t.Fatal("ddlDetection = true for a role that cannot create event triggers")
	}
	rv := s.rep.State().ReplicaVersion

	// Without schema changes, restarts resume: every session's Relation
	// messages match the initial schema.
	ctx := context.Background()
	w := newWorkload(2, 2_000_000_000)
	for id := int64(1); id <= 200; id++ {
		w.ids = append(w.ids, id)
	}
	for range 2 {
		for range 100 {
			if err := w.tx(ctx, s.pg, false); err != nil {
				t.Fatalf("workload: %v", err)
			}
		}
		stopProducer()
		stopProducer = startProducer()
	}
	s.waitCaughtUp(time.Minute)
	if got := s.rep.State().ReplicaVersion; got != rv {
		t.Fatalf("replica version %s after restarts; want %s: nothing needed a resync", got, rv)
	}
	s.checkReplicaEqualsPostgres()

	// A schema change while the workload writes to the table.
	lw := startLiveWorkload(t, s.url)
	lw.progress(t, 50)
	if _, err := s.pg.Exec(ctx, `ALTER TABLE pair ADD COLUMN extra text DEFAULT 'x'`); err != nil {
		t.Fatal(err)
	}
	lw.progress(t, 100)
	polltest.Until(t, 2*time.Minute, "a new replica version", func() bool { return s.rep.State().ReplicaVersion != rv })
	if _, err := s.pg.Exec(ctx, `UPDATE pair SET extra = 'y' WHERE b = 1`); err != nil {
		t.Fatal(err)
	}
	lw.progress(t, 50)
	lw.stop()
	if n := lw.errs.Load(); n > lw.txs.Load()/10 {
		t.Errorf("%d workload transactions failed, %d committed", n, lw.txs.Load())
	}
	s.waitCaughtUp(2 * time.Minute)
	s.checkReplicaEqualsPostgres()
	s.checkSchemaEqualsPostgres()
	s.checkTableEqualsPostgres("pair", `SELECT a, b, v, extra FROM pair`, []string{"a", "b"})
}
