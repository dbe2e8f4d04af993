package repocheck

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path"
	"sort"
	"strings"
	"testing"
)

// The layers of ARCHITECTURE.md, by a package's first path element, and
// which layers each may import. Within a layer, imports are free.
var mayImport = map[string][]string{
	"cmd":         {"*"},
	"bench":       {"*"},
	"e2e":         {"*"},
	"producers":   {"producers", "streams", "internal"},
	"consumers":   {"consumers", "projections", "streams", "internal"},
	"projections": {"projections", "streams", "internal"},
	"streams":     {"streams"}, // the package streams itself: nothing (see rootImportsNothing)
	"nats-config": {"nats-config", "internal"},
	"internal":    {"internal"},
	// Programs for users to copy: the contract and nothing else.
	"examples": {"streams"},
}

// rootImportsNothing are packages that import nothing of the module's in
// their non-test code, whatever their layer allows.
var rootImportsNothing = map[string]bool{"streams": true}

// anyLayerHelpers are test helpers with no jetsync logic that any test or
// test helper, from any layer, may use: the two that stand up a real
// server, and polling.
var anyLayerHelpers = map[string]bool{
	"nats-config/natstest": true,
	"internal/pgtest":      true,
	"internal/polltest":    true,
}

// importExceptions are known imports against the rule, each with why. The
// key is "importer -> imported", with " [test]" after the importer when
// only its _test.go files import it. An exception no longer seen fails the
// test, so that the list only shrinks.
var importExceptions = map[string]string{}

// isTestHelper reports a package that exists for tests only: its name ends
// in "test" (natstest, pgtest, backuptest, streamstest, authtest).
func isTestHelper(rel string) bool {
	return strings.HasSuffix(path.Base(rel), "test") && path.Base(rel) != "test"
}

func layerOf(rel string) string {
	first, _, _ := strings.Cut(rel, "/")
	return first
}

// importProblem says what is wrong with from importing to, or "" when the
// rule allows it. inTest is true for imports of _test.go files only.
func importProblem(from, to string, inTest bool) string {
	fl, tl := layerOf(from), layerOf(to)
	allowed, known := mayImport[fl]
	if !known {
		return "importer " + from + " is in no layer of ARCHITECTURE.md (add its top folder to the rule)"
	}
	if _, known := mayImport[tl]; !known {
		return "imported " + to + " is in no layer of ARCHITECTURE.md (add its top folder to the rule)"
	}
	if isTestHelper(to) && !inTest && !isTestHelper(from) {
		return "test helper imported by non-test code"
	}
	if (inTest || isTestHelper(from)) && anyLayerHelpers[to] {
		return ""
	}
	if !inTest && rootImportsNothing[from] {
		return from + " imports nothing of the module's"
	}
	for _, a := range allowed {
		if a == "*" || a == tl {
			return ""
		}
	}
	return fl + " may import only " + strings.Join(allowed, ", ")
}

type listedPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

// modulePackages lists every package of the module with its imports of the
// module's own packages, paths relative to the module.
func modulePackages(t *testing.T) []listedPackage {
	t.Helper()
	root := moduleRoot(t)
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,TestImports,XTestImports,Error", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	modCmd := exec.Command("go", "list", "-m")
	modCmd.Dir = root
	mod, err := modCmd.Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	prefix := strings.TrimSpace(string(mod)) + "/"
	rel := func(ps []string) []string {
		var own []string
		for _, p := range ps {
			if r, ok := strings.CutPrefix(p, prefix); ok {
				own = append(own, r)
			}
		}
		return own
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		r, ok := strings.CutPrefix(p.ImportPath, prefix)
		if !ok {
			t.Fatalf("package %s is outside module %s", p.ImportPath, prefix)
		}
		p.ImportPath = r
		p.Imports, p.TestImports, p.XTestImports = rel(p.Imports), rel(p.TestImports), rel(p.XTestImports)
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestImportsPointOneWay fails on any import of the module's own packages
// against the layer rule of ARCHITECTURE.md: cmd → producers | consumers →
// projections → streams, with streams importing nothing of ours.
func TestImportsPointOneWay(t *testing.T) {
	pkgs := modulePackages(t)
	if len(pkgs) < 20 {
		t.Fatalf("only %d packages listed: the listing is broken", len(pkgs))
	}
	seen := map[string]bool{}
	var bad []string
	for _, p := range pkgs {
		check := func(imports []string, inTest bool) {
			for _, to := range imports {
				if to == p.ImportPath {
					continue // an external test package importing the package under test
				}
				why := importProblem(p.ImportPath, to, inTest)
				if why == "" {
					continue
				}
				key := p.ImportPath
				if inTest {
					key += " [test]"
				}
				key += " -> " + to
				if _, ok := importExceptions[key]; ok {
					seen[key] = true
					continue
				}
				bad = append(bad, key+": "+why)
			}
		}
		check(p.Imports, false)
		nonTest := map[string]bool{}
		for _, i := range p.Imports {
			nonTest[i] = true
		}
		var testOnly []string
		for _, i := range append(append([]string(nil), p.TestImports...), p.XTestImports...) {
			if !nonTest[i] {
				testOnly = append(testOnly, i)
			}
		}
		check(testOnly, true)
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("import against the layer rule (ARCHITECTURE.md): %s", b)
	}
	for k := range importExceptions {
		if !seen[k] {
			t.Errorf("known exception %q no longer happens: delete it from importExceptions", k)
		}
	}
}

// TestImportRule pins the rule on examples, so that a loosened rule fails
// here even when no package happens to break it.
func TestImportRule(t *testing.T) {
	for _, c := range []struct {
		from, to string
		inTest   bool
		ok       bool
	}{
		{"cmd/jetsync", "consumers/viewsyncer", false, true},
		{"cmd/jetsync", "nats-config", false, true},
		{"nats-config", "internal/logkey", false, true},
		{"consumers/cvrstore", "internal/logkey", false, true},
		{"consumers/viewsyncer", "consumers/replicator", false, true},
		{"consumers/viewsyncer", "projections/replica", false, true},
		{"consumers/backup", "projections/replica", false, true},
		{"consumers/replicator", "internal/promreg", false, true},
		{"producers/pgrepl", "producers/pgvalue", false, true},
		{"producers/pgrepl", "streams", false, true},
		{"projections/replica", "streams", false, true},
		{"streams/streamstest", "streams", false, true},
		{"nats-config/natstest", "nats-config", false, true},
		{"consumers/backup/backuptest", "nats-config/natstest", false, true},
		{"streams", "nats-config/natstest", true, true},
		{"consumers/appapi", "internal/pgtest", true, true},
		{"streams", "internal/pgtest", true, true},
		{"streams", "internal/polltest", true, true},
		{"nats-config", "internal/polltest", true, true},
		{"cmd/jetsync", "internal/pglocal", false, true},
		{"internal/pgtest", "internal/pglocal", false, true},
		{"producers/pgrepl", "streams/streamstest", true, true},

		{"producers/backup", "projections/replica", false, false},
		{"producers/pgrepl", "consumers/replicator", false, false},
		{"producers/pgrepl", "consumers/replicator", true, false},
		{"projections/replica", "consumers/replicator", false, false},
		{"projections/cvr", "producers/pgvalue", false, false},
		{"streams", "internal/promreg", false, false},
		{"streams", "streams/streamstest", false, false},
		{"streams", "consumers/replicator", true, false},
		{"consumers/replicator", "cmd/jetsync", false, false},
		{"consumers/replicator", "nats-config", false, false},
		{"consumers/replicator", "nats-config/natstest", false, false},
		{"producers/pgrepl", "consumers/backup/backuptest", true, false},
		{"internal/promreg", "streams", false, false},
		{"internal/logkey", "nats-config", false, false},
		{"producers/pgrepl", "internal/pgtest", false, false},
		{"streams", "internal/pglocal", false, false},
		{"consumers/replicator", "internal/polltest", false, false},
		{"newlayer/x", "streams", false, false},
	} {
		got := importProblem(c.from, c.to, c.inTest) == ""
		if got != c.ok {
			t.Errorf("%s -> %s (test %v): allowed %v, want %v (%s)", c.from, c.to, c.inTest, got, c.ok, importProblem(c.from, c.to, c.inTest))
		}
	}
}
