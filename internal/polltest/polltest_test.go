package polltest_test

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetsync/jetsync/internal/polltest"
)

// failTB records a fatal failure and ends its goroutine, as testing.T does.
type failTB struct {
	testing.TB
	msg string
}

func (f *failTB) Helper() {}

func (f *failTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls wait with a failTB in a goroutine of its own, so that Goexit
// ends that goroutine only, and returns the failure message ("" for none).
func run(t *testing.T, wait func(tb testing.TB)) string {
	f := &failTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wait(f)
	}()
	<-done
	return f.msg
}

func TestUntil_ReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	start := time.Now()
	msg := run(t, func(tb testing.TB) {
		polltest.Until(tb, 10*time.Second, "three calls", func() bool { return calls.Add(1) >= 3 })
	})
	if msg != "" {
		t.Fatalf("failed: %s", msg)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("cond called %d times; want 3 (Until returns at the first true)", n)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("took %s for three quick checks", took)
	}
}

func TestUntil_FailsAfterTimeout(t *testing.T) {
	var calls atomic.Int32
	start := time.Now()
	msg := run(t, func(tb testing.TB) {
		polltest.Until(tb, 200*time.Millisecond, "the moon", func() bool { calls.Add(1); return false })
	})
	took := time.Since(start)
	if want := "timed out after 200ms waiting for the moon"; msg != want {
		t.Errorf("message %q; want %q", msg, want)
	}
	if took < 200*time.Millisecond || took > 300*time.Millisecond {
		t.Errorf("gave up after %s; want just after the 200ms timeout", took)
	}
	// Pauses grow to a tenth of the time waited: about 25 checks in 200
	// ms, not one per millisecond and not one in all.
	if n := calls.Load(); n < 5 || n > 100 {
		t.Errorf("cond called %d times in %s", n, took)
	}
}

func TestUntilNil_ReportsTheLastError(t *testing.T) {
	var calls atomic.Int32
	msg := run(t, func(tb testing.TB) {
		polltest.UntilNil(tb, 100*time.Millisecond, "a leader", func() error {
			return fmt.Errorf("attempt %d: %w", calls.Add(1), errors.New("no leader"))
		})
	})
	n := calls.Load()
	if want := fmt.Sprintf("timed out after 100ms waiting for a leader: attempt %d: no leader", n); msg != want {
		t.Errorf("message %q; want %q", msg, want)
	}
	ok := run(t, func(tb testing.TB) {
		polltest.UntilNil(tb, time.Second, "nil", func() error { return nil })
	})
	if ok != "" {
		t.Errorf("failed on a nil error: %s", ok)
	}
}
