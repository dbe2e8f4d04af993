package cvrstore

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jetsync/jetsync/consumers/zql"
)

// BenchmarkUpdate times the CVR's hot path without I/O: a new query's
// hydration of 100,000 rows (each held, asked whether to stream, then
// finished), and a replica advance that touches one row of it.
func BenchmarkUpdate(b *testing.B) {
	ids, keys, vals := benchRows(b, 100000)
	b.Run("hydrate=100000", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c := New("g")
			c.Queries["q"] = &Query{Hash: "q"}
			u := c.BeginQuery("01")
			for i, id := range ids {
				u.Put(id, u.Hold(id, keys[i], "q", vals[i]))
			}
			if err := u.Finish(nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("advance=1", func(b *testing.B) {
		c := New("g")
		c.Queries["q"] = &Query{Hash: "q"}
		u := c.BeginQuery("01")
		for i, id := range ids {
			u.Hold(id, keys[i], "q", vals[i])
		}
		if err := u.Finish(nil); err != nil {
			b.Fatal(err)
		}
		c.Version = u.Version
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			u := c.BeginQuery(fmt.Sprintf("02%06d", i))
			k := i % len(ids)
			u.Put(ids[k], u.Hold(ids[k], keys[k], "q", vals[k]))
			if err := u.Finish(nil); err != nil {
				b.Fatal(err)
			}
			c.Version = u.Version
		}
	})
}

// benchRows reads n issue rows through a compiled whole-table query from an
// in-memory SQLite table, as a pipeline's hydration yields them.
func benchRows(b *testing.B, n int) (ids, keys []string, vals []zql.RowValue) {
	db, err := sql.Open("sqlite", "file::memory:")
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	b.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE issue (id TEXT PRIMARY KEY, title TEXT, _0_version TEXT)`); err != nil {
		b.Fatal(err)
	}
	tx, _ := db.Begin()
	for i := range n {
		if _, err := tx.Exec(`INSERT INTO issue VALUES (?, ?, '01')`, fmt.Sprintf("i%07d", i), fmt.Sprintf("title %d", i)); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	s := zql.Schema{Tables: map[string]zql.TableSchema{"issue": {
		Columns:    []zql.Column{{Name: "id", Kind: zql.KindString}, {Name: "title", Kind: zql.KindString}},
		PrimaryKey: []string{"id"},
	}}}
	ast, _ := zql.ParseAST([]byte(`{"table":"issue"}`))
	q, err := zql.Compile(s, ast)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := q.NewView().HydrateEach(context.Background(), db, func(v zql.RowValue) error {
		k, err := v.AppendKeyJSON(nil)
		if err != nil {
			return err
		}
		ids = append(ids, "issue\x00"+string(k))
		keys = append(keys, string(k))
		vals = append(vals, v)
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	return ids, keys, vals
}
