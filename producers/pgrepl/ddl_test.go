package pgrepl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// ddlLines renders a transaction's changes, leaving out the marker table.
func ddlLines(tx txn) []string {
	var out []string
	for _, c := range tx.changes {
		if c.table == "marker" {
			continue
		}
		line := c.table + " " + string(c.Op)
		if c.Columns != nil && c.Op != streams.OpBackfill {
			line += " " + strings.Join(c.Columns, ",")
		}
		if c.New != nil {
			b, _ := json.Marshal(c.New)
			line += " new=" + string(b)
		}
		if c.Index != nil {
			line += " " + c.Index.Name
			if c.Op == streams.OpCreateIndex {
				line += fmt.Sprintf("%v", c.Index.Columns)
				if c.Index.Desc != nil {
					line += fmt.Sprintf("desc%v", c.Index.Desc)
				}
			}
		}
		if c.Spec != nil {
			cols := make([]string, len(c.Spec.Columns))
			for i, col := range c.Spec.Columns {
				cols[i] = col.Name + ":" + col.DataType
				if col.NotNull {
					cols[i] += "!"
				}
			}
			line += fmt.Sprintf(" spec=%s.%s%v%v", c.Spec.Schema, c.Spec.Name, cols, c.Spec.PrimaryKey)
		}
		if c.Op == streams.OpBackfill {
			line += fmt.Sprintf(" %v rows=%d", c.Columns, len(c.Rows))
		}
		out = append(out, line)
	}
	return out
}

func TestSource_DDL(t *testing.T) {
	e := newEnv(t, `
		CREATE TABLE marker (n serial PRIMARY KEY);
		CREATE TABLE a (id int PRIMARY KEY, v text);
		INSERT INTO a VALUES (1, 'x'), (2, 'y');
		CREATE TABLE b (id int PRIMARY KEY, v text);
		CREATE SCHEMA side;
		CREATE TABLE side.s (id int PRIMARY KEY, v varchar(10));
		INSERT INTO side.s VALUES (1, 'one'), (2, 'two'), (3, 'three');
	`)
	stop := e.run(t)
	e.waitSynced(t, "")
	_, txs := transactions(t, e.messages(t))
	n := len(txs)
	step := func(sql string) []string {
		t.Helper()
		e.exec(t, "BEGIN; "+sql+"; INSERT INTO marker DEFAULT VALUES; COMMIT")
		n++
		txs := e.waitTxs(t, n)
		return ddlLines(txs[n-1])
	}
	aSpec := func(cols string) string { return " spec=public.a[id:int4! v:text" + cols + "][id]" }
	for _, tc := range []struct {
		sql  string
		want []string
	}{
		{`ALTER TABLE a ADD COLUMN n int DEFAULT 7`, []string{`a add-column n new={"n":7}` + aSpec(" n:int4")}},
		{`ALTER TABLE a ADD COLUMN neg int8 DEFAULT -5`, []string{`a add-column neg new={"neg":-5}` + aSpec(" n:int4 neg:int8")}},
		{`ALTER TABLE a ADD COLUMN q text DEFAULT 'it''s'`, []string{`a add-column q new={"q":"it's"}` + aSpec(" n:int4 neg:int8 q:text")}},
		{`ALTER TABLE a ADD COLUMN t text`, []string{`a add-column t` + aSpec(" n:int4 neg:int8 q:text t:text")}},
		// A default only Postgres can compute: the rows are copied again.
		{`ALTER TABLE a ADD COLUMN ts timestamptz NOT NULL DEFAULT now()`, []string{
			`a add-column ts` + aSpec(" n:int4 neg:int8 q:text t:text ts:timestamptz!"),
			`a backfill [id v n neg q t ts] rows=2`,
		}},
		{`ALTER TABLE a DROP COLUMN neg, DROP COLUMN q, DROP COLUMN ts`, []string{
			`a drop-column neg` + aSpec(" n:int4 q:text t:text ts:timestamptz!"),
			`a drop-column q` + aSpec(" n:int4 t:text ts:timestamptz!"),
			`a drop-column ts` + aSpec(" n:int4 t:text"),
		}},
		{`ALTER TABLE a RENAME COLUMN t TO t2`, []string{`a update-column t,t2` + aSpec(" n:int4 t2:text")}},
		{`ALTER TABLE a ALTER COLUMN n TYPE int8`, []string{`a update-column n,n` + aSpec(" n:int8 t2:text")}},
		{`CREATE INDEX a_v ON a (v DESC, n)`, []string{`a create-index a_v[v n]desc[true false]`}},
		// SQLite refuses to drop an indexed column: the index goes first.
		{`ALTER TABLE a DROP COLUMN n`, []string{`a drop-index a_v`, `a drop-column n` + aSpec(" t2:text")}},
		{`CREATE INDEX a_t2 ON a (t2)`, []string{`a create-index a_t2[t2]`}},
		{`DROP INDEX a_t2`, []string{`a drop-index a_t2`}},
		{`ALTER TABLE a RENAME TO a2`, []string{`a rename-table spec=public.a2[id:int4! v:text t2:text][id]`}},
		{`CREATE TABLE c (id int PRIMARY KEY, v text)`, []string{
			`c create-table spec=public.c[id:int4! v:text][id]`, `c create-index c_pkey[id]`,
		}},
		// A table that joins the publication brings its rows.
		{`ALTER PUBLICATION _zero_public_0 ADD TABLE side.s`, []string{
			`s create-table spec=side.s[id:int4! v:varchar][id]`, `s create-index s_pkey[id]`, `s backfill [id v] rows=3`,
		}},
		{`ALTER PUBLICATION _zero_public_0 DROP TABLE side.s`, []string{`s drop-index s_pkey`, `s drop-table`}},
		{`DROP TABLE c`, []string{`c drop-index c_pkey`, `c drop-table`}},
		// A new key: the table is brought to its new spec.
		{`ALTER TABLE b DROP CONSTRAINT b_pkey, ADD PRIMARY KEY (id, v)`, []string{
			`b drop-index b_pkey`,
			`b update-column v,v spec=public.b[id:int4! v:text!][id]`,
			`b create-table spec=public.b[id:int4! v:text!][id v]`,
			`b create-index b_pkey[id v]`,
		}},
		// Statements that change nothing published.
		{`COMMENT ON TABLE b IS 'ignored'`, nil},
		{`COMMENT ON PUBLICATION _zero_public_0 IS 'hook'`, nil},
		{`SELECT zero_0.update_schemas()`, nil},
		{`CREATE TABLE side.t (id int PRIMARY KEY)`, nil},
		{`ALTER TABLE b ADD CONSTRAINT b_v CHECK (v <> '')`, nil},
	} {
		got := step(tc.sql)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.sql, diff)
		}
	}

	// The setup a restart re-runs changes no schema.
	stop()
	e.run(t)
	if got := step(`INSERT INTO b VALUES (9, 'nine')`); len(got) != 1 || got[0] != `b insert new={"id":9,"v":"nine"}` {
		t.Errorf("after a restart: %q; want just the insert", got)
	}
	var ddlDetection bool
	if err := e.conn.QueryRow(context.Background(), `SELECT "ddlDetection" FROM zero_0."shardConfig"`).Scan(&ddlDetection); err != nil || !ddlDetection {
		t.Errorf("shardConfig ddlDetection = %v, %v", ddlDetection, err)
	}
}

// TestSource_DDLResync checks that a schema change zero-cache answers with a
// resync starts a new initial sync, which has the change.
func TestSource_DDLResync(t *testing.T) {
	for _, tc := range []struct{ name, sql string }{
		{"InvalidColumnName", `ALTER TABLE a RENAME COLUMN v TO "bad name"`},
		{"InvalidTableName", `CREATE TABLE "bad table" (id int PRIMARY KEY)`},
		{"ReservedColumn", `ALTER TABLE a ADD COLUMN _0_version text`},
		{"ReplicaIdentityNothing", `ALTER TABLE a REPLICA IDENTITY NOTHING`},
		{"BackfillWithoutKey", `CREATE TABLE side.k (v int); INSERT INTO side.k VALUES (1); ALTER PUBLICATION _zero_public_0 ADD TABLE side.k`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, `CREATE TABLE a (id int PRIMARY KEY, v text); INSERT INTO a VALUES (1, 'x'); CREATE SCHEMA side`)
			e.run(t)
			u := e.waitSynced(t, "")
			e.exec(t, tc.sql)
			u2 := e.waitSynced(t, u.ReplicaVersion)
			if u2.Slot == "" {
				t.Fatalf("no slot after the resync: %+v", u2)
			}
			ms := e.messages(t)
			reason := ""
			for _, m := range ms {
				if p := m.Parts[0]; p.Num == 0 && len(p.Changes) > 0 && p.Changes[0].Op == streams.OpReset && p.Watermark == u2.ReplicaVersion {
					reason = p.Changes[0].Reset.Reason
				}
			}
			if reason == "" {
				t.Errorf("no reset at %s in the stream", u2.ReplicaVersion)
			}
			t.Logf("reset reason: %s", reason)
		})
	}
}

// TestSource_DDLCopyOutlastsSenderTimeout holds a schema change's row copy
// (which runs in the replication reader, so no keepalive is answered
// meanwhile) for three times the walsender's wal_sender_timeout: the
// publisher's status updates must keep the session alive.
func TestSource_DDLCopyOutlastsSenderTimeout(t *testing.T) {
	e := newEnv(t, `
		CREATE TABLE marker (n serial PRIMARY KEY);
		CREATE TABLE a (id int PRIMARY KEY, v text);
		INSERT INTO a VALUES (1, 'x'), (2, 'y');
	`)
	e.url = withSenderTimeout(t, e.url, "1s")
	e.run(t)
	u := e.waitSynced(t, "")
	_, txs := transactions(t, e.messages(t))
	n := len(txs)
	ctx := context.Background()
	var pid int
	polltest.Until(t, 30*time.Second, "the walsender", func() bool { pid = e.walsender(t, u.Slot); return pid != 0 })

	// The schema change waits uncommitted while a locker queues for the
	// table: at the commit the locker is granted the table before the
	// copy can ask for it, and holds it for 3 s.
	ddl, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer ddl.Close(ctx)
	tx, err := ddl.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE a ADD COLUMN ts timestamptz NOT NULL DEFAULT now()`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO marker DEFAULT VALUES`); err != nil {
		t.Fatal(err)
	}
	locker, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	locked := make(chan error, 1)
	go func() {
		locked <- pgx.BeginFunc(ctx, locker, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `LOCK TABLE a IN ACCESS EXCLUSIVE MODE`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT pg_sleep(3)`)
			return err
		})
	}()
	polltest.Until(t, 30*time.Second, "the locker to queue", func() bool {
		var waiting bool
		err := e.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = 'a'::regclass AND NOT granted)`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	txs = e.waitTxs(t, n+1)
	if lines := ddlLines(txs[n]); !slices.Contains(lines, "a backfill [id v ts] rows=2") {
		t.Errorf("the schema change's transaction = %q; want a backfill of a's 2 rows", lines)
	}
	if got := e.walsender(t, u.Slot); got != pid {
		t.Errorf("walsender pid %d after the copy, %d before: the session was cut (wal_sender_timeout 1s)", got, pid)
	}
}
