package syncclient

import (
	"fmt"
	"time"
)

// AllIssues is the whole issue table, as the e2e app's allIssues shape
// sends it.
var AllIssues = NewQuery(`{"table":"issue","orderBy":[["id","asc"]]}`)

// Hydration is one query's hydration as Hydrate timed it.
type Hydration struct {
	Took  time.Duration
	Rows  int // row puts received
	Bytes int // frames received
	// Del is from the del to the poke that takes the query from the got
	// queries.
	Del time.Duration
}

// Hydrate times a new group's query q from its put (in the initConnection
// sent after connected) to the pokeEnd of the poke carrying its
// gotQueriesPatch, when onGot, if not nil, is called. The query then goes
// with a del and TTL 0, so that no run's rows stay behind in the server.
func Hydrate(base, group string, q Query, onGot func()) (Hydration, error) {
	c, err := Dial(base, Options{Group: group, Client: "c", ReadBufferSize: 64 << 10})
	if err != nil {
		return Hydration{}, err
	}
	defer c.Close()
	if err := c.Expect("connected"); err != nil {
		return Hydration{}, err
	}
	c.Bytes = 0
	start := time.Now()
	if err := c.Send(InitConnection(q.Put(0))); err != nil {
		return Hydration{}, err
	}
	end, rows, err := c.WaitGot(q.Hash)
	if err != nil {
		return Hydration{}, err
	}
	h := Hydration{Took: end.Sub(start), Rows: rows, Bytes: c.Bytes}
	if onGot != nil {
		onGot()
	}
	del := time.Now()
	if err := c.Send(DelQuery(q.Hash)); err != nil {
		return h, err
	}
	if err := c.WaitGone(q.Hash); err != nil {
		return h, fmt.Errorf("await the query's removal: %w", err)
	}
	h.Del = time.Since(del)
	return h, nil
}
