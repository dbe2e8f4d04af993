package zql

import (
	"context"
	"testing"
)

// BenchmarkHydrate runs queries on seed.sh 100000's dataset (451,020 rows).
func BenchmarkHydrate(b *testing.B) {
	db := seedReplica(b, 100000, 2, true)
	tx := readTx(b, db)
	for _, bc := range []struct {
		name, ast string
		rows      int
	}{
		{"whole-issue-table", `{"table":"issue"}`, 100000},
		{"issues-page-with-related", `{"table":"issue","related":[
			{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"}},
			{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","desc"]],"limit":10}},
			{"correlation":{"parentField":["id"],"childField":["issue_id"]},"hidden":true,"subquery":{"table":"issue_label","alias":"labels","related":[
				{"correlation":{"parentField":["label_id"],"childField":["id"]},"subquery":{"table":"label","alias":"labels"}}]}}],
			"limit":100,"orderBy":[["modified","desc"]]}`, 0},
		{"exists-open-with-comment-limit-50", `{"table":"issue","where":{"type":"and","conditions":[
			{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},
			{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},
				"subquery":{"table":"comment","alias":"zsubq_comments","where":{"type":"simple","left":{"type":"column","name":"body"},"right":{"type":"literal","value":"Comment 2%"},"op":"LIKE"}}}}]},
			"limit":50,"orderBy":[["created","desc"]]}`, 0},
	} {
		ast, err := ParseAST([]byte(bc.ast))
		if err != nil {
			b.Fatal(err)
		}
		q, err := Compile(benchSchema, ast)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, err := q.Hydrate(context.Background(), tx)
				if err != nil {
					b.Fatal(err)
				}
				if bc.rows > 0 && res.Len() != bc.rows {
					b.Fatalf("Hydrate: %d rows; want %d", res.Len(), bc.rows)
				}
			}
		})
		// A view hydrates the same rows and keeps what it needs to update.
		b.Run(bc.name+"/view", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, err := q.NewView().Hydrate(context.Background(), tx)
				if err != nil {
					b.Fatal(err)
				}
				if bc.rows > 0 && res.Len() != bc.rows {
					b.Fatalf("Hydrate: %d rows; want %d", res.Len(), bc.rows)
				}
			}
		})
	}
}

// BenchmarkView_UpdateOneRow times one issue update on 100,000 issues: the
// first row of the window moves past its end (so the window refills), then
// the view either updates from the change or re-runs the query, as the
// view-syncer did before views. update-cached reads through a StmtCache,
// as the view-syncer does.
func BenchmarkView_UpdateOneRow(b *testing.B) {
	db := seedIssues(b, 100000)
	ctx := context.Background()
	stmts := NewStmtCache(db, 0)
	defer stmts.Close()
	for _, bc := range []struct{ name, ast string }{
		{"open-by-modified-limit-50", `{"table":"issue","where":` + simpleJSON("open", "=", "true") + `,"orderBy":[["modified","asc"]],"limit":50}`},
		{"open-by-title-limit-50", `{"table":"issue","where":` + simpleJSON("open", "=", "true") + `,"orderBy":[["title","asc"]],"limit":50}`},
		{"open-no-limit", `{"table":"issue","where":` + simpleJSON("open", "=", "true") + `}`},
	} {
		ast, err := ParseAST([]byte(bc.ast))
		if err != nil {
			b.Fatal(err)
		}
		q, err := Compile(benchSchema, ast)
		if err != nil {
			b.Fatal(err)
		}
		for _, mode := range []string{"update", "update-cached", "rehydrate"} {
			b.Run(bc.name+"/"+mode, func(b *testing.B) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer tx.Rollback()
				var qu Querier = tx
				if mode == "update-cached" {
					qu = stmts.Querier(tx)
				}
				v := q.NewView()
				res, err := v.Hydrate(ctx, qu)
				if err != nil {
					b.Fatal(err)
				}
				ids := make([]string, 0, 50)
				for _, r := range res.Values["issue"][:50] {
					ids = append(ids, r.Get("id").(string))
				}
				rows, i := 0, 0
				for b.Loop() {
					id := ids[i%len(ids)]
					i++
					old := readIssue(b, tx, id)
					if _, err := tx.ExecContext(ctx, `UPDATE issue SET modified = ?, title = 'zz' || title WHERE id = ?`, 2e12+float64(i), id); err != nil {
						b.Fatal(err)
					}
					c := Change{Table: "issue", Old: old, New: readIssue(b, tx, id)}
					if mode != "rehydrate" {
						d, err := v.Update(ctx, qu, []Change{c})
						if err != nil {
							b.Fatal(err)
						}
						rows += d.RowsRead
					} else {
						res, err := q.Hydrate(ctx, tx)
						if err != nil {
							b.Fatal(err)
						}
						rows += res.RowsRead
					}
				}
				b.ReportMetric(float64(rows)/float64(i), "rows/op")
			})
		}
	}
}
