package viewsyncer

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetsync/jetsync/internal/polltest"
)

// TestServer_ReleaseAfterBigQueries checks that a group letting go of
// many rows returns memory to the OS, whether its query is removed or its
// last client leaves, and that a small query going does not.
func TestServer_ReleaseAfterBigQueries(t *testing.T) {
	var releases atomic.Int32
	e := newEnv(t, envOptions{issues: 30, releaseRows: 20, onRelease: func() { releases.Add(1) }})
	all := `{"table":"issue","orderBy":[["id","asc"]]}`
	// none checks, long enough after, that no release ran beyond want.
	none := func(name string, want int32) {
		t.Helper()
		time.Sleep(200 * time.Millisecond)
		if n := releases.Load(); n != want {
			t.Fatalf("%s: %d releases; want %d", name, n, want)
		}
	}

	c := connect(t, e, dialOpts{group: "rel", client: "c1", init: initFrame(testSchema, put("small", issue7, 0), put("all", all, 0))})
	if p := c.hydrated(); countPrefix(p, "row ") < 30 {
		t.Fatalf("hydration = %d rows; want the 30 issues and more", countPrefix(p, "row "))
	}
	none("hydrated", 0)
	c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + del("small") + `]}]`)
	c.poke()
	c.poke()
	none("small query removed", 0)
	c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + del("all") + `]}]`)
	c.poke()
	c.poke()
	polltest.Until(t, 5*time.Second, "a release once the whole table's query went", func() bool { return releases.Load() == 1 })

	d := connect(t, e, dialOpts{group: "rel2", client: "c1", init: initFrame(testSchema, put("all", all, 0))})
	d.hydrated()
	none("second group hydrated", 1)
	_ = d.ws.Close()
	polltest.Until(t, 5*time.Second, "a release once the group's last client left", func() bool { return releases.Load() == 2 })
}
