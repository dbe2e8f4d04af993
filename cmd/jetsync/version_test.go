package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/jetsync/jetsync/consumers/viewsyncer"
)

// TestVersionBinary builds the binary as make build does and runs its
// --version and version: both print the stamped revision, the Go version and
// the view-syncer's protocol range.
func TestVersionBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "jetsync")
	build := exec.Command("go", "build", "-ldflags", "-X main.buildRevision=rev-under-test", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var first string
	for _, arg := range []string{"--version", "version", "-version"} {
		out, err := exec.Command(bin, arg).CombinedOutput()
		if err != nil {
			t.Fatalf("jetsync %s: %v\n%s", arg, err, out)
		}
		got := string(out)
		for _, want := range []string{
			"jetsync ",
			"revision: rev-under-test",
			"go: " + runtime.Version(),
			fmt.Sprintf("sync protocol: %d-%d", viewsyncer.MinServerProtocol, viewsyncer.ProtocolVersion),
		} {
			if !strings.Contains(got, want) {
				t.Errorf("jetsync %s: no %q in\n%s", arg, want, got)
			}
		}
		if first == "" {
			first = got
		} else if got != first {
			t.Errorf("jetsync %s printed\n%s\nbut --version printed\n%s", arg, got, first)
		}
	}
	if out, err := exec.Command(bin, "version", "extra").CombinedOutput(); err == nil {
		t.Errorf("jetsync version extra: want a usage error, got\n%s", out)
	}
}
