package zql

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// The witness rules, as zero-cache 1.9.0 syncs the children of EXISTS and
// NOT EXISTS conditions (corpus README items 7-11):
//   - a join not flipped brings up to 3 matching children per parent row
//     (jetsync takes the first in primary-key order), whichever branch of
//     an or the row passed by, and whether the condition held or not;
//   - a flipped join brings every matching child, but only for the rows
//     that pass by it: an or with a flipped member tries its members
//     without flips first, then each flipped one in order, and a row
//     brings the witnesses of the first branch it passes by;
//   - flip on a NOT EXISTS changes nothing.

// existsJSON is an EXISTS (or NOT EXISTS) over user.issues or
// issue.comments, with where inside (or none).
func existsJSON(rel string, where string, flip, not bool) string {
	corr := map[string]string{
		"issues":   `"correlation":{"parentField":["id"],"childField":["owner_id"]},"subquery":{"table":"issue","alias":"zsubq_issues"`,
		"comments": `"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"zsubq_comments"`,
	}[rel]
	if where != "" {
		corr += `,"where":` + where
	}
	op := "EXISTS"
	if not {
		op = "NOT EXISTS"
	}
	return fmt.Sprintf(`{"type":"correlatedSubquery","related":{"system":"client",%s}},"op":%q,"flip":%v}`, corr, op, flip)
}

func orJSON(conds ...string) string {
	return `{"type":"or","conditions":[` + strings.Join(conds, ",") + `]}`
}

func andJSON(conds ...string) string {
	return `{"type":"and","conditions":[` + strings.Join(conds, ",") + `]}`
}

// witnessCase is a query and, as SQL over the replica, the primary keys of
// the rows it must sync, per table.
type witnessCase struct {
	name string
	ast  string
	want map[string]string
}

// Literals and fragments of the cases. The replica is seeded with 200
// issues: 10 users with 20 issues each, of which 6 or 7 closed, and 2
// comments per issue.
var (
	closed    = simpleJSON("open", "=", "false")
	notUser3  = simpleJSON("name", "!=", `"User 3"`)
	isUser3   = simpleJSON("name", "=", `"User 3"`)
	notUser4  = simpleJSON("name", "!=", `"User 4"`)
	firstTwo  = simpleJSON("id", "IN", `["i0000001","i0000002"]`)
	usersByID = `,"orderBy":[["id","asc"]]}`
	// firstClosed3 is up to 3 closed issues per user, in id order.
	firstClosed3 = `SELECT id FROM (SELECT id, row_number() OVER (PARTITION BY owner_id ORDER BY id) AS n FROM issue WHERE NOT open) WHERE n <= 3`
)

func witnessCases() []witnessCase {
	userWhere := func(w string) string { return `{"table":"user","where":` + w + usersByID }
	return []witnessCase{
		{"FlippedAtRoot", userWhere(existsJSON("issues", closed, true, false)), map[string]string{
			"user":  `SELECT id FROM user`,
			"issue": `SELECT id FROM issue WHERE NOT open`,
		}},
		{"NotFlippedAtRoot", userWhere(existsJSON("issues", closed, false, false)), map[string]string{
			"user":  `SELECT id FROM user`,
			"issue": firstClosed3,
		}},
		{"FlippedInOr", userWhere(orJSON(isUser3, existsJSON("issues", closed, true, false))), map[string]string{
			"user": `SELECT id FROM user`,
			// User 3 passes by its name: none of its issues.
			"issue": `SELECT id FROM issue WHERE NOT open AND owner_id != 'u000003'`,
		}},
		{"FlippedInOrFirst", userWhere(orJSON(existsJSON("issues", closed, true, false), isUser3)), map[string]string{
			// The members without flips come first, whatever the AST's order.
			"user":  `SELECT id FROM user`,
			"issue": `SELECT id FROM issue WHERE NOT open AND owner_id != 'u000003'`,
		}},
		{"FlippedInAnd", userWhere(andJSON(notUser3, existsJSON("issues", closed, true, false))), map[string]string{
			"user":  `SELECT id FROM user WHERE id != 'u000003'`,
			"issue": `SELECT id FROM issue WHERE NOT open AND owner_id != 'u000003'`,
		}},
		{"TwoFlippedInOr", userWhere(orJSON(existsJSON("issues", firstTwo, true, false), existsJSON("issues", closed, true, false))), map[string]string{
			"user": `SELECT id FROM user`,
			// The owners of i0000001 and i0000002 pass by the first member.
			"issue": `SELECT id FROM issue WHERE id IN ('i0000001', 'i0000002')
				UNION SELECT id FROM issue WHERE NOT open AND owner_id NOT IN (SELECT owner_id FROM issue WHERE id IN ('i0000001', 'i0000002'))`,
		}},
		{"FlippedInAndInOr", userWhere(orJSON(isUser3, andJSON(notUser4, existsJSON("issues", closed, true, false)))), map[string]string{
			"user":  `SELECT id FROM user WHERE id != 'u000004'`,
			"issue": `SELECT id FROM issue WHERE NOT open AND owner_id NOT IN ('u000003', 'u000004')`,
		}},
		{"NotFlippedInOr", userWhere(orJSON(isUser3, existsJSON("issues", closed, false, false))), map[string]string{
			// Witnesses for every row, User 3 included.
			"user":  `SELECT id FROM user`,
			"issue": firstClosed3,
		}},
		{"NotExistsInOr", userWhere(orJSON(isUser3, existsJSON("issues", closed, false, true))), map[string]string{
			// Every user has closed issues: only User 3 passes, with its
			// children that match the subquery.
			"user":  `SELECT 'u000003'`,
			"issue": firstClosed3 + ` AND id IN (SELECT id FROM issue WHERE owner_id = 'u000003')`,
		}},
		{"FlippedNotExistsInOr", userWhere(orJSON(isUser3, existsJSON("issues", closed, true, true))), map[string]string{
			"user":  `SELECT 'u000003'`,
			"issue": firstClosed3 + ` AND id IN (SELECT id FROM issue WHERE owner_id = 'u000003')`,
		}},
		{"NotExistsAtRoot", userWhere(existsJSON("issues", simpleJSON("title", "=", `"none"`), true, true)), map[string]string{
			"user": `SELECT id FROM user`,
		}},
		{"IssueCommentsFlippedInOr", `{"table":"issue","where":` + orJSON(closed, existsJSON("comments", "", true, false)) + `,"orderBy":[["id","asc"]],"limit":20}`, map[string]string{
			"issue": `SELECT id FROM issue ORDER BY id LIMIT 20`,
			// The closed issues pass by open = false: only the open ones
			// bring their comments.
			"comment": `SELECT c.id FROM comment c JOIN (SELECT id, open FROM issue ORDER BY id LIMIT 20) i ON c.issue_id = i.id WHERE i.open`,
		}},
		{"NestedFlippedInOr", userWhere(existsJSON("issues", orJSON(simpleJSON("open", "=", "true"), existsJSON("comments", "", true, false)), true, false)), map[string]string{
			"user":  `SELECT id FROM user`,
			"issue": `SELECT id FROM issue`,
			// Each issue passes the inner or; the open ones by open = true.
			"comment": `SELECT c.id FROM comment c JOIN issue i ON c.issue_id = i.id WHERE NOT i.open`,
		}},
	}
}

// wantRows runs a case's SQL: table, then primary keys.
func wantRows(t *testing.T, q Querier, want map[string]string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for table, query := range want {
		rows, err := q.QueryContext(context.Background(), query)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			out[table] = append(out[table], id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		slices.Sort(out[table])
		if len(out[table]) == 0 {
			delete(out, table)
		}
	}
	return out
}

// syncedKeys lists a result's primary keys per table.
func syncedKeys(res *Result) map[string][]string {
	out := map[string][]string{}
	for table, rows := range res.Rows {
		for _, r := range rows {
			out[table] = append(out[table], pkString(table, r))
		}
	}
	for table, rows := range res.Values {
		for _, v := range rows {
			out[table] = append(out[table], pkString(table, v.Row()))
		}
	}
	for table := range out {
		slices.Sort(out[table])
	}
	return out
}

func diffKeys(got, want map[string][]string) string {
	var d []string
	tables := map[string]bool{}
	for k := range got {
		tables[k] = true
	}
	for k := range want {
		tables[k] = true
	}
	for _, table := range slices.Sorted(maps.Keys(tables)) {
		var missing, extra []string
		for _, k := range want[table] {
			if _, ok := slices.BinarySearch(got[table], k); !ok {
				missing = append(missing, k)
			}
		}
		for _, k := range got[table] {
			if _, ok := slices.BinarySearch(want[table], k); !ok {
				extra = append(extra, k)
			}
		}
		if len(missing) > 0 {
			d = append(d, fmt.Sprintf("%s: %d missing %v", table, len(missing), clip(missing)))
		}
		if len(extra) > 0 {
			d = append(d, fmt.Sprintf("%s: %d extra %v", table, len(extra), clip(extra)))
		}
	}
	return strings.Join(d, "; ")
}

// TestHydrate_Witnesses checks which EXISTS children a hydration syncs,
// by Query.Hydrate and by a View.
func TestHydrate_Witnesses(t *testing.T) {
	tx := readTx(t, seedReplica(t, 200, 2, true))
	ctx := context.Background()
	for _, tc := range witnessCases() {
		t.Run(tc.name, func(t *testing.T) {
			ast, err := ParseAST([]byte(tc.ast))
			if err != nil {
				t.Fatal(err)
			}
			q, err := Compile(benchSchema, ast)
			if err != nil {
				t.Fatal(err)
			}
			want := wantRows(t, tx, tc.want)
			res, err := q.Hydrate(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			if d := diffKeys(syncedKeys(res), want); d != "" {
				t.Errorf("Hydrate: %s", d)
			}
			view, err := q.NewView().Hydrate(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			if d := diffKeys(syncedKeys(view), want); d != "" {
				t.Errorf("View: %s", d)
			}
		})
	}
}

// TestView_Witnesses follows writes that change which witnesses a row
// brings: a witness deleted (another must come), a row that starts or stops
// passing by a flipped branch, a flipped witness leaving its filter.
func TestView_Witnesses(t *testing.T) {
	db := seedReplica(t, 200, 2, true)
	ctx := context.Background()
	cases := witnessCases()
	byName := func(name string) witnessCase {
		i := slices.IndexFunc(cases, func(c witnessCase) bool { return c.name == name })
		return cases[i]
	}
	// firstWitness is u000001's first closed issue, which the joins not
	// flipped take as a witness.
	const firstWitness = `(SELECT min(id) FROM issue WHERE owner_id = 'u000001' AND NOT open)`
	for _, tc := range []struct {
		name, query string
		writes      []string
		// after replaces the case's SQL for these tables after the writes.
		after map[string]string
	}{
		{"WitnessDeleted", "NotFlippedAtRoot", []string{
			`DELETE FROM issue WHERE id = ` + firstWitness,
		}, nil},
		{"WitnessLeavesFilter", "NotFlippedInOr", []string{
			`UPDATE issue SET open = 1 WHERE id = ` + firstWitness,
		}, nil},
		{"FlippedWitnessDeleted", "FlippedInOr", []string{
			`DELETE FROM issue WHERE id = ` + firstWitness,
		}, nil},
		{"StartsPassingByFlip", "FlippedInOr", []string{
			`UPDATE user SET name = 'Three' WHERE id = 'u000003'`,
		}, map[string]string{"issue": `SELECT id FROM issue WHERE NOT open`}},
		{"StopsPassingByFlip", "FlippedInOr", []string{
			`UPDATE user SET name = 'User 3' WHERE id = 'u000005'`,
		}, map[string]string{"issue": `SELECT id FROM issue WHERE NOT open AND owner_id NOT IN ('u000003', 'u000005')`}},
		{"RootLeavesOtherBranch", "IssueCommentsFlippedInOr", []string{
			`UPDATE issue SET open = 0 WHERE id = 'i0000001'`,
			`UPDATE issue SET open = 1 WHERE id = 'i0000003'`,
		}, nil},
		{"NestedWitnessChanges", "NestedFlippedInOr", []string{
			`UPDATE issue SET open = 0 WHERE id = 'i0000001'`,
			`DELETE FROM comment WHERE id = 'c0000003-1'`,
			`INSERT INTO comment VALUES ('c0000006-9', 'i0000006', 'new', 0, '02')`,
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wc := byName(tc.query)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			ast, err := ParseAST([]byte(wc.ast))
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
			old := tableRows(t, tx)
			for _, w := range tc.writes {
				if _, err := tx.ExecContext(ctx, w); err != nil {
					t.Fatalf("%s: %v", w, err)
				}
			}
			d, err := v.Update(ctx, tx, changesBetween(old, tableRows(t, tx)))
			if err != nil {
				t.Fatal(err)
			}
			if d.Rehydrated {
				t.Error("the view re-hydrated instead of updating")
			}
			want := maps.Clone(wc.want)
			maps.Copy(want, tc.after)
			after := v.Result()
			if diff := diffKeys(syncedKeys(after), wantRows(t, tx, want)); diff != "" {
				t.Errorf("after the writes: %s", diff)
			}
			if diff := sameRows(applyDiff(before, d), after); diff != "" {
				t.Errorf("before + diff != after: %s", diff)
			}
			if diff := diffKeys(syncedKeys(before), syncedKeys(after)); diff == "" {
				t.Error("the writes changed nothing: the case tests nothing")
			}
		})
	}
}
