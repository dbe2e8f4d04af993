package permissions

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	_ "modernc.org/sqlite"
)

// TestLoad reads the rules row as the view-syncer does at each snapshot:
// every way of having nothing deployed is None itself, and unchanged text
// keeps the previous rules, since pipelines tell a rule change by pointer.
func TestLoad(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "replica.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	const table = "zero.permissions"
	load := func(t *testing.T, replicated bool, prev *Rules) (*Rules, error) {
		t.Helper()
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		return Load(ctx, tx, table, replicated, prev)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	mustLoad := func(t *testing.T, replicated bool, prev *Rules) *Rules {
		t.Helper()
		p, err := load(t, replicated, prev)
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		return p
	}

	// Not replicated: the table is not even read (it does not exist yet).
	if p := mustLoad(t, false, nil); p != None {
		t.Errorf("not replicated: %p; want None", p)
	}
	exec(`CREATE TABLE "` + table + `" ("lock" INTEGER PRIMARY KEY, "permissions" TEXT, "hash" TEXT)`)
	if p := mustLoad(t, true, nil); p != None {
		t.Errorf("no row: %p; want None", p)
	}
	exec(`INSERT INTO "`+table+`" VALUES (1, ?, NULL)`, nil)
	if p := mustLoad(t, true, nil); p != None {
		t.Errorf("NULL: %p; want None", p)
	}
	exec(`UPDATE "` + table + `" SET "permissions" = 'null'`)
	if p := mustLoad(t, true, nil); p != None {
		t.Errorf("JSON null: %p; want None", p)
	}

	doc := rules(map[string]string{"issue": anyoneCan})
	exec(`UPDATE "`+table+`" SET "permissions" = ?`, doc)
	first := mustLoad(t, true, None)
	if first == None || first.raw != doc || len(first.selects["issue"]) != 1 {
		t.Fatalf("deployed: %+v; want the issue rule parsed", first)
	}
	if p := mustLoad(t, true, first); p != first {
		t.Errorf("unchanged text: new rules %p; want prev %p", p, first)
	}
	if p := mustLoad(t, false, first); p != None {
		t.Errorf("table gone from the replica: %p; want None", p)
	}
	doc2 := rules(map[string]string{"issue": anyoneCan, "user": anyoneCan})
	exec(`UPDATE "`+table+`" SET "permissions" = ?`, doc2)
	if p := mustLoad(t, true, first); p == first || p.raw != doc2 {
		t.Errorf("changed text: %+v; want new rules", p)
	}

	exec(`UPDATE "` + table + `" SET "permissions" = '{"tables":{},"version":2}'`)
	if _, err := load(t, true, first); err == nil || !strings.HasPrefix(err.Error(), "Could not parse upstream permissions") {
		t.Errorf("bad document: err = %v; want a parse error", err)
	}
}
