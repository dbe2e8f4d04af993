package pgrepl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// TestDegraded_Source runs the producer as a role that cannot create event
// triggers (README, "Bad conditions"): sessions without schema changes resume,
// and a schema change forces a new initial sync that carries it.
func TestDegraded_Source(t *testing.T) {
	outer := t // a Source started in a subtest outlives it
	e := newEnv(t, `CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (id int PRIMARY KEY);
		INSERT INTO a SELECT g, 'seed' FROM generate_series(1, 10) g;
		-- FOR TABLES IN SCHEMA needs a superuser: an administrator creates it.
		CREATE PUBLICATION _zero_public_0 FOR TABLES IN SCHEMA public`)
	e.url = pgtest.NewRole(t, e.url)
	stop := e.run(t)
	u1 := e.waitSynced(t, "")
	var ddlDetection bool
	if err := e.conn.QueryRow(context.Background(), `SELECT "ddlDetection" FROM zero_0."shardConfig"`).Scan(&ddlDetection); err != nil {
		t.Fatal(err)
	}
	if ddlDetection {
		t.Fatal("ddlDetection = true for a role that cannot create event triggers")
	}
	e.exec(t, `INSERT INTO a VALUES (11, 'x'); INSERT INTO b VALUES (1)`)
	e.waitTxs(t, 2)

	t.Run("RestartWithoutSchemaChange", func(t *testing.T) {
		stop()
		stop = e.run(outer)
		// Every table's first change in a session brings a Relation
		// message, identical to the initial schema.
		e.exec(t, `INSERT INTO a VALUES (12, 'y'); INSERT INTO b VALUES (2)`)
		txs := e.waitTxs(t, 3)
		if ids := inserted(txs, "a"); !slices.Equal(ids, []int{11, 12}) {
			t.Errorf("inserts into a = %v; want [11 12]", ids)
		}
		if u := e.upstream(t); u.ReplicaVersion != u1.ReplicaVersion {
			t.Errorf("restart reset the stream: %s -> %s", u1.ReplicaVersion, u.ReplicaVersion)
		}
	})

	t.Run("AddColumnUnderLoad", func(t *testing.T) {
		w := e.startWriters(t, 1, 100, func(ctx context.Context, conn *pgx.Conn, id int64) error {
			_, err := conn.Exec(ctx, `INSERT INTO a (id, v) VALUES ($1, 'w')`, id)
			return err
		})
		next := &w.next
		polltest.Until(t, 30*time.Second, "the writer to start", func() bool { return next.Load() > 200 })
		e.exec(t, `ALTER TABLE a ADD COLUMN extra text DEFAULT 'd'`)
		u2 := e.waitSynced(t, u1.ReplicaVersion)
		from := next.Load()
		polltest.Until(t, 30*time.Second, "writes after the resync", func() bool { return next.Load() > from+100 })
		if err := w.stop(); err != nil {
			t.Fatal(err)
		}

		rv, txs := transactions(t, e.messages(t))
		if rv != u2.ReplicaVersion {
			t.Fatalf("stream's last reset is %s; want %s", rv, u2.ReplicaVersion)
		}
		r := txs[0].changes[0].Reset
		if r == nil || !strings.Contains(r.Reason, "public.a") || !strings.Contains(r.Reason, "extra") {
			t.Errorf("reset = %+v; want a reason naming public.a and extra", r)
		}
		if spec := createTable(txs, "a"); spec == nil ||
			!slices.ContainsFunc(spec.Columns, func(c streams.ColumnSpec) bool { return c.Name == "extra" }) {
			t.Fatalf("create-table a after the reset = %+v; want column extra", spec)
		}
		// The stream after the reset holds exactly Postgres's rows of a,
		// with the new column.
		want := map[int]string{}
		rows, err := e.conn.Query(context.Background(), `SELECT id, extra FROM a`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int
			var extra string
			if err := rows.Scan(&id, &extra); err != nil {
				t.Fatal(err)
			}
			want[id] = extra
		}
		var got map[int]string
		polltest.UntilNil(t, 30*time.Second, "the stream to hold every row of a", func() error {
			_, txs := transactions(t, e.messages(t))
			if got = extraByID(txs); len(got) >= len(want) {
				return nil
			}
			var missing []int
			for id := range want {
				if _, ok := got[id]; !ok {
					missing = append(missing, id)
				}
			}
			slices.Sort(missing)
			return fmt.Errorf("%d of %d; missing %v", len(got), len(want), missing[:min(len(missing), 50)])
		})
		if len(got) != len(want) {
			t.Errorf("the stream has %d rows of a; Postgres %d", len(got), len(want))
		}
		for id, w := range want {
			if g, ok := got[id]; !ok || g != w {
				t.Errorf("a %d: stream extra = %q (present %v); Postgres %q", id, g, ok, w)
			}
		}

		// The new initial schema has the column: a restart resumes.
		stop()
		stop = e.run(outer)
		e.exec(t, `INSERT INTO a VALUES (1000000, 'z', 'e')`)
		polltest.Until(t, 30*time.Second, "the insert after the restart", func() bool {
			_, txs := transactions(t, e.messages(t))
			return slices.Contains(inserted(txs, "a"), 1000000)
		})
		if u := e.upstream(t); u.ReplicaVersion != u2.ReplicaVersion {
			t.Errorf("restart after the resync reset the stream again: %s -> %s", u2.ReplicaVersion, u.ReplicaVersion)
		}
	})
}

// TestDegraded_SchemaChanges checks what degraded mode catches beyond a
// changed Relation message, as zero-cache does: a table dropped and created
// again (a new OID), and, by reading the published schema again at each
// Relation message, a table dropped outright and a nullability change.
func TestDegraded_SchemaChanges(t *testing.T) {
	outer := t
	e := newEnv(t, `CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE gone (id int PRIMARY KEY);
		CREATE TABLE other (id int PRIMARY KEY); CREATE TABLE strict (id int PRIMARY KEY, v text);
		INSERT INTO t SELECT g, 'old' FROM generate_series(1, 5) g;
		CREATE PUBLICATION _zero_public_0 FOR TABLES IN SCHEMA public`)
	e.url = pgtest.NewRole(t, e.url)
	cfg, err := pgx.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	role := pgx.Identifier{cfg.User}.Sanitize()
	stop := e.run(t)
	rv := e.waitSynced(t, "").ReplicaVersion

	// resynced waits for the initial sync after rv and returns its
	// transactions, checking that its reason has every one of want.
	resynced := func(t *testing.T, want ...string) []txn {
		t.Helper()
		u := e.waitSynced(t, rv)
		rv = u.ReplicaVersion
		got, txs := transactions(t, e.messages(t))
		if got != rv {
			t.Fatalf("stream's last reset is %s; want %s", got, rv)
		}
		r := txs[0].changes[0].Reset
		if r == nil {
			t.Fatalf("first change after the reset = %+v; want a reset", txs[0].changes[0])
		}
		for _, w := range want {
			if !strings.Contains(r.Reason, w) {
				t.Errorf("reset reason %q does not say %q", r.Reason, w)
			}
		}
		return txs
	}

	t.Run("Recreated", func(t *testing.T) {
		e.exec(t, `DROP TABLE t; CREATE TABLE t (id int PRIMARY KEY, v text); ALTER TABLE t OWNER TO `+role)
		e.exec(t, `INSERT INTO t VALUES (100, 'new'), (101, 'new')`)
		txs := resynced(t, "public.t", "dropped and created again")
		var oid uint32
		if err := e.conn.QueryRow(context.Background(), `SELECT 't'::regclass::oid`).Scan(&oid); err != nil {
			t.Fatal(err)
		}
		if spec := createTable(txs, "t"); spec == nil || spec.OID != oid {
			t.Errorf("create-table t after the reset = %+v; want oid %d", spec, oid)
		}
		// The stream after the reset holds exactly the new table's rows.
		if ids := rowIDs(txs, "t"); !slices.Equal(ids, []int{100, 101}) {
			t.Errorf("rows of t after the reset = %v; want [100 101]", ids)
		}
	})

	t.Run("DroppedTable", func(t *testing.T) {
		// other's Relation message, its first in the session, is as
		// before: only reading the published schema again shows gone gone.
		e.exec(t, `DROP TABLE gone`)
		e.exec(t, `INSERT INTO other VALUES (1)`)
		txs := resynced(t, "public.gone", "dropped, or no longer published")
		if spec := createTable(txs, "gone"); spec != nil {
			t.Errorf("the initial sync after the reset copied gone: %+v", spec)
		}
	})

	t.Run("SetNotNull", func(t *testing.T) {
		e.exec(t, `ALTER TABLE strict ALTER COLUMN v SET NOT NULL`)
		e.exec(t, `INSERT INTO strict VALUES (1, 'x')`)
		txs := resynced(t, "public.strict", "column v is now NOT NULL")
		if spec := createTable(txs, "strict"); spec == nil || !spec.Columns[1].NotNull {
			t.Errorf("create-table strict after the reset = %+v; want v NOT NULL", spec)
		}
	})

	t.Run("UnchangedResumes", func(t *testing.T) {
		// Every table's Relation message, in this session and the next,
		// matches the new initial sync.
		e.exec(t, `INSERT INTO t VALUES (102, 'x'); INSERT INTO other VALUES (2); INSERT INTO strict VALUES (2, 'y')`)
		stop()
		stop = e.run(outer)
		e.exec(t, `INSERT INTO t VALUES (103, 'x'); INSERT INTO other VALUES (3); INSERT INTO strict VALUES (3, 'y')`)
		polltest.Until(t, 30*time.Second, "the inserts after the restart", func() bool {
			_, txs := transactions(t, e.messages(t))
			return slices.Contains(inserted(txs, "strict"), 3)
		})
		_, txs := transactions(t, e.messages(t))
		if ids := rowIDs(txs, "t"); !slices.Equal(ids, []int{100, 101, 102, 103}) {
			t.Errorf("rows of t = %v; want [100 101 102 103]", ids)
		}
		if u := e.upstream(t); u.ReplicaVersion != rv {
			t.Errorf("an unchanged schema reset the stream: %s -> %s", rv, u.ReplicaVersion)
		}
	})
}

// rowIDs returns the sorted ids of table's rows that txs backfill or
// insert.
func rowIDs(txs []txn, table string) []int {
	ids := inserted(txs, table)
	for _, tx := range txs {
		for _, c := range tx.changes {
			if c.table != table || c.Op != streams.OpBackfill {
				continue
			}
			col := slices.Index(c.Columns, "id")
			for _, row := range c.Rows {
				var id int
				json.Unmarshal(row[col], &id)
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

func createTable(txs []txn, table string) *streams.TableSpec {
	for _, tx := range txs {
		for _, c := range tx.changes {
			if c.table == table && c.Op == streams.OpCreateTable {
				return c.Spec
			}
		}
	}
	return nil
}

// extraByID returns a's column extra by id, from the backfills and inserts
// of txs.
func extraByID(txs []txn) map[int]string {
	out := map[int]string{}
	for _, tx := range txs {
		for _, c := range tx.changes {
			if c.table != "a" {
				continue
			}
			switch c.Op {
			case streams.OpBackfill:
				idCol, extraCol := slices.Index(c.Columns, "id"), slices.Index(c.Columns, "extra")
				for _, row := range c.Rows {
					var id int
					var extra string
					json.Unmarshal(row[idCol], &id)
					if extraCol >= 0 {
						json.Unmarshal(row[extraCol], &extra)
					}
					out[id] = extra
				}
			case streams.OpInsert:
				var id int
				var extra string
				json.Unmarshal(c.New["id"], &id)
				json.Unmarshal(c.New["extra"], &extra)
				out[id] = extra
			}
		}
	}
	return out
}
