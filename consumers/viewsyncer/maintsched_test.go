package viewsyncer

import (
	"sync"
	"testing"
	"time"

	"github.com/jetsync/jetsync/internal/polltest"
)

// TestServer_MaintenanceWhenDue checks that a group with nothing to
// maintain gets a round about once a maintenanceEvery, not at every
// evictInterval tick (at 1,000 groups that was 20,000 rounds a second,
// each taking a group's lock), and that what makes work sooner still
// gets it in time: a client that leaves lets the group unload once
// GroupIdle has passed.
func TestServer_MaintenanceWhenDue(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30, groupIdle: 300 * time.Millisecond})
	var mu sync.Mutex
	rounds := map[string]int{}
	hook := func(id string) {
		mu.Lock()
		rounds[id]++
		mu.Unlock()
	}
	maintenanceHook.Store(&hook)
	t.Cleanup(func() { maintenanceHook.Store(nil) })
	count := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return rounds[id]
	}

	c := connect(t, e, dialOpts{group: "steady", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
	c.hydrated()
	start := count("steady")
	time.Sleep(2 * time.Second)
	// Every tick would be 40; one round a second, and one woken by the
	// connection's message, are at most 4.
	if n := count("steady") - start; n > 4 {
		t.Errorf("a group with nothing due had %d maintenance rounds in 2s; want at most 4", n)
	}

	_ = c.ws.Close()
	polltest.Until(t, 5*time.Second, "the idle group to unload", func() bool {
		for _, g := range e.srv.groupList() {
			if g.id == "steady" {
				return false
			}
		}
		return true
	})
}
