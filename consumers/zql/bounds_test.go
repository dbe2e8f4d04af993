package zql

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// denied is the condition the read rules put on a table they deny.
const denied = `{"type":"or","conditions":[]}`

// TestDenied_ReadsNothing checks that a node whose where is FALSE for
// every row reads no row of its table, when hydrating and on updates, and
// still answers: nothing.
func TestDenied_ReadsNothing(t *testing.T) {
	db := seedReplica(t, 300, 2, true)
	ctx := context.Background()
	tx := readTx(t, db)
	related := `"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","where":` + denied + `}}]`
	for _, tc := range []struct {
		name, ast string
		rows      int // root rows, read and synced
	}{
		{"Root", `{"table":"issue","where":` + denied + `,"orderBy":[["title","asc"]]}`, 0},
		{"AndedAtRoot", `{"table":"issue","where":{"type":"and","conditions":[` + simpleJSON("open", "=", "true") + `,` + denied + `]}}`, 0},
		{"NestedOr", `{"table":"issue","where":{"type":"or","conditions":[` + denied + `,{"type":"and","conditions":[` + denied + `]}]}}`, 0},
		{"Related", `{"table":"issue","orderBy":[["id","asc"]],"limit":5,` + related + `}`, 5},
		{"Exists", `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"zsubq_c","where":` + denied + `}}},"limit":5}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := compileJSON(t, tc.ast)
			res, err := q.Hydrate(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			if res.RowsRead != tc.rows || res.Len() != tc.rows || len(res.Rows["comment"]) != 0 {
				t.Errorf("Hydrate read %d rows, synced %d; want %d and %d", res.RowsRead, res.Len(), tc.rows, tc.rows)
			}
			v := q.NewView()
			vres, err := v.Hydrate(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			if vres.RowsRead != tc.rows || vres.Len() != tc.rows {
				t.Errorf("View.Hydrate read %d rows, synced %d; want %d", vres.RowsRead, vres.Len(), tc.rows)
			}
			if tc.rows > 0 {
				return
			}
			old := readIssue(t, tx, "i0000007")
			nu := maps.Clone(old)
			nu["title"], nu["_0_version"] = "changed", "02"
			d, err := v.Update(ctx, tx, []Change{
				{Table: "issue", Old: old, New: nu},
				{Table: "comment", New: map[string]any{"id": "cx", "issue_id": "i0000007", "body": "b", "created": 1.0, "_0_version": "02"}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if d.RowsRead != 0 || d.Put.Len() != 0 || len(d.Del) != 0 || d.Rehydrated {
				t.Errorf("Update read %d rows, put %d, deleted %v, rehydrated %v; want nothing", d.RowsRead, d.Put.Len(), d.Del, d.Rehydrated)
			}
		})
	}
}

// TestBounds_SQLiteLimits sends queries past SQLite's own limits: an IN
// list of more than 32,766 values, more than 1,000 ANDed conditions, and a
// LIKE pattern of 50,000 bytes answer as the plain evaluation does; one
// longer than that is refused by Compile, before anything runs.
func TestBounds_SQLiteLimits(t *testing.T) {
	db := seedReplica(t, 600, 0, true)
	ctx := context.Background()
	tx := readTx(t, db)
	run := func(t *testing.T, ast string) []string {
		t.Helper()
		q := compileJSON(t, ast)
		res, err := q.Hydrate(ctx, tx)
		if err != nil {
			t.Fatal(err)
		}
		v := q.NewView()
		vres, err := v.Hydrate(ctx, tx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := sameRows(res, vres); diff != "" {
			t.Fatalf("view != hydration: %s", diff)
		}
		var ids []string
		for _, r := range res.Rows["issue"] {
			ids = append(ids, r["id"].(string))
		}
		slices.Sort(ids)
		return ids
	}
	// want lists the seeded issues g (i%07d) for which keep holds.
	want := func(keep func(g int) bool) []string {
		var ids []string
		for g := 1; g <= 600; g++ {
			if keep(g) {
				ids = append(ids, fmt.Sprintf("i%07d", g))
			}
		}
		return ids
	}
	list := func(n int, real func(k int) bool) string {
		vals := make([]string, 0, n)
		for k := range n {
			if real(k) {
				vals = append(vals, fmt.Sprintf(`"i%07d"`, k))
			} else {
				vals = append(vals, fmt.Sprintf(`"x%07d"`, k))
			}
		}
		return "[" + strings.Join(vals, ",") + "]"
	}

	t.Run("InList40000", func(t *testing.T) {
		in := list(40000, func(k int) bool { return k%7 == 0 })
		got := run(t, `{"table":"issue","where":`+simpleJSON("id", "IN", in)+`}`)
		if w := want(func(g int) bool { return g%7 == 0 }); !slices.Equal(got, w) {
			t.Errorf("IN: got %d issues, want %d", len(got), len(w))
		}
		got = run(t, `{"table":"issue","where":{"type":"and","conditions":[`+simpleJSON("open", "=", "true")+`,`+simpleJSON("id", "NOT IN", in)+`]}}`)
		if w := want(func(g int) bool { return g%7 != 0 && g%3 != 0 }); !slices.Equal(got, w) {
			t.Errorf("NOT IN: got %d issues, want %d", len(got), len(w))
		}
	})
	t.Run("And1500", func(t *testing.T) {
		conds := []string{simpleJSON("open", "=", "true")}
		for k := range 1500 {
			conds = append(conds, simpleJSON("id", "!=", fmt.Sprintf(`"i%07d"`, 2*k)))
		}
		got := run(t, `{"table":"issue","where":{"type":"and","conditions":[`+strings.Join(conds, ",")+`]}}`)
		if w := want(func(g int) bool { return g%3 != 0 && g%2 == 1 }); !slices.Equal(got, w) {
			t.Errorf("got %d issues, want %d", len(got), len(w))
		}
	})
	t.Run("Like50000", func(t *testing.T) {
		p := "Issue 1" + strings.Repeat("%", 50000-len("Issue 1"))
		got := run(t, `{"table":"issue","where":`+simpleJSON("title", "LIKE", `"`+p+`"`)+`}`)
		if w := want(func(g int) bool { return strings.HasPrefix(fmt.Sprint(g), "1") }); !slices.Equal(got, w) {
			t.Errorf("got %d issues, want %d", len(got), len(w))
		}
	})
	t.Run("Like50001Refused", func(t *testing.T) {
		p := strings.Repeat("a", 50000+1)
		for _, op := range []string{"LIKE", "NOT ILIKE"} {
			a, err := ParseAST([]byte(`{"table":"issue","where":` + simpleJSON("title", op, `"`+p+`"`) + `}`))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Compile(benchSchema, a)
			var r *Refusal
			if !errors.As(err, &r) || !strings.Contains(r.Message, "LIKE or GLOB pattern too complex") {
				t.Errorf("%s: Compile = %v; want a Refusal", op, err)
			}
		}
	})
}

// TestRelated_ReadsItsLimit checks that a relation with a limit reads no
// more of a parent's children than it syncs, by index or not, past a start
// or not, and syncs the same rows as the relation without the limit cut to
// it.
func TestRelated_ReadsItsLimit(t *testing.T) {
	const issues, cpi, roots, limit = 30, 50, 3, 2
	for _, indexed := range []bool{true, false} {
		db := seedReplica(t, issues, cpi, indexed)
		tx := readTx(t, db)
		for _, start := range []string{"", `,"start":{"row":{"id":"c0000000-2"},"exclusive":true}`} {
			t.Run(fmt.Sprintf("indexed=%v/start=%v", indexed, start != ""), func(t *testing.T) {
				query := func(sub string) string {
					return `{"table":"issue","orderBy":[["id","asc"]],"limit":` + fmt.Sprint(roots) +
						`,"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["id","asc"]]` + sub + `}}]}`
				}
				hydrate := func(js string) *Result {
					res, err := compileJSON(t, js).Hydrate(context.Background(), tx)
					if err != nil {
						t.Fatal(err)
					}
					return res
				}
				got := hydrate(query(start + fmt.Sprintf(`,"limit":%d`, limit)))
				all := hydrate(query(start))
				if want := roots + roots*limit; got.RowsRead != want {
					t.Errorf("read %d rows; want %d (%d roots and %d children each)", got.RowsRead, want, roots, limit)
				}
				// The unlimited relation's rows, cut to limit per issue.
				perIssue := map[any][]string{}
				for _, r := range all.Rows["comment"] {
					perIssue[r["issue_id"]] = append(perIssue[r["issue_id"]], r["id"].(string))
				}
				var want []string
				for _, ids := range perIssue {
					slices.Sort(ids)
					want = append(want, ids[:min(limit, len(ids))]...)
				}
				var ids []string
				for _, r := range got.Rows["comment"] {
					ids = append(ids, r["id"].(string))
				}
				slices.Sort(ids)
				slices.Sort(want)
				if len(want) != roots*limit || !slices.Equal(ids, want) {
					t.Errorf("synced comments %v; want %v", ids, want)
				}
			})
		}
	}
}

// compileJSON parses and compiles a query's AST against benchSchema.
func compileJSON(tb testing.TB, js string) *Query {
	tb.Helper()
	ast, err := ParseAST([]byte(js))
	if err != nil {
		tb.Fatal(err)
	}
	q, err := Compile(benchSchema, ast)
	if err != nil {
		tb.Fatal(err)
	}
	return q
}
