// Package polltest waits, in tests, for a condition that another goroutine
// or process makes true, within a deadline: the one way jetsync's tests
// poll, instead of sleeping and asserting.
package polltest

import (
	"testing"
	"time"
)

// The pause between two checks is a tenth of the time waited so far,
// within these bounds: a condition that holds after 20 ms is seen about
// 2 ms later, while a wait of seconds checks no more often than every 50
// ms, which matters when a check runs psql or a round trip to a child
// process.
const (
	minPause = time.Millisecond
	maxPause = 50 * time.Millisecond
)

// Until calls cond until it returns true, and fails the test, naming what
// it waited for, when timeout passes first.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	UntilNil(t, timeout, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// UntilNil calls f until it returns nil, and fails the test with what and
// f's last error when timeout passes first.
func UntilNil(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	start := time.Now()
	for {
		err := f()
		if err == nil {
			return
		}
		waited := time.Since(start)
		if waited > timeout {
			if err == errNotYet {
				t.Fatalf("timed out after %s waiting for %s", timeout, what)
			}
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(min(max(waited/10, minPause), maxPause))
	}
}

type notYet struct{}

func (notYet) Error() string { return "not yet" }

var errNotYet error = notYet{}
