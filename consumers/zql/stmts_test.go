package zql

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestStmtCache(t *testing.T) {
	ctx := context.Background()
	db := seedIssues(t, 200)
	ast, err := ParseAST([]byte(`{"table":"issue","where":` + simpleJSON("open", "=", "true") + `,"orderBy":[["modified","desc"]],"limit":20}`))
	if err != nil {
		t.Fatal(err)
	}
	q, err := Compile(benchSchema, ast)
	if err != nil {
		t.Fatal(err)
	}
	want, err := q.NewView().Hydrate(ctx, readTx(t, db))
	if err != nil {
		t.Fatal(err)
	}

	t.Run("SameResultsStatementsKept", func(t *testing.T) {
		c := NewStmtCache(db, 0)
		defer c.Close()
		for range 3 {
			tx := readTx(t, db)
			got, err := q.NewView().Hydrate(ctx, c.Querier(tx))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want.Values, got.Values, cmp.Comparer(func(a, b RowValue) bool { return cmp.Equal(a.Row(), b.Row()) })); d != "" {
				t.Fatalf("cached querier's result differs (-want +got):\n%s", d)
			}
			tx.Rollback()
		}
		c.mu.Lock()
		n := c.lru.Len()
		c.mu.Unlock()
		if n == 0 {
			t.Errorf("no statement kept")
		}
	})

	t.Run("EvictsBeyondItsSize", func(t *testing.T) {
		c := NewStmtCache(db, 2)
		defer c.Close()
		tx := readTx(t, db)
		for _, query := range []string{"SELECT 1", "SELECT 2", "SELECT 3", "SELECT 2"} {
			rows, err := c.Querier(tx).QueryContext(ctx, query)
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := c.bySQL["SELECT 1"]; ok || len(c.bySQL) != 2 || c.lru.Len() != 2 {
			t.Errorf("cache holds %d (lru %d), SELECT 1 kept %v; want the 2 most recent", len(c.bySQL), c.lru.Len(), ok)
		}
	})

	t.Run("NeverWaitsForAConnection", func(t *testing.T) {
		// Every connection is held by a transaction that queries through
		// the cache: preparing on the pool would wait for ever.
		one, err := sql.Open("sqlite", "file:"+t.TempDir()+"/one.db")
		if err != nil {
			t.Fatal(err)
		}
		defer one.Close()
		one.SetMaxOpenConns(1)
		c := NewStmtCache(one, 0)
		defer c.Close()
		tx, err := one.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		start := time.Now()
		var n int
		if err := func() error {
			rows, err := c.Querier(tx).QueryContext(ctx, "SELECT 7")
			if err != nil {
				return err
			}
			defer rows.Close()
			rows.Next()
			return rows.Scan(&n)
		}(); err != nil || n != 7 {
			t.Fatalf("query = %d, %v; want 7", n, err)
		}
		if d := time.Since(start); d >= prepareWait {
			t.Errorf("query took %v; it waited for the pool", d)
		}
	})
}
