package repocheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// logMethods are the slog.Logger methods that take key-value pairs, with
// the index of their first pair.
var logMethods = map[string]int{
	"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
	"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
	"Log": 3, "With": 0,
}

// slogAttrs are slog's Attr constructors, whose first argument is a key.
var slogAttrs = map[string]bool{
	"String": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true,
	"Bool": true, "Time": true, "Duration": true, "Any": true, "Group": true,
}

// keyAliases are keys that once named a noun logkey names otherwise.
var keyAliases = map[string]string{
	"group":          "ClientGroup",
	"clientGroupID":  "ClientGroup",
	"ws":             "WSID",
	"replicaVersion": "ReplicaVersion",
	"stream_seq":     "Seq",
	"task":           "TaskID",
}

type logKeyUse struct {
	key string
	pos token.Position
}

// literalLogKeys returns the string literals that f passes as log keys:
// in key position of a logger method's pairs, or first to an slog Attr
// constructor. It reads syntax only, so it knows a logger call by its
// method name; a call of another type's Info with a string literal where
// a key would be is read as one.
func literalLogKeys(fset *token.FileSet, f *ast.File) []logKeyUse {
	var uses []logKeyUse
	lit := func(e ast.Expr) (string, bool) {
		bl, ok := e.(*ast.BasicLit)
		if !ok || bl.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(bl.Value)
		return s, err == nil
	}
	isSlogAttr := func(e ast.Expr) bool {
		c, ok := e.(*ast.CallExpr)
		if !ok {
			return false
		}
		sel, ok := c.Fun.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		x, ok := sel.X.(*ast.Ident)
		return ok && x.Name == "slog"
	}
	ast.Inspect(f, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := c.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == "slog" {
			if slogAttrs[sel.Sel.Name] && len(c.Args) > 0 {
				if k, ok := lit(c.Args[0]); ok {
					uses = append(uses, logKeyUse{k, fset.Position(c.Args[0].Pos())})
				}
			}
			return true
		}
		first, ok := logMethods[sel.Sel.Name]
		if !ok {
			return true
		}
		for i := first; i < len(c.Args); i++ {
			a := c.Args[i]
			if isSlogAttr(a) {
				continue // an Attr stands alone
			}
			if k, ok := lit(a); ok {
				uses = append(uses, logKeyUse{k, fset.Position(a.Pos())})
			}
			i++ // a key (literal, constant or variable): skip its value
		}
		return true
	})
	return uses
}

// logkeyConstants reads internal/logkey's constants: name by value.
func logkeyConstants(t *testing.T, root string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, "internal", "logkey", "logkey.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if bl, ok := vs.Values[i].(*ast.BasicLit); ok {
						v, _ := strconv.Unquote(bl.Value)
						if prev, dup := consts[v]; dup {
							t.Errorf("logkey.%s and logkey.%s are both %q", prev, name.Name, v)
						}
						consts[v] = name.Name
					}
				}
			}
		}
	}
	return consts
}

// TestLogKeysAreConstants fails when production code logs one of
// jetsync's nouns under a literal key, or under a key that once named it
// another way, instead of internal/logkey's constant: one noun, one key.
// The examples, which may import only streams, are left out.
func TestLogKeysAreConstants(t *testing.T) {
	root := moduleRoot(t)
	consts := logkeyConstants(t, root)
	if len(consts) < 10 {
		t.Fatalf("only %d constants read from internal/logkey: the parse is broken", len(consts))
	}
	var bad []string
	keys := 0
	seen := map[string]bool{}
	for _, rel := range repoFiles(t, root) {
		if seen[rel] {
			continue // listed once per stage while a merge is unresolved
		}
		seen[rel] = true
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") ||
			strings.Contains(rel, "node_modules/") || strings.HasPrefix(rel, "testdata/") {
			continue
		}
		if strings.HasPrefix(rel, "examples/") {
			continue // programs for users to copy import only streams
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, 0)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		for _, u := range literalLogKeys(fset, f) {
			keys++
			where := rel + ":" + strconv.Itoa(u.pos.Line)
			if name, ok := consts[u.key]; ok {
				bad = append(bad, where+": log key "+strconv.Quote(u.key)+" is logkey."+name)
			} else if name, ok := keyAliases[u.key]; ok {
				bad = append(bad, where+": log key "+strconv.Quote(u.key)+" names what logkey."+name+" names")
			}
		}
	}
	if keys < 50 {
		t.Fatalf("only %d literal log keys found: the scan is broken", keys)
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
}

// TestLiteralLogKeys pins the scanner on examples.
func TestLiteralLogKeys(t *testing.T) {
	src := `package p
func f() {
	log.Info("msg", "client_group", id, "took", d)
	log.With("ws", w).Debug("m", logkey.Seq, "seq-value", "rows", n)
	log.Warn("m", slog.String("seq", "x"), "err", err)
	st.Info(ctx, jetstream.WithSubjectFilter("s.>"))
	log.Log(ctx, slog.LevelInfo, "m", "task", id)
	_ = err.Error()
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range literalLogKeys(fset, f) {
		got = append(got, u.key)
	}
	want := []string{"client_group", "err", "rows", "seq", "task", "took", "ws"}
	sort.Strings(got)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("keys %v; want %v", got, want)
	}
}
