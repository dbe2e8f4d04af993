package restore

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPreallocate: the download's file gets its blocks before the first
// write and keeps its size 0, and a size no disk holds fails at once.
func TestPreallocate(t *testing.T) {
	dir := t.TempDir()
	probe, err := os.Create(filepath.Join(dir, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if err := unix.Fallocate(int(probe.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 4096); errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("%s cannot preallocate", dir)
	}

	f, err := os.Create(filepath.Join(dir, "snapshot.restore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const n = 8 << 20
	if err := preallocate(f, n); err != nil {
		t.Fatalf("preallocate: %v", err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 0 {
		t.Errorf("size %d after preallocating, want 0 until written", fi.Size())
	}
	if blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512; blocks < n {
		t.Errorf("%d bytes allocated, want at least %d", blocks, n)
	}

	if err := preallocate(f, 1<<60); err == nil {
		t.Error("preallocating 1 EiB succeeded; want ENOSPC or EFBIG before any download")
	}
}
