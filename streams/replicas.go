package streams

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultClusterReplicas is the replica count on a NATS cluster of three or
// more servers when none is configured.
const DefaultClusterReplicas = 3

// WithReplicas resolves c.Replicas for the Ensure functions. A positive
// count is kept: every stream, KV bucket and object store is created with
// it, or scaled to it. Zero follows the change stream: the roles that don't
// define it (view-syncers, restorers) leave the count to the one that does
// (the change-streamer), so that they never scale its resources back and
// forth. Without a change stream yet, zero is 1 on a single server and
// DefaultClusterReplicas (capped at the servers known) on a cluster.
//
// Scaling is the server's job and safe to ask for at any time: an update of
// a stream's Replicas keeps its leader when scaling down, catches new peers
// up from the leader when scaling up, and moves the stream's durable
// consumers along (jetsync creates none with a replica count of its own).
// KV buckets and object stores are streams underneath, scaled the same way.
// A scale up that the cluster can't place (too few servers up) fails, and
// Ensure with it: the resource keeps its old count.
func (c Config) WithReplicas(ctx context.Context, js jetstream.JetStream) (Config, error) {
	if c.Replicas > 0 {
		return c, nil
	}
	s, err := js.Stream(ctx, c.Shard.ChangesStream())
	switch {
	case err == nil:
		c.Replicas = max(s.CachedInfo().Config.Replicas, 1)
		return c, nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return c, fmt.Errorf("replicas of %s: %w", c.Shard.ChangesStream(), err)
	}
	c.Replicas = 1
	if nc := js.Conn(); nc != nil && nc.ConnectedClusterName() != "" {
		c.Replicas = min(DefaultClusterReplicas, max(len(nc.Servers()), 1))
	}
	return c, nil
}
