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
