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
	}
}
