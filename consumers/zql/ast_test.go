package zql

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

func TestParseAST(t *testing.T) {
	col := func(name string) string { return `{"type":"column","name":"` + name + `"}` }
	lit := func(v string) string { return `{"type":"literal","value":` + v + `}` }
	cond := func(left, op, right string) string {
		return `{"type":"simple","left":` + left + `,"op":"` + op + `","right":` + right + `}`
	}
	for _, tc := range []struct {
		name, ast, want string // want: "" for success, else a substring of the error
	}{
		{"Minimal", `{"table":"issue"}`, ""},
		{"Full", `{"table":"issue","where":` + cond(col("id"), "IN", lit(`["a","b"]`)) +
			`,"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"c"}}],` +
			`"start":{"row":{"id":"a"},"exclusive":true},"limit":3,"orderBy":[["modified","desc"]]}`, ""},
		{"NotJSON", `{"table":`, "invalid AST"},
		{"TrailingData", `{"table":"issue"} {}`, "trailing"},
		{"NoTable", `{}`, "missing table"},
		{"NegativeLimit", `{"table":"issue","limit":-1}`, "negative limit"},
		{"FractionalLimit", `{"table":"issue","limit":1.5}`, "invalid AST"},
		{"BadDirection", `{"table":"issue","orderBy":[["id","up"]]}`, "direction"},
		{"ShortOrdering", `{"table":"issue","orderBy":[["id"]]}`, "want [column, direction]"},
		{"BadOperator", `{"table":"issue","where":` + cond(col("id"), "~", lit(`"a"`)) + `}`, `operator "~"`},
		{"BadConditionType", `{"table":"issue","where":{"type":"not","conditions":[]}}`, `condition type "not"`},
		{"ColumnOnRight", `{"table":"issue","where":` + cond(col("id"), "=", col("title")) + `}`, "column on the right"},
		{"MissingRight", `{"table":"issue","where":{"type":"simple","op":"=","left":` + col("id") + `}}`, "needs left and right"},
		{"InWithoutList", `{"table":"issue","where":` + cond(col("id"), "IN", lit(`"a"`)) + `}`, "needs a list"},
		{"NullInList", `{"table":"issue","where":` + cond(col("id"), "NOT IN", lit(`["a",null]`)) + `}`, "null in NOT IN"},
		{"ListForEquals", `{"table":"issue","where":` + cond(col("id"), "=", lit(`["a"]`)) + `}`, "list on the right"},
		{"ObjectLiteral", `{"table":"issue","where":` + cond(col("id"), "=", lit(`{"a":1}`)) + `}`, "is not a string"},
		{"Static", `{"table":"issue","where":` + cond(col("owner_id"), "=", `{"type":"static","anchor":"authData","field":"sub"}`) + `}`, "not bound"},
		{"LoneBackslash", `{"table":"issue","where":` + cond(col("title"), "LIKE", lit(`"a\\"`)) + `}`, "lone backslash"},
		{"NumberPattern", `{"table":"issue","where":` + cond(col("title"), "LIKE", lit(`5`)) + `}`, "not a string"},
		{"NoAlias", `{"table":"issue","related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment"}}]}`, "no alias"},
		{"CorrelationLengths", `{"table":"issue","related":[{"correlation":{"parentField":["id"],"childField":[]},"subquery":{"table":"comment","alias":"c"}}]}`, "same non-zero length"},
		{"ExistsOp", `{"table":"issue","where":{"type":"correlatedSubquery","op":"ANY","related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"c"}}}}`, `operator "ANY"`},
		{"BadSystem", `{"table":"issue","related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"system":"root","subquery":{"table":"comment","alias":"c"}}]}`, "unknown system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseAST([]byte(tc.ast))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("ParseAST = %v; want success", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidAST)):
				t.Fatalf("ParseAST = %v; want an ErrInvalidAST containing %q", err, tc.want)
			}
		})
	}
}

// TestCompile checks what Compile refuses, in zero-cache's words where it
// has its own, and what it lets through as zero-cache does.
func TestCompile(t *testing.T) {
	exists := func(sub string) string {
		return `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":` + sub + `}}}`
	}
	for _, tc := range []struct{ name, ast, want string }{
		{"UnknownTable", `{"table":"nope"}`, `table 'nope' is not one of: comment,issue,issue_label,label,user. Check the spelling and ensure that the table has a primary key.`},
		{"UnknownWhereColumn", `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"nope"},"op":"=","right":{"type":"literal","value":1}}}`, `no such column: "nope"`},
		{"UnknownOrderColumn", `{"table":"issue","orderBy":[["nope","asc"]]}`, `no such column: "nope"`},
		{"UnknownChildColumn", `{"table":"issue","related":[{"correlation":{"parentField":["id"],"childField":["nope"]},"subquery":{"table":"comment","alias":"c"}}]}`, `no such column: "nope"`},
		{"UnknownParentColumn", `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["nope"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"c"}}}}`, `no such column: "nope"`},
		{"UnknownSubqueryTable", `{"table":"issue","related":[{"correlation":{"parentField":["id"],"childField":["id"]},"subquery":{"table":"nope","alias":"c"}}]}`, `table 'nope' is not one of`},
		{"ExistsWithStart", exists(`{"table":"comment","alias":"c","orderBy":[["id","asc"]],"start":{"row":{"id":"c"},"exclusive":true}}`), "EXISTS subqueries must not have start"},
		{"ExistsWithRelated", exists(`{"table":"comment","alias":"c","related":[{"correlation":{"parentField":["issue_id"],"childField":["id"]},"subquery":{"table":"issue","alias":"i"}}]}`), "EXISTS subqueries must not have related"},
		{"ObjectInStart", `{"table":"issue","orderBy":[["title","asc"]],"start":{"row":{"title":{"a":1}},"exclusive":false}}`, "start value of title is not a string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ast, err := ParseAST([]byte(tc.ast))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Compile(benchSchema, ast); err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidAST) {
				t.Fatalf("Compile = %v; want an ErrInvalidAST containing %q", err, tc.want)
			}
		})
	}
	for _, tc := range []struct{ name, ast string }{
		// A row taken from a view carries its relationships, and may lack
		// ordering columns (compared as NULL).
		{"StartWithOtherKeys", `{"table":"issue","orderBy":[["modified","asc"]],"start":{"row":{"id":"i0000002","modified":1,"owner":{"id":"u000001"},"nope":[1]},"exclusive":true}}`},
		{"StartPartial", `{"table":"issue","orderBy":[["modified","asc"]],"start":{"row":{"modified":1},"exclusive":false}}`},
		// limit 0 makes an EXISTS constant, and a flipped one is a join
		// from the children: neither refuses a cursor.
		{"ExistsLimitZeroWithStart", exists(`{"table":"comment","alias":"c","limit":0,"start":{"row":{"id":"c"},"exclusive":true}}`)},
		{"FlippedExistsWithStart", `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","flip":true,"related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"c","start":{"row":{"id":"c"},"exclusive":true}}}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ast, err := ParseAST([]byte(tc.ast))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Compile(benchSchema, ast); err != nil {
				t.Fatalf("Compile = %v; want success", err)
			}
		})
	}
}

// FuzzParseAST checks that no input makes ParseAST, Compile or Hydrate
// panic, and that a parsed AST survives a JSON round trip.
func FuzzParseAST(f *testing.F) {
	f.Add([]byte(`{"table":"issue","where":{"type":"or","conditions":[]},"limit":2}`))
	f.Add([]byte(`{"table":"issue","start":{"row":{"modified":"x"},"exclusive":true},"orderBy":[["modified","desc"]]}`))
	if fh, err := os.Open(corpusDir + "/hydrate.jsonl"); err == nil {
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 16<<20)
		for i := 0; sc.Scan(); i++ {
			var r struct{ AST json.RawMessage }
			if json.Unmarshal(sc.Bytes(), &r) == nil && i%5 == 0 {
				f.Add([]byte(r.AST))
			}
		}
		fh.Close()
	}
	db := seedReplica(f, 40, 2, false)
	tx := readTx(f, db)
	f.Fuzz(func(t *testing.T, b []byte) {
		ast, err := ParseAST(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidAST) {
				t.Fatalf("ParseAST error %v is not an ErrInvalidAST", err)
			}
			return
		}
		enc, err := json.Marshal(ast)
		if err != nil {
			t.Fatalf("Marshal(%s) = %v", b, err)
		}
		again, err := ParseAST(enc)
		if err != nil {
			t.Fatalf("ParseAST(Marshal(ParseAST(%s))) = %v", b, err)
		}
		enc2, _ := json.Marshal(again)
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip: %s != %s", enc, enc2)
		}
		q, err := Compile(benchSchema, ast)
		if err != nil {
			return
		}
		if _, err := q.Hydrate(context.Background(), tx); err != nil {
			t.Fatalf("Hydrate(%s) = %v", b, err)
		}
	})
}
