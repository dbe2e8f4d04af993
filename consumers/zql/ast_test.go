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

func TestCompile(t *testing.T) {
	for _, tc := range []struct{ name, ast, want string }{
		{"UnknownTable", `{"table":"nope"}`, `unknown table "nope"`},
		{"UnknownWhereColumn", `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"nope"},"op":"=","right":{"type":"literal","value":1}}}`, "unknown column issue.nope"},
		{"UnknownOrderColumn", `{"table":"issue","orderBy":[["nope","asc"]]}`, "unknown column issue.nope"},
		{"UnknownStartColumn", `{"table":"issue","start":{"row":{"nope":1},"exclusive":false}}`, "unknown column issue.nope"},
		{"UnknownChildColumn", `{"table":"issue","related":[{"correlation":{"parentField":["id"],"childField":["nope"]},"subquery":{"table":"comment","alias":"c"}}]}`, "unknown column comment.nope"},
		{"UnknownParentColumn", `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["nope"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"c"}}}}`, "unknown column issue.nope"},
		{"UnknownSubqueryTable", `{"table":"issue","related":[{"correlation":{"parentField":["id"],"childField":["id"]},"subquery":{"table":"nope","alias":"c"}}]}`, `unknown table "nope"`},
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
