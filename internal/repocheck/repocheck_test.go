package repocheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// outside matches a path to the team's reference folder beside the
// repository, which a user's clone does not have: written relative (at any
// depth), absolute, by its spec and bench subfolders, or built with
// filepath.Join (TestPatterns lists examples). Ordinary uses of the word
// ("a shared secret", "the cores are shared") do not match. The patterns
// and examples are spelled so that this file does not match itself.
var outside = regexp.MustCompile(strings.Join([]string{
	`\.\./+shared\b`,
	`/work/+[s]hared\b`,
	`\b[s]hared/+(spec|bench)\b`,
	`"\.\."\s*,\s*"[s]hared"`,
	`"[s]hared"\s*,\s*"(spec|bench)"`,
}, "|"))

// specFile matches a citation of one of the team's reference spec files by
// bare name and section (TestPatterns lists examples): a reader of the
// repository cannot open them. The project's own pages are docs/protocol.md, docs/replica.md
// and docs/query-ast.md; a path into docs/ does not match.
var specFile = regexp.MustCompile(`(^|[^/\w-])(sync-protocol|server-model|replication|query-ast|permissions|backup-and-restore)\.md\b`)

// TestNoOutsideReferences fails when a file of the repository, tracked or
// about to be (untracked and not ignored), reads or cites the reference
// folder beside it. Fixtures live in testdata/, which may say where they
// came from.
func TestNoOutsideReferences(t *testing.T) {
	root := moduleRoot(t)
	files := repoFiles(t, root)
	if len(files) < 50 {
		t.Fatalf("only %d files found under %s: the listing is broken", len(files), root)
	}
	for _, f := range files {
		if strings.HasPrefix(f, "testdata/") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			if os.IsNotExist(err) { // deleted in the work tree, not yet in the index
				continue
			}
			t.Fatal(err)
		}
		if bytes.IndexByte(b, 0) >= 0 {
			continue // binary
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := outside.FindString(line); m != "" {
				t.Errorf("%s:%d: %q refers outside the repository (use testdata/ or docs/): %s", f, i+1, m, strings.TrimSpace(line))
			}
			if m := specFile.FindStringSubmatch(line); m != nil {
				t.Errorf("%s:%d: cites %s.md, which is not in the repository (cite docs/protocol.md, docs/replica.md or docs/query-ast.md): %s", f, i+1, m[2], strings.TrimSpace(line))
			}
		}
	}
}

func TestPatterns(t *testing.T) {
	// @ stands for the folder's name.
	for _, s := range []string{
		"../@/bench/seed.sh",
		`const transcriptDir = "../../../@/spec/transcripts"`,
		"// cites (@/spec/replication.md §5)",
		`if _, err := os.Stat("/work/@/bench/seed.sh")`,
		`filepath.Join("..", "..", "@", "bench", "seed.sh")`,
		`filepath.Join(root, "@", "spec")`,
	} {
		if s = strings.ReplaceAll(s, "@", "shared"); !outside.MatchString(s) {
			t.Errorf("not caught: %s", s)
		}
	}
	for _, s := range []string{
		"// Versions are cookies (sync-@.md §6.3).",
		"// the TTL clock (server-@.md §6)",
		"Values (`replic@.md` §5)",
		"// AST (query-@.md §2).",
	} {
		s = strings.NewReplacer("sync-@", "sync-protocol", "server-@", "server-model", "query-@", "query-ast", "replic@", "replication").Replace(s)
		if !specFile.MatchString(s) {
			t.Errorf("spec citation not caught: %s", s)
		}
	}
	for _, s := range []string{
		"// AST (docs/query-ast.md §2).",
		"[`docs/replica.md`](../docs/replica.md) §4",
		"see my-replication.md",
	} {
		if specFile.MatchString(s) {
			t.Errorf("false positive: %s", s)
		}
	}
	for _, s := range []string{
		"ZERO_AUTH_SECRET is a shared secret",
		"// loadAvg: the cores are shared.",
		"clientGroupID is shared by tabs with the same storage",
		"testdata/bench/seed.sh",
		`"sharedBench"`,
	} {
		if outside.MatchString(s) {
			t.Errorf("false positive: %s", s)
		}
	}
}

// moduleRoot is the folder holding go.mod, above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatal("go.mod not found")
		}
		d = filepath.Dir(d)
	}
}

// repoFiles lists the repository's files relative to root: git's tracked
// and untracked-but-not-ignored files, or, without git (an exported tree),
// every file outside the folders that hold only local state.
func repoFiles(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		var files []string
		for _, f := range strings.Split(string(out), "\x00") {
			if f != "" {
				files = append(files, f)
			}
		}
		return files
	}
	var files []string
	skip := map[string]bool{".git": true, "node_modules": true, "bin": true, "jetsync-data": true, ".tools": true}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skip[d.Name()] {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestReadmeListsEveryPackage fails when the README's layout section does
// not name a folder that holds Go files, as `package` in backquotes.
func TestReadmeListsEveryPackage(t *testing.T) {
	root := moduleRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatal(`README.md has no "## Layout" section`)
	}
	if i := strings.Index(layout, "\n## "); i >= 0 {
		layout = layout[:i]
	}
	pkgs := map[string]bool{}
	for _, f := range repoFiles(t, root) {
		if strings.HasSuffix(f, ".go") && !strings.HasPrefix(f, "testdata/") && !strings.Contains(f, "/testdata/") {
			pkgs[filepath.ToSlash(filepath.Dir(f))] = true
		}
	}
	if len(pkgs) < 10 {
		t.Fatalf("only %d packages found: the listing is broken", len(pkgs))
	}
	for p := range pkgs {
		if !strings.Contains(layout, "| `"+p+"` |") {
			t.Errorf("README.md's layout table has no row for package %s", p)
		}
	}
}
