package viewsyncer

import (
	"context"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/mutagen"
)

// pushCRUD applies a push's legacy CRUD mutations upstream, one at a time
// in the order sent (docs/protocol.md §14). A mutation that failed or was
// rate limited is answered with a transient error and the next one goes on;
// an out-of-order mutation id stops the push and fails the connection, as
// in zero-cache. The results come back through replication.
func (g *group) pushCRUD(ctx context.Context, c *conn, body *appapi.PushBody) error {
	authData := g.crudAuth(c)
	custom := g.s.api != nil && g.s.api.MutateConfigured()
	g.s.metrics.pushes.Inc()
	for _, m := range body.Mutations {
		if m.Type != "crud" {
			// The client sends one mutation per push; a mixed one is
			// refused as zero-cache's mutagen refuses a custom mutation.
			return newProtocolError(kindInvalidPush, "Only CRUD mutations are supported")
		}
		g.s.metrics.crudMutations.Inc()
		merr, err := g.s.cfg.Mutagen.Process(ctx, g.id, mutagen.Mutation{ID: m.ID, ClientID: m.ClientID, Args: m.Args}, authData, custom)
		if err != nil {
			if pe, ok := err.(*mutagen.PushError); ok {
				return newProtocolError(pe.Kind, "%s", pe.Message)
			}
			return err
		}
		if merr != nil {
			perr := newProtocolError(merr.Kind, "%s", merr.Message)
			if b, e := encodeFrame("error", perr); e == nil {
				c.enqueue(b)
			}
		}
	}
	return nil
}

// crudAuth is the authData the write rules see: the connection's current
// claims.
func (g *group) crudAuth(c *conn) map[string]any {
	unlock := g.lock()
	defer unlock()
	if ac, ok := g.cc.Conn(c.selector()); ok {
		return ac.Auth.claims
	}
	return c.claims
}
