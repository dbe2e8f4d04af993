package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/projections/replica"
)

// ddlSchema adds, to the spine's tables, tables that schema changes act on
// while the workload runs.
const ddlSchema = spineSchema + `
INSERT INTO every (id, t, i4) SELECT g, 'seed ' || g, g FROM generate_series(1, 200) g;
CREATE TABLE scratch (id int8 PRIMARY KEY, v text);
CREATE SCHEMA side;
CREATE TABLE side.joined (id int8 PRIMARY KEY, v text, n int4);
CREATE TABLE side.leaving (id int8 PRIMARY KEY, v text);
INSERT INTO side.joined SELECT g, 'j' || g, g FROM generate_series(1, 50) g;
INSERT INTO side.leaving SELECT g, 'l' || g FROM generate_series(1, 20) g;
`

// sideWriter writes, until stopped, to the tables and columns the schema
// changes create, rename and drop. Statements on what does not exist (yet,
// or any more) fail, and are ignored: they change nothing.
type sideWriter struct {
	ok, failed atomic.Int64
	stop       func()
	done       chan struct{}
}

func startSideWriter(t *testing.T, url string) *sideWriter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	w := &sideWriter{done: make(chan struct{})}
	var once sync.Once
	w.stop = func() { once.Do(func() { cancel(); <-w.done }) }
	t.Cleanup(w.stop)
	stmts := []string{
		`UPDATE every SET extra_i = $1 WHERE id = 1 + $1 % 200`,
		`UPDATE every SET extra_t = 't' || $1 WHERE id = 1 + $1 % 200`,
		`UPDATE every SET extra_t2 = 'u' || $1 WHERE id = 1 + $1 % 200`,
		`INSERT INTO scratch VALUES ($1 % 30, 's' || $1) ON CONFLICT (id) DO UPDATE SET v = excluded.v`,
		`DELETE FROM scratch WHERE id = $1 % 30`,
		`INSERT INTO newtab VALUES ($1 % 40, 'n' || $1) ON CONFLICT (id) DO UPDATE SET v = excluded.v`,
		`INSERT INTO renamed VALUES ($1 % 40, 'r' || $1) ON CONFLICT (id) DO UPDATE SET v = excluded.v`,
		`DELETE FROM renamed WHERE id = $1 % 40`,
		`INSERT INTO side.joined VALUES ($1 % 80, 'j' || $1, $1) ON CONFLICT (id) DO UPDATE SET v = excluded.v, n = excluded.n`,
		`DELETE FROM side.joined WHERE id = $1 % 80`,
		`UPDATE side.leaving SET v = 'l' || $1 WHERE id = $1 % 20`,
		`INSERT INTO side.late VALUES ($1 % 50, 'late' || $1) ON CONFLICT (id) DO UPDATE SET v = excluded.v`,
		`DELETE FROM side.late WHERE id = $1 % 50`,
	}
	go func() {
		defer close(w.done)
		defer conn.Close(context.Background())
		r := rand.New(rand.NewPCG(7, 7))
		for ctx.Err() == nil {
			_, err := conn.Exec(ctx, stmts[r.IntN(len(stmts))], r.Int64N(1_000_000))
			if err != nil {
				w.failed.Add(1)
			} else {
				w.ok.Add(1)
			}
		}
	}()
	return w
}

// liveWorkload runs the spine's random workload on every, pair and txlog
// until stopped.
type liveWorkload struct {
	txs, errs atomic.Int64
	stop      func()
	done      chan struct{}
}

func startLiveWorkload(t *testing.T, url string) *liveWorkload {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	lw := &liveWorkload{done: make(chan struct{})}
	var once sync.Once
	lw.stop = func() { once.Do(func() { cancel(); <-lw.done }) }
	t.Cleanup(lw.stop)
	w := newWorkload(1, 1_000_000)
	for id := int64(1); id <= 200; id++ {
		w.ids = append(w.ids, id)
	}
	go func() {
		defer close(lw.done)
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			if err := w.tx(ctx, conn, false); err != nil {
				lw.errs.Add(1)
				continue
			}
			lw.txs.Add(1)
		}
	}()
	return lw
}

// progress waits until the workload has committed n more transactions, so
// that schema changes interleave with it.
func (lw *liveWorkload) progress(t *testing.T, n int64) {
	t.Helper()
	from := lw.txs.Load()
	polltest.Until(t, time.Minute, "the workload to go on", func() bool { return lw.txs.Load() >= from+n })
}

func TestSpine_DDL(t *testing.T) {
	s := startSpine(t, ddlSchema)
	ctx := context.Background()
	s.waitCaughtUp(time.Minute)
	sub := s.rep.Subscribe()
	defer sub.Close()
	var resets atomic.Int64
	go func() {
		for {
			u, err := sub.Next(context.Background())
			if err != nil {
				return
			}
			if u.Reset {
				resets.Add(1)
			}
		}
	}()
	rv := s.rep.State().ReplicaVersion

	lw := startLiveWorkload(t, s.url)
	sw := startSideWriter(t, s.url)
	for _, ddl := range []string{
		`ALTER TABLE every ADD COLUMN extra_i int4 DEFAULT 7`,
		`ALTER TABLE every ADD COLUMN extra_t text`,
		// A default only Postgres can compute: the rows are copied again.
		`ALTER TABLE every ADD COLUMN extra_ts timestamptz NOT NULL DEFAULT now()`,
		`ALTER TABLE every RENAME COLUMN extra_t TO extra_t2`,
		`ALTER TABLE every ALTER COLUMN extra_i TYPE int8`,
		`CREATE INDEX every_extra ON every (extra_i, extra_t2 DESC)`,
		`CREATE INDEX every_i4 ON every (i4)`,
		`DROP INDEX every_extra`,
		`ALTER TABLE every DROP COLUMN extra_ts`,
		`CREATE TABLE newtab (id int8 PRIMARY KEY, v text)`,
		`CREATE TABLE renamed_from (id int8 PRIMARY KEY, v varchar(20))`,
		`ALTER TABLE renamed_from RENAME TO renamed`,
		`CREATE INDEX renamed_v ON renamed (v)`,
		`ALTER PUBLICATION _zero_public_0 ADD TABLE side.joined, side.leaving`,
		`CREATE TABLE side.late (id int8 PRIMARY KEY, v text); INSERT INTO side.late SELECT g, 'late' || g FROM generate_series(1, 30) g`,
		`ALTER PUBLICATION _zero_public_0 ADD TABLE side.late`,
		`ALTER TABLE side.joined ADD COLUMN w text DEFAULT 'it''s'`,
		`DROP TABLE scratch`,
		`ALTER PUBLICATION _zero_public_0 DROP TABLE side.leaving`,
		`ALTER TABLE side.joined DROP COLUMN n`,
	} {
		lw.progress(t, 20)
		if _, err := s.pg.Exec(ctx, ddl); err != nil {
			t.Fatalf("%s: %v", ddl, err)
		}
	}
	lw.progress(t, 50)
	lw.stop()
	sw.stop()
	if n := lw.errs.Load(); n > lw.txs.Load()/10 {
		t.Errorf("%d workload transactions failed, %d committed", n, lw.txs.Load())
	}
	if sw.ok.Load() < 100 {
		t.Errorf("the side writer made only %d changes", sw.ok.Load())
	}
	s.waitCaughtUp(2 * time.Minute)

	if got := s.rep.State().ReplicaVersion; got != rv {
		t.Errorf("replica version %s; want %s: no schema change here needs a resync", got, rv)
	}
	if resets.Load() == 0 {
		t.Error("the subscription never reported a reset after schema changes")
	}
	s.checkReplicaEqualsPostgres()
	s.checkSchemaEqualsPostgres()
	s.checkTableEqualsPostgres("every", `SELECT id, extra_i, extra_t2 FROM every`, []string{"id"})
	s.checkTableEqualsPostgres("newtab", `SELECT * FROM newtab`, []string{"id"})
	s.checkTableEqualsPostgres("renamed", `SELECT * FROM renamed`, []string{"id"})
	s.checkTableEqualsPostgres("side.joined", `SELECT * FROM side.joined`, []string{"id"})
	s.checkTableEqualsPostgres("side.late", `SELECT * FROM side.late`, []string{"id"})
}

// TestSpine_DDLResync checks a schema change that zero-cache answers with
// a resync: a column renamed to a name zero-cache rejects. The replica is
// rebuilt from a new initial sync and ends equal to Postgres.
func TestSpine_DDLResync(t *testing.T) {
	s := startSpine(t, ddlSchema)
	ctx := context.Background()
	s.waitCaughtUp(time.Minute)
	rv := s.rep.State().ReplicaVersion
	lw := startLiveWorkload(t, s.url)
	lw.progress(t, 30)
	if _, err := s.pg.Exec(ctx, `ALTER TABLE scratch RENAME COLUMN v TO "bad name"`); err != nil {
		t.Fatal(err)
	}
	lw.progress(t, 30)
	if _, err := s.pg.Exec(ctx, `INSERT INTO scratch VALUES (1, 'after')`); err != nil {
		t.Fatal(err)
	}
	lw.stop()
	polltest.Until(t, 2*time.Minute, "a new replica version", func() bool { return s.rep.State().ReplicaVersion != rv })
	s.waitCaughtUp(2 * time.Minute)
	s.checkReplicaEqualsPostgres()
	s.checkSchemaEqualsPostgres()
	s.checkTableEqualsPostgres("scratch", `SELECT * FROM scratch`, []string{"id"})
}

// checkSchemaEqualsPostgres compares the replica's user tables with the
// published tables upstream: names, columns with the declared types the
// replica gives them (docs/replica.md §2), and indexes.
func (s *spine) checkSchemaEqualsPostgres() {
	t := s.t
	t.Helper()
	ctx := context.Background()
	want := map[string][]string{}
	rows, err := s.pg.Query(ctx, `
		SELECT DISTINCT pt.schemaname::text, pt.tablename::text, c.oid::int8
		FROM pg_publication_tables pt
		JOIN pg_namespace n ON n.nspname = pt.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pt.pubname IN (SELECT unnest(publications) FROM zero_0."shardConfig")`)
	if err != nil {
		t.Fatal(err)
	}
	type tbl struct {
		name string
		oid  int64
	}
	var tables []tbl
	for rows.Next() {
		var schema, name string
		var oid int64
		if err := rows.Scan(&schema, &name, &oid); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, tbl{replica.TableName(schema, name), oid})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		var lines []string
		rows, err := s.pg.Query(ctx, `
			SELECT a.attname::text, a.attnotnull, a.atttypmod, t.typname::text, t.typtype::text,
				coalesce(et.typname::text, ''), coalesce(et.typtype::text, '')
			FROM pg_attribute a
			JOIN pg_type t ON t.oid = a.atttypid
			LEFT JOIN pg_type et ON et.oid = t.typelem AND t.typcategory = 'A'
			WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, tb.oid)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var name, typ, typtype, elem, elemtype string
			var notNull bool
			var typmod int
			if err := rows.Scan(&name, &notNull, &typmod, &typ, &typtype, &elem, &elemtype); err != nil {
				t.Fatal(err)
			}
			lite := typ
			if elem != "" {
				lite = elem + "[]"
			}
			if notNull {
				lite += "|NOT_NULL"
			}
			if typtype == "e" || elemtype == "e" {
				lite += "|TEXT_ENUM"
			}
			if elem != "" {
				lite += "|TEXT_ARRAY"
			}
			lite = strings.ToLower(lite)
			if (typ == "varchar" || typ == "bpchar") && typmod > 4 {
				lite += fmt.Sprintf("(%d)", typmod-4)
			}
			lines = append(lines, "column "+name+" "+lite)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows, err = s.pg.Query(ctx, `
			SELECT n.nspname::text, ic.relname::text, i.indisunique,
				array(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)
					JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o),
				array(SELECT (o & 1) = 1 FROM unnest(i.indoption::int2[]) o)
			FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_namespace n ON n.oid = ic.relnamespace
			WHERE i.indrelid = $1 AND i.indpred IS NULL AND i.indexprs IS NULL`, tb.oid)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var schema, name string
			var unique bool
			var cols []string
			var desc []bool
			if err := rows.Scan(&schema, &name, &unique, &cols, &desc); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, indexLine(replica.TableName(schema, name), unique, cols, desc))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(lines)
		want[tb.name] = lines
	}

	db := s.openReplica()
	defer db.Close()
	got := map[string][]string{}
	trows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\_zero.%' ESCAPE '\' AND name NOT LIKE '\_jetsync.%' ESCAPE '\' AND name NOT LIKE 'sqlite\_%' ESCAPE '\'`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for trows.Next() {
		var n string
		if err := trows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	trows.Close()
	for _, n := range names {
		var lines []string
		// SQLite reports a quoted type name's case and length its own
		// way; the length is in the column metadata.
		crows, err := db.Query(`SELECT ti.name, ti.type, cm.character_max_length FROM pragma_table_info(?) ti
			LEFT JOIN "_zero.column_metadata" cm ON cm.table_name = ? AND cm.column_name = ti.name`, n, n)
		if err != nil {
			t.Fatal(err)
		}
		for crows.Next() {
			var name, typ string
			var maxLen sql.NullInt64
			if err := crows.Scan(&name, &typ, &maxLen); err != nil {
				t.Fatal(err)
			}
			if name == replica.VersionColumn {
				continue
			}
			typ = strings.ToLower(strings.ReplaceAll(typ, `"`, ""))
			if i := strings.IndexByte(typ, '('); i >= 0 {
				typ = typ[:i]
			}
			if maxLen.Valid {
				typ += fmt.Sprintf("(%d)", maxLen.Int64)
			}
			lines = append(lines, "column "+name+" "+typ)
		}
		crows.Close()
		irows, err := db.Query(`SELECT name, "unique" FROM pragma_index_list(?)`, n)
		if err != nil {
			t.Fatal(err)
		}
		type idx struct {
			name   string
			unique bool
		}
		var idxs []idx
		for irows.Next() {
			var x idx
			if err := irows.Scan(&x.name, &x.unique); err != nil {
				t.Fatal(err)
			}
			idxs = append(idxs, x)
		}
		irows.Close()
		for _, x := range idxs {
			var cols []string
			var desc []bool
			xrows, err := db.Query(`SELECT name, "desc" FROM pragma_index_xinfo(?) WHERE key = 1 ORDER BY seqno`, x.name)
			if err != nil {
				t.Fatal(err)
			}
			for xrows.Next() {
				var c string
				var d bool
				if err := xrows.Scan(&c, &d); err != nil {
					t.Fatal(err)
				}
				cols, desc = append(cols, c), append(desc, d)
			}
			xrows.Close()
			lines = append(lines, indexLine(x.name, x.unique, cols, desc))
		}
		slices.Sort(lines)
		got[n] = lines
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("table %s is missing from the replica", name)
			continue
		}
		if !slices.Equal(g, w) {
			t.Errorf("table %s: replica schema\n\t%s\nPostgres\n\t%s", name, strings.Join(g, "\n\t"), strings.Join(w, "\n\t"))
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("the replica has table %s, which Postgres does not publish", name)
		}
	}
}

func indexLine(name string, unique bool, cols []string, desc []bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "index %s unique=%v (", name, unique)
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c)
		if i < len(desc) && desc[i] {
			b.WriteString(" DESC")
		}
	}
	b.WriteString(")")
	return b.String()
}

// checkTableEqualsPostgres compares the columns query selects from one
// table, row for row. The columns must hold numbers or text.
func (s *spine) checkTableEqualsPostgres(table, query string, pk []string) {
	s.t.Helper()
	db := s.openReplica()
	defer db.Close()
	s.compareTable(db, table, query, pk, nil)
}
