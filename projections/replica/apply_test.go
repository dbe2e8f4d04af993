package replica_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	_ "modernc.org/sqlite"

	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func openDB(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "replica.db")+"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	if err := replica.Init(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

// recorder is a Collector that writes what it is told.
type recorder struct{ lines []string }

func (r *recorder) RowChanged(c replica.RowChange) {
	r.lines = append(r.lines, fmt.Sprintf("row %s key=%s old=%s new=%s", c.Table, fmtMap(c.Key), fmtMap(c.Old), fmtMap(c.New)))
}

func (r *recorder) TableChanged(table string) { r.lines = append(r.lines, "table "+table) }

func fmtMap(m map[string]any) string {
	if m == nil {
		return "nil"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":" + fmtValue(m[k])
	}
	return "{" + strings.Join(parts, " ") + "}"
}

func fmtValue(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case string:
		return fmt.Sprintf("%q", v)
	case []byte:
		return fmt.Sprintf("x%q", v)
	default:
		return fmt.Sprintf("%v(%T)", v, v)
	}
}

// transcript is a golden file: steps in, then "----", then the replica.
// A step is "<schema>.<table> <part JSON>" (or "tx <part JSON>"),
// "commit", or "rollback".
type transcript struct {
	steps []string
	want  string
}

func readTranscript(t *testing.T, path string) transcript {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	in, out, _ := strings.Cut(string(b), "----\n")
	var tr transcript
	sc := bufio.NewScanner(strings.NewReader(in))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if inc, ok := strings.CutPrefix(l, "include "); ok {
			tr.steps = append(tr.steps, readTranscript(t, filepath.Join(filepath.Dir(path), inc)).steps...)
			continue
		}
		tr.steps = append(tr.steps, l)
	}
	tr.want = out
	return tr
}

func TestApplier_Apply(t *testing.T) {
	files, err := filepath.Glob("testdata/apply/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			tr := readTranscript(t, f)
			got := run(t, tr.steps, true)
			if *update {
				b, _ := os.ReadFile(f)
				in, _, _ := strings.Cut(string(b), "----\n")
				if err := os.WriteFile(f, []byte(in+"----\n"+got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if diff := cmp.Diff(tr.want, got); diff != "" {
				t.Errorf("replica after %s differs (-want +got):\n%s", f, diff)
			}
			// Collecting must not change what is written.
			without := run(t, tr.steps, false)
			strip := func(s string) string { s, _, _ = strings.Cut(s, "-- changes\n"); return s }
			if diff := cmp.Diff(strip(got), strip(without)); diff != "" {
				t.Errorf("replica without a collector differs (-with +without):\n%s", diff)
			}
		})
	}
}

func run(t *testing.T, steps []string, collect bool) string {
	t.Helper()
	ctx := context.Background()
	db := openDB(t)
	a := replica.NewApplier(db)
	rec := &recorder{}
	if collect {
		a.Collector = rec
	}
	var tx *sql.Tx
	begin := func() {
		if tx == nil {
			var err error
			if tx, err = db.BeginTx(ctx, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, s := range steps {
		switch s {
		case "commit":
			begin()
			if err := a.Flush(ctx, tx); err != nil {
				t.Fatalf("Flush: %v", err)
			}
			if err := a.Commit(tx); err != nil {
				t.Fatal(err)
			}
			tx = nil
			rec.lines = append(rec.lines, "commit")
			continue
		case "rollback":
			if tx != nil {
				tx.Rollback()
				tx = nil
			}
			a.Discard()
			rec.lines = append(rec.lines, "rollback")
			continue
		}
		target, body, _ := strings.Cut(s, " ")
		var schema, table string
		if target != "tx" {
			schema, table, _ = strings.Cut(target, ".")
		}
		var p streams.Part
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatalf("step %q: %v", s, err)
		}
		m := streams.Message{Schema: schema, Table: table, Parts: []streams.Part{p}}
		if err := m.Validate(); err != nil {
			t.Fatalf("step %q: %v", s, err)
		}
		begin()
		if err := a.Apply(ctx, tx, schema, table, &p); err != nil {
			rec.lines = append(rec.lines, "error "+err.Error())
			tx.Rollback()
			tx = nil
			a.Discard()
		}
	}
	if tx != nil {
		t.Fatal("transcript ends inside a transaction")
	}
	var b strings.Builder
	dump(t, db, &b)
	if collect {
		b.WriteString("-- changes\n")
		for _, l := range rec.lines {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// dump writes the whole database: schema, then every table's rows.
func dump(t *testing.T, db *sql.DB, b *strings.Builder) {
	t.Helper()
	ctx := context.Background()
	rows, err := db.QueryContext(ctx, `SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE '\_zero.%' ESCAPE '\' AND name NOT LIKE '\_jetsync.%' ESCAPE '\' ORDER BY tbl_name, type DESC, name`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	b.WriteString("-- schema\n")
	for rows.Next() {
		var typ, name, q string
		if err := rows.Scan(&typ, &name, &q); err != nil {
			t.Fatal(err)
		}
		b.WriteString(q + "\n")
		if typ == "table" {
			tables = append(tables, name)
		}
	}
	rows.Close()
	st, err := replica.LoadState(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(b, "-- state\n%+v\n", st)
	for _, tb := range append(tables, replica.ColumnMetadataTable, replica.TableMetadataTable, replica.TablesTable) {
		fmt.Fprintf(b, "-- %s\n", tb)
		rows, err := db.QueryContext(ctx, "SELECT * FROM \""+tb+"\"")
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		var lines []string
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			parts := make([]string, len(cols))
			for i, c := range cols {
				parts[i] = c + ":" + fmtValue(vals[i])
			}
			lines = append(lines, strings.Join(parts, " "))
		}
		rows.Close()
		slices.Sort(lines)
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
	}
}

func TestLiteType(t *testing.T) {
	for _, tc := range []struct {
		in   streams.ColumnSpec
		want string
	}{
		{streams.ColumnSpec{DataType: "int8", NotNull: true}, "int8|NOT_NULL"},
		{streams.ColumnSpec{DataType: "mood[]", Enum: true, Array: true}, "mood[]|TEXT_ENUM|TEXT_ARRAY"},
		{streams.ColumnSpec{DataType: "text"}, "text"},
	} {
		if got := replica.LiteType(tc.in); got != tc.want {
			t.Errorf("LiteType(%+v) = %q; want %q", tc.in, got, tc.want)
		}
	}
	if got := replica.TableName("public", "issue"); got != "issue" {
		t.Errorf("TableName(public, issue) = %q", got)
	}
	if got := replica.TableName("zero_0", "clients"); got != "zero_0.clients" {
		t.Errorf("TableName(zero_0, clients) = %q", got)
	}
}

func TestWipe(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	run := func(f func(tx *sql.Tx) error) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := f(tx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	a := replica.NewApplier(db)
	run(func(tx *sql.Tx) error {
		p := initialSync("0a", 3)
		for i := range p.parts {
			if err := a.Apply(ctx, tx, p.schema[i], p.table[i], &p.parts[i]); err != nil {
				return err
			}
		}
		if err := a.Flush(ctx, tx); err != nil {
			return err
		}
		return replica.SaveProgress(ctx, tx, replica.State{Watermark: "0a", StreamSeq: 7, ResetSeq: 2})
	})
	st, err := replica.LoadState(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	want := replica.State{ReplicaVersion: "0a", Publications: []string{"p"}, Watermark: "0a", StreamSeq: 7, ResetSeq: 2}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("LoadState (-want +got):\n%s", diff)
	}
	run(func(tx *sql.Tx) error { return replica.Wipe(ctx, tx) })
	a.Discard()
	if st, err := replica.LoadState(ctx, db); err != nil || st.ReplicaVersion != "" || st.StreamSeq != 0 {
		t.Errorf("LoadState after Wipe = %+v, %v; want zero", st, err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'item'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("table item survives Wipe (%d, %v)", n, err)
	}
}
