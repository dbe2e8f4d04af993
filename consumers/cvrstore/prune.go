package cvrstore

import "time"

// Pruning drops, from a loaded CVR, the records kept only so that an old
// cookie can be caught up (docs/protocol.md §6.4): row tombstones, expired
// desires, queries nobody desires or has, and deleted clients with nothing
// left. Without it a long-lived group's records only grow, and every
// catch-up walks them all. The durable store keeps them (a reload brings
// them back, to be pruned again), so pruning is a bound on memory, not on
// disk.

// versionMark says the CVR was at version at time at.
type versionMark struct {
	version string
	at      time.Time
}

// MarkVersion notes which version the CVR is at, so that a later Prune
// knows how old a record's patch version is: the caller's spacing of the
// calls is the precision.
func (c *CVR) MarkVersion(now time.Time) {
	if c.Version == "" {
		return
	}
	if n := len(c.marks); n > 0 && c.marks[n-1].version == c.Version {
		return
	}
	c.marks = append(c.marks, versionMark{c.Version, now})
}

// PruneHorizon is the newest version the CVR was at no later than cutoff;
// "" if none is known.
func (c *CVR) PruneHorizon(cutoff time.Time) string {
	h := ""
	for _, m := range c.marks {
		if m.at.After(cutoff) {
			break
		}
		h = m.version
	}
	return h
}

// Pruned is what a Prune dropped.
type Pruned struct {
	Rows, Desires, Queries, Clients int
}

// Prune drops the records whose last patch is at or before horizon and
// that only an old cookie's catch-up needs: row tombstones, desires whose
// TTL ran out at TTL clock reading clock, queries not got, not internal and
// desired by no one, and deleted clients without desires. keep reports the
// queries the caller still runs, which stay. A cookie older than the
// newest patch version pruned can no longer be caught up: PrunedThrough
// says which, and such a client must start over.
func (c *CVR) Prune(horizon string, clock float64, keep func(hash string) bool) Pruned {
	var p Pruned
	if horizon == "" {
		return p
	}
	through := c.PrunedThrough
	dropped := func(v string) {
		if v > through {
			through = v
		}
	}
	for id, r := range c.Rows {
		if r.Refs == nil && r.PatchVersion <= horizon {
			dropped(r.PatchVersion)
			delete(c.Rows, id)
			p.Rows++
		}
	}
	desired := map[string]bool{}
	for id, cl := range c.Clients {
		for hash, d := range cl.Desired {
			if d.Expired(clock) && d.PatchVersion <= horizon {
				dropped(d.PatchVersion)
				delete(cl.Desired, hash)
				p.Desires++
				continue
			}
			desired[hash] = true
		}
		if cl.Deleted && len(cl.Desired) == 0 {
			delete(c.Clients, id)
			p.Clients++
		}
	}
	for hash, q := range c.Queries {
		if q.Got || q.Internal || desired[hash] || q.PatchVersion > horizon || (keep != nil && keep(hash)) {
			continue
		}
		dropped(q.PatchVersion)
		delete(c.Queries, hash)
		delete(c.oneRef, hash)
		p.Queries++
	}
	c.PrunedThrough = through
	// Marks at or before the horizon have served.
	i := 0
	for i < len(c.marks)-1 && c.marks[i+1].version <= horizon {
		i++
	}
	c.marks = c.marks[i:]
	return p
}
