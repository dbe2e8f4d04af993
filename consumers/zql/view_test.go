package zql

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tableRows reads every row of the bench tables in replica storage form,
// by table and primary key.
func tableRows(t testing.TB, q Querier) map[string]map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]map[string]any{}
	for name, ts := range benchSchema.Tables {
		rows, err := q.QueryContext(context.Background(), "SELECT * FROM "+quoteIdent(name))
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		out[name] = map[string]map[string]any{}
		for rows.Next() {
			raw := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range raw {
				ptrs[i] = &raw[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			m := map[string]any{}
			for i, c := range cols {
				if b, ok := raw[i].([]byte); ok {
					raw[i] = string(b)
				}
				m[c] = raw[i]
			}
			var pk []string
			for _, k := range ts.PrimaryKey {
				pk = append(pk, fmt.Sprint(m[k]))
			}
			out[name][strings.Join(pk, "/")] = m
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	return out
}

// changesBetween lists the rows that differ, as the replica reports them.
func changesBetween(before, after map[string]map[string]map[string]any) []Change {
	var out []Change
	for _, table := range slices.Sorted(maps.Keys(after)) {
		b, a := before[table], after[table]
		keys := map[string]bool{}
		for k := range b {
			keys[k] = true
		}
		for k := range a {
			keys[k] = true
		}
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			if reflect.DeepEqual(b[k], a[k]) {
				continue
			}
			out = append(out, Change{Table: table, Old: b[k], New: a[k]})
		}
	}
	return out
}

// sameRows compares two results by table, key and values.
func sameRows(a, b *Result) string {
	flat := func(r *Result) map[string]string {
		m := map[string]string{}
		for table, rows := range r.Rows {
			for _, row := range rows {
				m[table+" "+pkString(table, row)] = fmt.Sprint(row)
			}
		}
		for table, rows := range r.Values {
			for _, v := range rows {
				row := v.Row()
				m[table+" "+pkString(table, row)] = fmt.Sprint(row)
			}
		}
		return m
	}
	fa, fb := flat(a), flat(b)
	var d []string
	for k, v := range fa {
		if w, ok := fb[k]; !ok {
			d = append(d, "extra "+k)
		} else if v != w {
			d = append(d, fmt.Sprintf("%s = %s; want %s", k, v, w))
		}
	}
	for k := range fb {
		if _, ok := fa[k]; !ok {
			d = append(d, "missing "+k)
		}
	}
	sort.Strings(d)
	if len(d) > 8 {
		d = append(d[:8], "…")
	}
	return strings.Join(d, "; ")
}

// applyDiff returns prev with d applied.
func applyDiff(prev *Result, d *Diff) *Result {
	m := map[string]map[string]Row{}
	put := func(table string, row Row) {
		if m[table] == nil {
			m[table] = map[string]Row{}
		}
		m[table][pkString(table, row)] = row
	}
	for table, rows := range prev.Rows {
		for _, r := range rows {
			put(table, r)
		}
	}
	for table, rows := range prev.Values {
		for _, r := range rows {
			put(table, r.Row())
		}
	}
	for table, rows := range d.Put.Values {
		for _, r := range rows {
			put(table, r.Row())
		}
	}
	for table, rows := range d.Del {
		for _, r := range rows {
			delete(m[table], pkString(table, r.Row()))
		}
	}
	out := &Result{Rows: map[string][]Row{}}
	for table, rows := range m {
		for _, r := range rows {
			out.Rows[table] = append(out.Rows[table], r)
		}
	}
	return out
}

// TestView_IncrementalCorpus runs each scenario of incremental.jsonl
// through View.Update: the view hydrates before, follows the scenario's row
// changes, and must then hold what zero-cache synced after it, with a diff
// that turns the old result into the new.
func TestView_IncrementalCorpus(t *testing.T) {
	recs := loadIncremental(t)
	db := seedReplica(t, 1000, 2, true)
	ctx := context.Background()
	var rehydrated []string
	for _, rec := range recs {
		t.Run(rec.ID, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			ast, err := ParseAST(rec.AST)
			if err != nil {
				t.Fatal(err)
			}
			q, err := Compile(benchSchema, ast)
			if err != nil {
				t.Fatal(err)
			}
			v := q.NewView()
			before, err := v.Hydrate(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkResult(before, hydrateRecord{ID: rec.ID, Rows: rec.Before}); err != nil {
				t.Fatalf("before: %v\n  zql: %s", err, rec.ZQL)
			}
			old := tableRows(t, tx)
			if err := execScenario(ctx, tx, rec.SQL); err != nil {
				t.Fatal(err)
			}
			d, err := v.Update(ctx, tx, changesBetween(old, tableRows(t, tx)))
			if err != nil {
				t.Fatal(err)
			}
			if d.Rehydrated {
				rehydrated = append(rehydrated, rec.ID)
			}
			after := v.Result()
			want := hydrateRecord{ID: rec.ID, Rows: applyChanges(rec), versionless: true}
			if err := checkResult(after, want); err != nil {
				t.Errorf("after %s: %v\n  zql: %s", rec.SQL, err, rec.ZQL)
			}
			if diff := sameRows(applyDiff(before, d), after); diff != "" {
				t.Errorf("before + diff != after: %s", diff)
			}
			fresh, err := q.Hydrate(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := sameRows(after, fresh); diff != "" {
				t.Errorf("view != fresh hydration: %s", diff)
			}
		})
	}
	if len(rehydrated) > 0 {
		t.Errorf("%d/%d scenarios re-hydrated instead of updating: %v", len(rehydrated), len(recs), rehydrated)
	}
}

// TestView_Random applies random changes and checks after each step that
// the view equals a fresh hydration and that its diff turns the previous
// result into the new one.
func TestView_Random(t *testing.T) {
	shapes := []struct{ name, ast string }{
		{"LimitOrderBy", `{"table":"issue","orderBy":[["modified","desc"]],"limit":7}`},
		{"LimitOrderByAscWhere", `{"table":"issue","where":` + simpleJSON("open", "=", "true") + `,"orderBy":[["owner_id","asc"],["created","desc"]],"limit":9}`},
		{"StartCursor", `{"table":"issue","orderBy":[["modified","asc"]],"start":{"row":{"modified":400000000,"id":"i0000010"},"exclusive":true},"limit":5}`},
		{"WhereOrNot", `{"table":"issue","where":{"type":"or","conditions":[` + simpleJSON("owner_id", "=", `"u000003"`) + `,{"type":"and","conditions":[` +
			simpleJSON("open", "!=", "true") + `,` + simpleJSON("title", "NOT LIKE", `"Issue 1%"`) + `]}]},"orderBy":[["modified","desc"]],"limit":10}`},
		{"NoLimit", `{"table":"issue","where":` + simpleJSON("owner_id", "IN", `["u000001","u000002"]`) + `}`},
		{"RelatedPerParentLimit", `{"table":"issue","orderBy":[["modified","desc"]],"limit":6,"related":[
			{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","desc"]],"limit":2}},
			{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"}},
			{"correlation":{"parentField":["id"],"childField":["issue_id"]},"hidden":true,"subquery":{"table":"issue_label","alias":"labels","related":[
				{"correlation":{"parentField":["label_id"],"childField":["id"]},"subquery":{"table":"label","alias":"labels"}}]}}]}`},
		{"Exists", `{"table":"issue","where":{"type":"and","conditions":[` + simpleJSON("open", "=", "true") + `,
			{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},
				"subquery":{"table":"comment","alias":"zsubq_comments","where":` + simpleJSON("body", "LIKE", `"%hot%"`) + `}}}]},"orderBy":[["created","desc"]],"limit":20}`},
		{"NotExistsNested", `{"table":"issue","where":{"type":"correlatedSubquery","op":"NOT EXISTS","related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},
			"subquery":{"table":"issue_label","alias":"zsubq_labels","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["label_id"],"childField":["id"]},
				"subquery":{"table":"label","alias":"zsubq_label","where":` + simpleJSON("name", "=", `"label-3"`) + `}}}}}},"orderBy":[["modified","asc"]],"limit":8}`},
		{"ExistsOwnerRelatedComments", `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["owner_id"],"childField":["id"]},
			"subquery":{"table":"user","alias":"zsubq_owner","where":` + simpleJSON("name", "LIKE", `"User 1%"`) + `}}},"orderBy":[["id","desc"]],"limit":4,
			"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","limit":1}}]}`},
		{"ScalarOwner", `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","scalar":true,"related":{"correlation":{"parentField":["owner_id"],"childField":["id"]},
			"subquery":{"table":"user","alias":"owner","where":` + simpleJSON("id", "=", `"u000002"`) + `}}},"orderBy":[["modified","asc"]],"limit":3}`},
	}
	for i, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			// Fixed seeds keep make test deterministic (a random one once
			// drew a run whose changes barely touched a cursor window);
			// JETSYNC_VIEW_SEED explores others.
			seed := uint64(i + 1)
			if v := os.Getenv("JETSYNC_VIEW_SEED"); v != "" {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					t.Fatalf("JETSYNC_VIEW_SEED: %v", err)
				}
				seed = n
			}
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 1))
			db := seedReplica(t, 60, 2, true)
			ctx := context.Background()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			ast, err := ParseAST([]byte(sh.ast))
			if err != nil {
				t.Fatal(err)
			}
			q, err := Compile(benchSchema, ast)
			if err != nil {
				t.Fatal(err)
			}
			v := q.NewView()
			prev, err := v.Hydrate(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			rehydrated, changed := 0, 0
			for step := range 120 {
				old := tableRows(t, tx)
				var stmts []string
				for range 1 + rng.IntN(3) {
					s := randomChange(rng)
					stmts = append(stmts, s)
					if _, err := tx.ExecContext(ctx, s); err != nil {
						t.Fatalf("%s: %v", s, err)
					}
				}
				d, err := v.Update(ctx, tx, changesBetween(old, tableRows(t, tx)))
				if err != nil {
					t.Fatal(err)
				}
				if d.Rehydrated {
					rehydrated++
				}
				if len(d.Del) > 0 || len(d.Put.Values) > 0 {
					changed++
				}
				got := v.Result()
				fresh, err := q.Hydrate(ctx, tx)
				if err != nil {
					t.Fatal(err)
				}
				if diff := sameRows(got, fresh); diff != "" {
					t.Fatalf("step %d (%s): view != fresh hydration: %s", step, strings.Join(stmts, "; "), diff)
				}
				if diff := sameRows(applyDiff(prev, d), got); diff != "" {
					t.Fatalf("step %d (%s): previous + diff != view: %s", step, strings.Join(stmts, "; "), diff)
				}
				prev = got
			}
			if rehydrated > 0 {
				t.Errorf("%d steps re-hydrated", rehydrated)
			}
			t.Logf("%d/120 steps changed the result", changed)
			if changed < 3 {
				t.Errorf("only %d/120 steps changed the result; want a test that does", changed)
			}
		})
	}
}

func simpleJSON(col, op, lit string) string {
	return `{"type":"simple","left":{"type":"column","name":"` + col + `"},"op":"` + op + `","right":{"type":"literal","value":` + lit + `}}`
}

var randomVersion int

// randomChange is one random insert, update or delete on the small seeded
// dataset (60 issues, 10 users, 20 labels).
func randomChange(rng *rand.Rand) string {
	randomVersion++
	ver := fmt.Sprintf("'v%06d'", randomVersion)
	issue := func() string { return fmt.Sprintf("'i%07d'", 1+rng.IntN(70)) }
	user := func() string { return fmt.Sprintf("'u%06d'", 1+rng.IntN(12)) }
	label := func() string { return fmt.Sprintf("'l%02d'", 1+rng.IntN(20)) }
	words := []string{"hot", "cold", "Issue 1x", "Issue 2y", "User 1z", "User 3", "label-3", "label-4"}
	word := func() string { return "'" + words[rng.IntN(len(words))] + "'" }
	body := func() string { return []string{"'hot'", "'cold'"}[rng.IntN(2)] }
	switch rng.IntN(12) {
	case 0:
		return fmt.Sprintf(`INSERT OR REPLACE INTO issue VALUES (%s, %s, %d, %d, %s, %d, %s)`,
			issue(), word(), rng.IntN(2), rng.IntN(1000000000), user(), rng.IntN(1000000), ver)
	case 1:
		return fmt.Sprintf(`UPDATE issue SET modified = %d, _0_version = %s WHERE id = %s`, rng.IntN(1000000000), ver, issue())
	case 2:
		return fmt.Sprintf(`UPDATE issue SET open = NOT open, title = %s, _0_version = %s WHERE id = %s`, word(), ver, issue())
	case 3:
		return fmt.Sprintf(`UPDATE issue SET owner_id = %s, created = %d, _0_version = %s WHERE id = %s`, user(), rng.IntN(1000000), ver, issue())
	case 4:
		return `DELETE FROM issue WHERE id = ` + issue()
	case 5:
		return fmt.Sprintf(`INSERT OR REPLACE INTO comment VALUES ('c%d', %s, %s, %d, %s)`, rng.IntN(40), issue(), body(), rng.IntN(1000000), ver)
	case 6:
		return fmt.Sprintf(`UPDATE comment SET body = %s, _0_version = %s WHERE id IN (SELECT id FROM comment ORDER BY random() LIMIT 1)`, body(), ver)
	case 7:
		return `DELETE FROM comment WHERE id IN (SELECT id FROM comment ORDER BY random() LIMIT 1)`
	case 8:
		return fmt.Sprintf(`INSERT OR REPLACE INTO user VALUES (%s, %s, %s)`, user(), word(), ver)
	case 9:
		return fmt.Sprintf(`INSERT OR REPLACE INTO label VALUES (%s, %s, %s)`, label(), word(), ver)
	case 10:
		return fmt.Sprintf(`INSERT OR IGNORE INTO issue_label VALUES (%s, %s, %s)`, issue(), label(), ver)
	default:
		return `DELETE FROM issue_label WHERE rowid IN (SELECT rowid FROM issue_label ORDER BY random() LIMIT 1)`
	}
}

// TestView_BoundedWork is the issue's acceptance test: one issue update
// under "issue where open order by modified limit 50" on 100,000 issues
// reads at most 1,000 rows, however the row moves.
func TestView_BoundedWork(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds 100,000 issues")
	}
	db := seedIssues(t, 100000)
	ctx := context.Background()
	ast, err := ParseAST([]byte(`{"table":"issue","where":` + simpleJSON("open", "=", "true") + `,"orderBy":[["modified","asc"]],"limit":50}`))
	if err != nil {
		t.Fatal(err)
	}
	q, err := Compile(benchSchema, ast)
	if err != nil {
		t.Fatal(err)
	}
	v := q.NewView()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	res, err := v.Hydrate(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	first := res.Values["issue"][0].Get("id").(string)
	for _, tc := range []struct{ name, set, id string }{
		{"LeavesWindow", "modified = 1e15", first},
		{"Closes", "open = 0", res.Values["issue"][1].Get("id").(string)},
		{"EntersWindow", "modified = 0, open = 1", "i0099999"},
		{"MovesWithin", "modified = 1", res.Values["issue"][10].Get("id").(string)},
		{"OutsideWindow", "modified = modified + 1", "i0050000"},
		{"Deleted", "", res.Values["issue"][3].Get("id").(string)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := readIssue(t, tx, tc.id)
			stmt := "UPDATE issue SET " + tc.set + ", _0_version = 'x' WHERE id = ?"
			if tc.set == "" {
				stmt = "DELETE FROM issue WHERE id = ?"
			}
			if _, err := tx.ExecContext(ctx, stmt, tc.id); err != nil {
				t.Fatal(err)
			}
			c := Change{Table: "issue", Old: old, New: readIssue(t, tx, tc.id)}
			start := time.Now()
			d, err := v.Update(ctx, tx, []Change{c})
			if err != nil {
				t.Fatal(err)
			}
			elapsed := time.Since(start)
			t.Logf("rows read %d in %v", d.RowsRead, elapsed)
			if d.RowsRead > 1000 || d.Rehydrated {
				t.Errorf("Update read %d rows (rehydrated %v); want at most 1,000", d.RowsRead, d.Rehydrated)
			}
			fresh, err := q.Hydrate(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := sameRows(v.Result(), fresh); diff != "" {
				t.Errorf("view != fresh hydration: %s", diff)
			}
			if tc.name == "LeavesWindow" {
				start := time.Now()
				if _, err := q.Hydrate(ctx, tx); err != nil {
					t.Fatal(err)
				}
				t.Logf("full re-hydration: %d rows read in %v", fresh.RowsRead, time.Since(start))
			}
		})
	}
}

func readIssue(t testing.TB, tx *sql.Tx, id string) map[string]any {
	t.Helper()
	var title, owner, ver sql.NullString
	var open, modified, created any
	err := tx.QueryRow(`SELECT title, open, modified, owner_id, created, _0_version FROM issue WHERE id = ?`, id).
		Scan(&title, &open, &modified, &owner, &created, &ver)
	if err == sql.ErrNoRows {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{"id": id, "title": title.String, "open": open, "modified": modified, "created": created, "_0_version": ver.String}
	if owner.Valid {
		m["owner_id"] = owner.String
	} else {
		m["owner_id"] = nil
	}
	return m
}

// seedIssues writes only the issue table (with its secondary indexes) of
// the bench dataset, which is all the bounded-work query reads.
func seedIssues(tb testing.TB, issues int) *sql.DB {
	tb.Helper()
	db := seedReplica(tb, 0, 0, true)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer tx.Rollback()
	st, err := tx.PrepareContext(ctx, `INSERT INTO issue VALUES (?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		tb.Fatal(err)
	}
	err = seedRows(issues, 0, func(table string, vals ...any) error {
		if table != "issue" {
			return nil
		}
		_, err := st.ExecContext(ctx, append(vals, seedVersion)...)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		tb.Fatal(err)
	}
	return db
}

// TestView_HydrateEach checks that HydrateEach hands over exactly the rows
// of Hydrate's result, in its order, and that an error from its callback
// stops the hydration.
func TestView_HydrateEach(t *testing.T) {
	recs := loadIncremental(t)
	db := seedReplica(t, 1000, 2, true)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, rec := range recs {
		ast, err := ParseAST(rec.AST)
		if err != nil {
			t.Fatal(err)
		}
		q, err := Compile(benchSchema, ast)
		if err != nil {
			t.Fatal(err)
		}
		want, err := q.NewView().Hydrate(ctx, tx)
		if err != nil {
			t.Fatal(err)
		}
		v := q.NewView()
		got := &Result{Values: map[string][]RowValue{}}
		if _, err := v.HydrateEach(ctx, tx, func(r RowValue) error {
			got.Values[r.Table()] = append(got.Values[r.Table()], r)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(got.Values) != len(want.Values) {
			t.Fatalf("%s: rows of %d tables, want %d", rec.ID, len(got.Values), len(want.Values))
		}
		for table, rows := range want.Values {
			if len(got.Values[table]) != len(rows) {
				t.Fatalf("%s: %s: %d rows, want %d", rec.ID, table, len(got.Values[table]), len(rows))
			}
			for i := range rows {
				if !got.Values[table][i].Equal(rows[i]) {
					t.Fatalf("%s: %s row %d differs", rec.ID, table, i)
				}
			}
		}
		if diff := sameRows(v.Result(), want); diff != "" {
			t.Fatalf("%s: view after HydrateEach: %s", rec.ID, diff)
		}
		if want.Len() == 0 {
			continue
		}
		stop := fmt.Errorf("stop")
		if _, err := q.NewView().HydrateEach(ctx, tx, func(RowValue) error { return stop }); err != stop {
			t.Fatalf("%s: HydrateEach = %v, want the callback's error", rec.ID, err)
		}
	}
}
