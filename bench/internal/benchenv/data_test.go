package benchenv

import (
	"os"
	"path/filepath"
	"testing"
)

// The default -bench-data resolves from the module root, whatever folder of
// the repository go run starts in.
func TestDataDirFromModuleRoot(t *testing.T) {
	want, err := filepath.Abs(filepath.Join("..", "..", "..", DefaultData))
	if err != nil {
		t.Fatal(err)
	}
	got, err := DataDir(DefaultData)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("DataDir(%q) = %s, want %s", DefaultData, got, want)
	}
	if _, err := DataDir(filepath.Join(t.TempDir(), "nothing")); err == nil {
		t.Fatal("DataDir of a folder without seed.sh: no error")
	}
	// A relative folder that exists from the working directory wins.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "seed.sh"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	rel, err := filepath.Rel(wd, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DataDir(rel); err != nil || got != dir {
		t.Fatalf("DataDir(%q) = %s, %v; want %s", rel, got, err, dir)
	}
}
