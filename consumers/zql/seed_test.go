package zql

import (
	"context"
	"crypto/md5"
	"database/sql"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	_ "modernc.org/sqlite"
)

// benchSchema is the client schema of testdata/bench/schema.sql.
var benchSchema = Schema{Tables: map[string]TableSchema{
	"user": {
		Columns:    []Column{{"id", KindString}, {"name", KindString}},
		PrimaryKey: []string{"id"},
	},
	"label": {
		Columns:    []Column{{"id", KindString}, {"name", KindString}},
		PrimaryKey: []string{"id"},
	},
	"issue": {
		Columns: []Column{
			{"id", KindString}, {"title", KindString}, {"open", KindBoolean},
			{"modified", KindNumber}, {"owner_id", KindString}, {"created", KindNumber},
		},
		PrimaryKey: []string{"id"},
	},
	"comment": {
		Columns:    []Column{{"id", KindString}, {"issue_id", KindString}, {"body", KindString}, {"created", KindNumber}},
		PrimaryKey: []string{"id"},
	},
	"issue_label": {
		Columns:    []Column{{"issue_id", KindString}, {"label_id", KindString}},
		PrimaryKey: []string{"issue_id", "label_id"},
	},
}}

// replicaDDL lays the tables out as the replica does: zero's lite type
// strings as declared types, _0_version, a unique index for the primary key
// and no PRIMARY KEY constraint.
var replicaDDL = []string{
	`CREATE TABLE "user" ("id" "text|NOT_NULL", "name" "text|NOT_NULL", "_0_version" TEXT)`,
	`CREATE UNIQUE INDEX "user_pkey" ON "user" ("id")`,
	`CREATE TABLE "label" ("id" "text|NOT_NULL", "name" "text|NOT_NULL", "_0_version" TEXT)`,
	`CREATE UNIQUE INDEX "label_pkey" ON "label" ("id")`,
	`CREATE TABLE "issue" ("id" "text|NOT_NULL", "title" "text|NOT_NULL", "open" "bool|NOT_NULL",
		"modified" "float8|NOT_NULL", "owner_id" "text", "created" "timestamptz|NOT_NULL", "_0_version" TEXT)`,
	`CREATE UNIQUE INDEX "issue_pkey" ON "issue" ("id")`,
	`CREATE TABLE "comment" ("id" "text|NOT_NULL", "issue_id" "text|NOT_NULL", "body" "text|NOT_NULL",
		"created" "timestamptz|NOT_NULL", "_0_version" TEXT)`,
	`CREATE UNIQUE INDEX "comment_pkey" ON "comment" ("id")`,
	`CREATE TABLE "issue_label" ("issue_id" "text|NOT_NULL", "label_id" "text|NOT_NULL", "_0_version" TEXT)`,
	`CREATE UNIQUE INDEX "issue_label_pkey" ON "issue_label" ("issue_id", "label_id")`,
}

// secondaryDDL holds the upstream's other indexes, which the replica copies.
var secondaryDDL = []string{
	`CREATE INDEX "issue_modified_idx" ON "issue" ("modified")`,
	`CREATE INDEX "issue_owner_idx" ON "issue" ("owner_id")`,
	`CREATE INDEX "comment_issue_idx" ON "comment" ("issue_id")`,
	`CREATE INDEX "issue_label_label_idx" ON "issue_label" ("label_id")`,
}

const seedVersion = "01"

// epoch2024 is 2024-01-01 00:00:00+00 in epoch milliseconds.
const epoch2024 = 1704067200000

// seedRows generates testdata/bench/seed.sh's rows for issues and
// cpi comments per issue, in client form, calling put for each.
func seedRows(issues, cpi int, put func(table string, vals ...any) error) error {
	users := max(10, issues/100)
	for g := 1; g <= users; g++ {
		if err := put("user", fmt.Sprintf("u%06d", g), "User "+strconv.Itoa(g)); err != nil {
			return err
		}
	}
	for g := 1; g <= 20; g++ {
		if err := put("label", fmt.Sprintf("l%02d", g), "label-"+strconv.Itoa(g)); err != nil {
			return err
		}
	}
	for g := 1; g <= issues; g++ {
		sum := md5.Sum([]byte(strconv.Itoa(g)))
		id := fmt.Sprintf("i%07d", g)
		if err := put("issue", id,
			"Issue "+strconv.Itoa(g)+" "+hex.EncodeToString(sum[:]),
			g%3 != 0,
			float64((int64(g)*7919)%1000003)*1000+float64(g),
			fmt.Sprintf("u%06d", 1+(g*31)%users),
			float64(epoch2024+int64(g)*60000),
		); err != nil {
			return err
		}
		for c := 1; c <= cpi; c++ {
			if err := put("comment", fmt.Sprintf("c%07d-%d", g, c), id,
				fmt.Sprintf("Comment %d on issue %d", c, g),
				float64(epoch2024+int64(g)*60000+int64(c)*1000),
			); err != nil {
				return err
			}
		}
	}
	for g := 1; g <= issues; g++ {
		if err := put("issue_label", fmt.Sprintf("i%07d", g), fmt.Sprintf("l%02d", 1+g%20)); err != nil {
			return err
		}
	}
	for g := 1; g <= issues; g++ {
		if g%2 == 0 && (g*7+3)%20 != g%20 {
			if err := put("issue_label", fmt.Sprintf("i%07d", g), fmt.Sprintf("l%02d", 1+(g*7+3)%20)); err != nil {
				return err
			}
		}
	}
	return nil
}

// seedReplica writes the benchmark dataset into a new SQLite replica under
// t.TempDir() and returns it open.
func seedReplica(tb testing.TB, issues, cpi int, secondary bool) *sql.DB {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "replica.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer tx.Rollback()
	ddl := replicaDDL
	if secondary {
		ddl = append(append([]string(nil), ddl...), secondaryDDL...)
	}
	for _, s := range ddl {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			tb.Fatalf("%s: %v", s, err)
		}
	}
	stmts := map[string]*sql.Stmt{}
	for name, ts := range benchSchema.Tables {
		cols := make([]string, 0, len(ts.Columns)+1)
		for _, c := range ts.Columns {
			cols = append(cols, quoteIdent(c.Name))
		}
		cols = append(cols, quoteIdent(VersionColumn))
		st, err := tx.PrepareContext(ctx, "INSERT INTO "+quoteIdent(name)+" ("+strings.Join(cols, ", ")+
			") VALUES (?"+strings.Repeat(", ?", len(cols)-1)+")")
		if err != nil {
			tb.Fatal(err)
		}
		stmts[name] = st
	}
	err = seedRows(issues, cpi, func(table string, vals ...any) error {
		_, err := stmts[table].ExecContext(ctx, append(vals, seedVersion)...)
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

// readTx opens a read transaction on db for the test's duration.
func readTx(tb testing.TB, db *sql.DB) *sql.Tx {
	tb.Helper()
	tx, err := db.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tx.Rollback() })
	return tx
}
