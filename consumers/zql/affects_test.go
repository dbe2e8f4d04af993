package zql

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestQuery_Affects follows random changes with a view that sees only the
// changes Affects reports, as an advance does, and checks after every
// step that it holds what a fresh hydration does, and that a step it was
// spared changed nothing. Shapes cover what could fool a judgement made
// from the changed row alone: the root table read again by a related or
// EXISTS subquery, OR, NULLs, limit windows that rows move into and out
// of, scalar subqueries and rules-style EXISTS.
func TestQuery_Affects(t *testing.T) {
	ownerIs := func(u string) string { return simpleJSON("owner_id", "=", `"`+u+`"`) }
	shapes := []struct {
		name, ast string
		// skips is set when some steps must be spared: the shape is
		// selective enough, and judged from the row alone.
		skips bool
	}{
		{"OwnerLatest", `{"table":"issue","where":` + ownerIs("u000003") + `,"orderBy":[["modified","desc"],["id","asc"]],"limit":3}`, true},
		{"OneIssueWithComments", `{"table":"issue","where":` + simpleJSON("id", "=", `"i0000005"`) + `,"limit":1,
			"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","asc"]]}}]}`, true},
		{"Or", `{"table":"issue","where":{"type":"or","conditions":[` + ownerIs("u000003") + `,` + simpleJSON("open", "=", "false") + `]},"orderBy":[["modified","desc"]],"limit":4}`, true},
		{"AndOpenLimitWindow", `{"table":"issue","where":{"type":"and","conditions":[` + simpleJSON("open", "=", "true") + `,` +
			simpleJSON("owner_id", "IN", `["u000001","u000002"]`) + `]},"orderBy":[["modified","asc"]],"limit":2}`, true},
		{"IsNull", `{"table":"issue","where":` + simpleJSON("owner_id", "IS", "null") + `,"orderBy":[["id","asc"]]}`, true},
		{"IsNotNull", `{"table":"issue","where":` + simpleJSON("owner_id", "IS NOT", "null") + `,"orderBy":[["id","asc"]],"limit":5}`, false},
		{"NotEqual", `{"table":"issue","where":` + simpleJSON("owner_id", "!=", `"u000003"`) + `,"orderBy":[["created","desc"]],"limit":5}`, true},
		{"NotIn", `{"table":"issue","where":` + simpleJSON("owner_id", "NOT IN", `["u000001","u000002","u000003","u000004","u000005","u000006","u000007","u000008"]`) + `}`, true},
		{"Like", `{"table":"issue","where":` + simpleJSON("title", "LIKE", `"hot%"`) + `,"orderBy":[["id","desc"]],"limit":3}`, true},
		{"EmptyOr", `{"table":"issue","where":{"type":"or","conditions":[]}}`, true},
		{"RelatedSameTable", `{"table":"issue","where":` + simpleJSON("id", "=", `"i0000003"`) + `,
			"related":[{"correlation":{"parentField":["owner_id"],"childField":["owner_id"]},"subquery":{"table":"issue","alias":"siblings","orderBy":[["id","asc"]],"limit":3}}]}`, false},
		{"ExistsSameTable", `{"table":"issue","where":{"type":"and","conditions":[` + ownerIs("u000002") + `,
			{"type":"correlatedSubquery","op":"NOT EXISTS","related":{"correlation":{"parentField":["owner_id"],"childField":["owner_id"]},
				"subquery":{"table":"issue","alias":"zsubq_hot","where":` + simpleJSON("title", "=", `"hot"`) + `}}}]},"orderBy":[["id","asc"]]}`, false},
		{"RulesExists", `{"table":"issue","where":{"type":"and","conditions":[` + ownerIs("u000004") + `,
			{"type":"correlatedSubquery","op":"EXISTS","related":{"system":"permissions","correlation":{"parentField":["owner_id"],"childField":["id"]},
				"subquery":{"table":"user","alias":"zsubq_owner","where":` + simpleJSON("name", "LIKE", `"User%"`) + `}}}]},"orderBy":[["modified","desc"]],"limit":3}`, true},
		{"ExistsOrSimple", `{"table":"issue","where":{"type":"or","conditions":[` + ownerIs("u000004") + `,
			{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},
				"subquery":{"table":"comment","alias":"zsubq_c","where":` + simpleJSON("body", "=", `"hot"`) + `}}}]},"orderBy":[["id","asc"]],"limit":6}`, false},
		{"ScalarOwner", `{"table":"issue","where":{"type":"and","conditions":[` + simpleJSON("open", "=", "true") + `,
			{"type":"correlatedSubquery","op":"EXISTS","scalar":true,"related":{"correlation":{"parentField":["owner_id"],"childField":["id"]},
				"subquery":{"table":"user","alias":"owner","where":` + simpleJSON("id", "=", `"u000002"`) + `}}}]},"orderBy":[["modified","asc"]],"limit":3}`, true},
		{"NoWhere", `{"table":"issue","orderBy":[["id","asc"]],"limit":30}`, false},
	}
	for i, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i+1), 7))
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
			spared, changed := 0, 0
			for step := range 200 {
				old := tableRows(t, tx)
				var stmts []string
				for range 1 + rng.IntN(2) {
					s := affectsChange(rng)
					stmts = append(stmts, s)
					if _, err := tx.ExecContext(ctx, s); err != nil {
						t.Fatalf("%s: %v", s, err)
					}
				}
				changes := changesBetween(old, tableRows(t, tx))
				fresh, err := q.Hydrate(ctx, tx)
				if err != nil {
					t.Fatal(err)
				}
				if sameRows(prev, fresh) != "" {
					changed++
				}
				if !q.Affects(NewChanges(changes)) {
					spared++
					if diff := sameRows(prev, fresh); diff != "" {
						t.Fatalf("step %d (%s): spared, but the result changed: %s", step, strings.Join(stmts, "; "), diff)
					}
					continue
				}
				d, err := v.Update(ctx, tx, changes)
				if err != nil {
					t.Fatal(err)
				}
				got := v.Result()
				if diff := sameRows(got, fresh); diff != "" {
					t.Fatalf("step %d (%s): view != fresh hydration: %s", step, strings.Join(stmts, "; "), diff)
				}
				if diff := sameRows(applyDiff(prev, d), got); diff != "" {
					t.Fatalf("step %d (%s): previous + diff != view: %s", step, strings.Join(stmts, "; "), diff)
				}
				prev = got
			}
			t.Logf("%d/200 steps spared, %d changed the result", spared, changed)
			if sh.skips && spared < 20 {
				t.Errorf("only %d/200 steps spared; want a shape that is", spared)
			}
			if changed < 3 && sh.name != "EmptyOr" {
				t.Errorf("only %d/200 steps changed the result; want a test that does", changed)
			}
		})
	}
}

// affectsChange is randomChange with NULL owners, "hot" titles and moves
// of a few owners' rows, which the shapes of TestQuery_Affects test for.
func affectsChange(rng *rand.Rand) string {
	switch rng.IntN(10) {
	case 0:
		randomVersion++
		return fmt.Sprintf(`UPDATE issue SET owner_id = NULL, _0_version = 'v%06d' WHERE id = 'i%07d'`, randomVersion, 1+rng.IntN(70))
	case 1:
		randomVersion++
		return fmt.Sprintf(`UPDATE issue SET title = %s, _0_version = 'v%06d' WHERE id = 'i%07d'`,
			[]string{"'hot'", "'hotter'", "'cold'"}[rng.IntN(3)], randomVersion, 1+rng.IntN(70))
	case 2, 3:
		// Rows the owner shapes hold move in their windows.
		randomVersion++
		return fmt.Sprintf(`UPDATE issue SET modified = %d, _0_version = 'v%06d' WHERE id IN
			(SELECT id FROM issue WHERE owner_id IN ('u000002', 'u000003', 'u000004') ORDER BY random() LIMIT 1)`, rng.IntN(1000000000), randomVersion)
	}
	return randomChange(rng)
}

// TestQuery_AffectsCases pins Affects's judgement on single changes.
func TestQuery_AffectsCases(t *testing.T) {
	issue := func(id, owner string, open bool) map[string]any {
		var o any = owner
		if owner == "" {
			o = nil
		}
		return map[string]any{"id": id, "title": "t", "open": map[bool]int64{false: 0, true: 1}[open], "modified": 1.0,
			"owner_id": o, "created": 2.0, "_0_version": "01"}
	}
	partial := issue("i1", "u2", true)
	delete(partial, "title")
	byOwner := `{"table":"issue","where":` + simpleJSON("owner_id", "=", `"u1"`) + `,"limit":20,"orderBy":[["modified","desc"]]}`
	cases := []struct {
		name, ast string
		change    Change
		want      bool
	}{
		{"OtherOwner", byOwner, Change{Table: "issue", Old: issue("i1", "u2", true), New: issue("i1", "u2", false)}, false},
		{"MovesIn", byOwner, Change{Table: "issue", Old: issue("i1", "u2", true), New: issue("i1", "u1", true)}, true},
		{"MovesOut", byOwner, Change{Table: "issue", Old: issue("i1", "u1", true), New: issue("i1", "u2", true)}, true},
		{"Insert", byOwner, Change{Table: "issue", New: issue("i1", "u1", true)}, true},
		{"InsertOther", byOwner, Change{Table: "issue", New: issue("i1", "u3", true)}, false},
		{"DeleteOther", byOwner, Change{Table: "issue", Old: issue("i1", "u3", true)}, false},
		{"Delete", byOwner, Change{Table: "issue", Old: issue("i1", "u1", true)}, true},
		{"NullOwner", byOwner, Change{Table: "issue", Old: issue("i1", "", true), New: issue("i1", "", false)}, false},
		{"PartialImage", byOwner, Change{Table: "issue", Old: partial, New: issue("i1", "u2", false)}, true},
		{"BadValue", byOwner, Change{Table: "issue", Old: issue("i1", "u2", true), New: map[string]any{"id": "i1", "title": "t", "open": "yes",
			"modified": 1.0, "owner_id": "u2", "created": 2.0}}, true},
		{"TableNotRead", byOwner, Change{Table: "comment", New: map[string]any{"id": "c1"}}, false},
		{"IsNullMatches", `{"table":"issue","where":` + simpleJSON("owner_id", "IS", "null") + `}`,
			Change{Table: "issue", Old: issue("i1", "u2", true), New: issue("i1", "", true)}, true},
		{"OrOneBranch", `{"table":"issue","where":{"type":"or","conditions":[` + simpleJSON("owner_id", "=", `"u1"`) + `,` + simpleJSON("open", "=", "true") + `]}}`,
			Change{Table: "issue", Old: issue("i1", "u2", true), New: issue("i1", "u2", true)}, true},
		{"OrNoBranch", `{"table":"issue","where":{"type":"or","conditions":[` + simpleJSON("owner_id", "=", `"u1"`) + `,` + simpleJSON("open", "=", "true") + `]}}`,
			Change{Table: "issue", Old: issue("i1", "u2", false), New: issue("i1", "u2", false)}, false},
		{"ExistsUnknown", `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["owner_id"],"childField":["id"]},
			"subquery":{"table":"user","alias":"o"}}}}`, Change{Table: "issue", Old: issue("i1", "u2", false), New: issue("i1", "u2", true)}, true},
		{"RelatedChild", `{"table":"issue","where":` + simpleJSON("id", "=", `"i9"`) + `,"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},
			"subquery":{"table":"comment","alias":"comments"}}]}`, Change{Table: "comment", New: map[string]any{"id": "c1", "issue_id": "i1", "body": "b", "created": 1.0}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ast, err := ParseAST([]byte(tc.ast))
			if err != nil {
				t.Fatal(err)
			}
			q, err := Compile(benchSchema, ast)
			if err != nil {
				t.Fatal(err)
			}
			if got := q.Affects(NewChanges([]Change{tc.change})); got != tc.want {
				t.Errorf("Affects = %v; want %v", got, tc.want)
			}
		})
	}
}

// TestChanges_Shared checks that one Changes, whose images the first query
// to read them converts, judges each query as a Changes of its own would:
// queries compiled for another column order of the table (a schema
// change), several tables changed at once, and queries asked at once.
func TestChanges_Shared(t *testing.T) {
	swapped := Schema{Tables: map[string]TableSchema{}}
	for n, ts := range benchSchema.Tables {
		swapped.Tables[n] = ts
	}
	is := benchSchema.Tables["issue"]
	cols := slices.Clone(is.Columns)
	i, o := slices.IndexFunc(cols, func(c Column) bool { return c.Name == "id" }), slices.IndexFunc(cols, func(c Column) bool { return c.Name == "owner_id" })
	cols[i], cols[o] = cols[o], cols[i]
	swapped.Tables["issue"] = TableSchema{Columns: cols, PrimaryKey: is.PrimaryKey}
	issue := func(id, owner string) map[string]any {
		return map[string]any{"id": id, "title": "t", "open": int64(1), "modified": 1.0, "owner_id": owner, "created": 2.0}
	}
	byOwner := `{"table":"issue","where":` + simpleJSON("owner_id", "=", `"u1"`) + `,"limit":20,"orderBy":[["modified","desc"]]}`
	byID := `{"table":"issue","where":` + simpleJSON("id", "=", `"u1"`) + `}`
	withComments := `{"table":"issue","where":` + simpleJSON("id", "=", `"i9"`) + `,"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},
			"subquery":{"table":"comment","alias":"comments"}}]}`
	comment := Change{Table: "comment", New: map[string]any{"id": "c1", "issue_id": "i1", "body": "b", "created": 1.0}}
	// An issue whose ID is the owner the queries ask for: read with the
	// other order's columns, it would pass byOwner.
	odd := Change{Table: "issue", Old: issue("u1", "u2"), New: issue("u1", "u3")}
	queries := []struct {
		ast    string
		schema Schema
	}{{byOwner, benchSchema}, {byOwner, swapped}, {byID, swapped}, {byID, benchSchema}, {withComments, benchSchema}, {withComments, swapped}}
	for _, rows := range [][]Change{{odd}, {comment, odd}, {odd, comment}} {
		var qs []*Query
		var want []bool
		for _, qc := range queries {
			ast, err := ParseAST([]byte(qc.ast))
			if err != nil {
				t.Fatal(err)
			}
			q, err := Compile(qc.schema, ast)
			if err != nil {
				t.Fatal(err)
			}
			qs = append(qs, q)
			want = append(want, q.Affects(NewChanges(rows)))
		}
		if want[0] || want[1] || !want[2] || !want[3] {
			t.Fatalf("fresh verdicts %v; want byOwner false and byID true in both orders", want)
		}
		// Each query asked first once, then the others, one after another.
		for first := range qs {
			shared := NewChanges(rows)
			for k := range qs {
				j := (first + k) % len(qs)
				if got := qs[j].Affects(shared); got != want[j] {
					t.Errorf("rows %d, query %d after query %d: Affects = %v; want %v", len(rows), j, first, got, want[j])
				}
			}
		}
		// All at once (for the race detector).
		shared := NewChanges(rows)
		var wg sync.WaitGroup
		for j, q := range qs {
			wg.Go(func() {
				if got := q.Affects(shared); got != want[j] {
					t.Errorf("rows %d, query %d at once: Affects = %v; want %v", len(rows), j, got, want[j])
				}
			})
		}
		wg.Wait()
	}
}
