package benchenv

import (
	"os"
	"testing"
	"time"
)

// TestCPUTime reads this process's CPU time around a busy loop of 100 ms,
// and fails for a process that does not exist.
func TestCPUTime(t *testing.T) {
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for t0 := time.Now(); time.Since(t0) < 100*time.Millisecond; {
	}
	after, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d < 30*time.Millisecond || d > 10*time.Second {
		t.Errorf("CPU time grew %v over a 100 ms busy loop", d)
	}
	if _, err := CPUTime(-1); err == nil {
		t.Error("CPUTime(-1) succeeded")
	}
}
