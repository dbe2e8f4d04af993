package viewsyncer

import (
	"time"

	"github.com/jetsync/jetsync/consumers/cvrstore"
)

// DefaultCVRPruneAge is how long a loaded group keeps the records that only
// a returning client's catch-up needs (cvrstore.CVR.Prune): a client gone
// longer starts over (ClientNotFound) if something it missed was pruned.
const DefaultCVRPruneAge = 24 * time.Hour

// pruneEvery spaces one group's prune passes, which also note the CVR's
// version (cvrstore.CVR.MarkVersion): a record's age is known to this
// precision.
const pruneEvery = time.Minute

// prune drops the group's CVR records older than the prune age that no
// connected client's cookie needs. It runs from the maintenance loop, on
// busy groups too, and takes the group's lock once per pruneEvery.
func (g *group) prune(now time.Time) {
	if g.s.cfg.CVRPruneAge < 0 || now.UnixNano() < g.pruneDue.Load() {
		return
	}
	g.pruneDue.Store(now.Add(pruneEvery).UnixNano())
	unlock := g.lock()
	defer unlock()
	if g.unloaded || g.broken || g.cvr == nil {
		return
	}
	g.cvr.MarkVersion(now)
	h := g.cvr.PruneHorizon(now.Add(-g.s.cfg.CVRPruneAge))
	for _, c := range g.conns {
		if c.hasBase && c.base < h {
			h = c.base
		}
	}
	p := g.cvr.Prune(h, g.ttlClock(now), func(hash string) bool { return g.pipelines[hash] != nil })
	if p != (cvrstore.Pruned{}) {
		g.count(false)
		g.log.Debug("pruned cvr records", "rows", p.Rows, "desires", p.Desires, "queries", p.Queries, "clients", p.Clients,
			"through", g.cvr.PrunedThrough)
	}
}

// errPruned is what a client whose cookie predates pruned records gets: its
// catch-up would miss deletes, so it starts over, as from a purged group.
var errPruned = newProtocolError(kindClientNotFound, "Client has been inactive too long: its cookie is older than the changes this server keeps")
