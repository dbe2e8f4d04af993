package zql

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestHydrate covers behaviour the corpus does not: permissions
// subqueries, NULL parents of a resolved scalar NOT EXISTS, type
// mismatches left to SQLite, and queries over a *sql.DB.
func TestHydrate(t *testing.T) {
	db := seedReplica(t, 1000, 2, true)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE issue SET owner_id = NULL WHERE id = 'i0000001'`); err != nil {
		t.Fatal(err)
	}
	owner := func(system, where string) string {
		return `{"correlation":{"parentField":["owner_id"],"childField":["id"]},"system":"` + system +
			`","subquery":{"table":"user","alias":"owner"` + where + `}}`
	}
	byName := func(name string) string {
		return `,"where":{"type":"simple","left":{"type":"column","name":"name"},"op":"=","right":{"type":"literal","value":"` + name + `"}}`
	}
	byID := `,"where":{"type":"simple","left":{"type":"column","name":"id"},"op":"=","right":{"type":"literal","value":"u000002"}}`
	simple := func(col, op, lit string) string {
		return `{"type":"simple","left":{"type":"column","name":"` + col + `"},"op":"` + op + `","right":{"type":"literal","value":` + lit + `}}`
	}
	for _, tc := range []struct {
		name, ast string
		want      map[string]string // table: primary keys, space-separated
	}{
		{"PermissionsExistsFiltersWithoutSyncing",
			`{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":` + owner("permissions", byName("User 4")) + `},"limit":3}`,
			map[string]string{"issue": "i0000003 i0000013 i0000023"}},
		{"PermissionsRelatedNotSynced",
			`{"table":"issue","where":` + simple("id", "=", `"i0000002"`) + `,"related":[` + owner("permissions", "") + `]}`,
			map[string]string{"issue": "i0000002"}},
		{"ScalarNotExistsKeepsNullParent",
			`{"table":"issue","where":{"type":"correlatedSubquery","op":"NOT EXISTS","scalar":true,"related":` + owner("client", byID) + `},"limit":3}`,
			map[string]string{"issue": "i0000001 i0000002 i0000003", "user": "u000002"}},
		{"ScalarExistsNoMatch",
			`{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","scalar":true,"related":` + owner("client",
				`,"where":{"type":"simple","left":{"type":"column","name":"id"},"op":"=","right":{"type":"literal","value":"u999"}}`) + `}}`,
			map[string]string{}},
		{"NullNeverJoins",
			`{"table":"issue","where":` + simple("id", "<", `"i0000003"`) + `,"related":[` + owner("client", "") + `]}`,
			map[string]string{"issue": "i0000001 i0000002", "user": "u000003"}},
		{"NumberAgainstText", `{"table":"issue","where":` + simple("modified", ">", `"abc"`) + `}`, map[string]string{}},
		{"BoolEqualsText", `{"table":"issue","where":` + simple("open", "=", `"true"`) + `}`, map[string]string{}},
		{"BoolNotEqualsText", `{"table":"issue","where":` + simple("open", "!=", `"true"`) + `,"limit":1}`,
			map[string]string{"issue": "i0000001"}},
		{"CursorMissingColumnIsNull",
			`{"table":"issue","orderBy":[["owner_id","asc"]],"start":{"row":{"id":"i0000002"},"exclusive":true},"limit":2}`,
			map[string]string{"issue": "i0000010 i0000020"}}, // i0000001 (owner NULL) sorts before the cursor
		{"EmptyOrIsFalse", `{"table":"label","where":{"type":"or","conditions":[]}}`, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ast, err := ParseAST([]byte(tc.ast))
			if err != nil {
				t.Fatal(err)
			}
			res, err := Hydrate(ctx, tx, benchSchema, ast)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for table, rows := range res.Rows {
				var keys []string
				for _, r := range rows {
					keys = append(keys, pkString(table, r))
				}
				slices.Sort(keys)
				got[table] = strings.Join(keys, " ")
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("Hydrate(%s) = %v; want %v", tc.ast, got, tc.want)
			}
		})
	}
}

// TestHydrate_DB runs on a *sql.DB pool, whose nested lookups take other
// connections.
func TestHydrate_DB(t *testing.T) {
	db := seedReplica(t, 100, 2, false)
	ast, err := ParseAST([]byte(`{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"c"}}},"related":[{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Hydrate(context.Background(), db, benchSchema, ast)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(len(res.Rows["issue"]), len(res.Rows["comment"]), len(res.Rows["user"]))
	if want := "100 200 10"; got != want {
		t.Errorf("Hydrate rows issue, comment, user = %s; want %s", got, want)
	}
}
