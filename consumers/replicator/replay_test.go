package replicator_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/streams"
)

var quiet = slog.New(slog.DiscardHandler)

// snapshot is a replica's schema, rows and progress.
func snapshot(t *testing.T, file string) []string {
	t.Helper()
	out := query(t, file, `SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name`)
	for _, tb := range query(t, file, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\_zero.%' ESCAPE '\' AND name NOT LIKE '\_jetsync.%' ESCAPE '\' ORDER BY name`) {
		out = append(out, "-- "+tb)
		out = append(out, query(t, file, `SELECT * FROM "`+tb+`" ORDER BY 1, 2`)...)
	}
	out = append(out, query(t, file, `SELECT stateVersion FROM "_zero.replicationState"`)...)
	out = append(out, query(t, file, `SELECT * FROM "_zero.replicationConfig"`)...)
	out = append(out, query(t, file, `SELECT * FROM "_jetsync.state"`)...)
	out = append(out, query(t, file, `SELECT * FROM "_zero.column_metadata" ORDER BY 1, 2`)...)
	return out
}

func TestReplay(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.initialSync(150)
	e.tx(ins(issue("a", "A", 1)), del("i7"))
	e.packed([]streams.Change{upd(nil, issue("a", "A2", 2))}, []streams.Change{ins(issue("b", "B", 2))})
	// A transaction over three messages and two tables.
	wm := e.NextWM()
	e.Publish(&streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{{Watermark: wm, Prev: e.WM, Num: 0, Changes: []streams.Change{ins(issue("c", "C", 3))}}}})
	mid := e.Publish(&streams.Message{Schema: "app", Table: "user", Parts: []streams.Part{{Watermark: wm, Num: 1, Changes: []streams.Change{{Op: streams.OpInsert, New: streams.Row{"id": raw(2), "name": raw("bob")}}}}}})
	e.Publish(&streams.Message{Parts: []streams.Part{{Watermark: wm, Num: 2, Last: true, Changes: []streams.Change{}}}})
	e.WM = wm
	e.tx(upd(streams.Row{"id": raw("b")}, issue("bb", "B", 2)))

	r := e.start(e.config(tempFile(t)))
	r.waitWM(t, e.WM)
	r.stop()
	want := snapshot(t, r.file)

	t.Run("Whole", func(t *testing.T) {
		file := tempFile(t)
		st, err := replicator.Replay(ctx, e.JS, replicator.ReplayConfig{Logger: quiet, File: file, Shard: e.Shard})
		if err != nil {
			t.Fatal(err)
		}
		if st.Watermark != e.WM {
			t.Errorf("Replay watermark = %s; want %s", st.Watermark, e.WM)
		}
		if diff := cmp.Diff(want, snapshot(t, file)); diff != "" {
			t.Errorf("replayed replica differs from the consumer's (-consumer +replay):\n%s", diff)
		}
	})

	t.Run("InStages", func(t *testing.T) {
		file := tempFile(t)
		// Up to the middle of the three-message transaction: it is left out.
		st, err := replicator.Replay(ctx, e.JS, replicator.ReplayConfig{Logger: quiet, File: file, Shard: e.Shard, ToSeq: mid})
		if err != nil {
			t.Fatal(err)
		}
		if st.StreamSeq != mid-2 {
			t.Errorf("Replay to %d stopped at seq %d; want %d", mid, st.StreamSeq, mid-2)
		}
		if got := query(t, file, "SELECT count(*) FROM issue WHERE id = 'c'"); got[0] != "0" {
			t.Error("part of an incomplete transaction was kept")
		}
		if _, err := replicator.Replay(ctx, e.JS, replicator.ReplayConfig{Logger: quiet, File: file, Shard: e.Shard}); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, snapshot(t, file)); diff != "" {
			t.Errorf("replica replayed in stages differs (-consumer +replay):\n%s", diff)
		}
	})

	t.Run("OneTable", func(t *testing.T) {
		file := tempFile(t)
		if _, err := replicator.Replay(ctx, e.JS, replicator.ReplayConfig{Logger: quiet, File: file, Shard: e.Shard, Table: "app.user"}); err != nil {
			t.Fatal(err)
		}
		got := snapshot(t, file)
		if strings.Contains(strings.Join(got, "\n"), `CREATE TABLE "issue"`) {
			t.Error("replay of app.user created issue")
		}
		if diff := cmp.Diff(query(t, r.file, `SELECT * FROM "app.user" ORDER BY id`), query(t, file, `SELECT * FROM "app.user" ORDER BY id`)); diff != "" {
			t.Errorf("app.user differs (-consumer +replay):\n%s", diff)
		}
	})
}
