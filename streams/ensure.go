package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultDuplicates is the change stream's dedup window. It must outlast a
// producer restart, though exactly-once does not rest on it: a restarted
// producer skips what the stream already holds.
const DefaultDuplicates = 2 * time.Minute

// Config shapes the stream and bucket definitions.
type Config struct {
	Shard Shard
	// Replicas is the JetStream replica count: 1 on the embedded server,
	// 3 on a cluster. Zero follows the change stream (WithReplicas).
	Replicas int
	// Duplicates is the dedup window; zero means DefaultDuplicates.
	Duplicates time.Duration
	// MaxAge bounds how long history is kept; zero keeps it until purged.
	MaxAge time.Duration
}

// ChangesStreamConfig is the change stream's definition.
func (c Config) ChangesStreamConfig() jetstream.StreamConfig {
	dup := c.Duplicates
	if dup == 0 {
		dup = DefaultDuplicates
	}
	return jetstream.StreamConfig{
		Name:        c.Shard.ChangesStream(),
		Description: "jetsync change stream for shard " + c.Shard.ID(),
		Subjects:    []string{c.Shard.ChangesFilter()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		Replicas:    max(c.Replicas, 1),
		Duplicates:  dup,
		MaxAge:      c.MaxAge,
		// Messages are bounded by MaxMessageBytes plus headers.
		MaxMsgSize: MaxMessageBytes + 64<<10,
	}
}

// StateBucketConfig is the state bucket's definition.
func (c Config) StateBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      c.Shard.StateBucket(),
		Description: "jetsync upstream identity and watermarks for shard " + c.Shard.ID(),
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
		History:     1,
	}
}

// Ensure creates the change stream and state bucket, or brings existing ones
// to this definition, scaling them to c's replica count (WithReplicas).
func Ensure(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Stream, jetstream.KeyValue, error) {
	if err := c.Shard.Validate(); err != nil {
		return nil, nil, err
	}
	c, err := c.WithReplicas(ctx, js)
	if err != nil {
		return nil, nil, err
	}
	s, err := js.CreateOrUpdateStream(ctx, c.ChangesStreamConfig())
	if err != nil {
		return nil, nil, fmt.Errorf("ensure stream %s: %w", c.Shard.ChangesStream(), err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, c.StateBucketConfig())
	if err != nil {
		return nil, nil, fmt.Errorf("ensure bucket %s: %w", c.Shard.StateBucket(), err)
	}
	return s, kv, nil
}

// KeyUpstream is the state bucket key holding the producer's Upstream record.
const KeyUpstream = "upstream"

// KeyWatermark is the state bucket key where a consumer publishes a copy of
// its watermark (the truth lives in its replica).
func KeyWatermark(taskID, consumer string) string { return "watermark." + taskID + "." + consumer }

// Upstream is what the producer records about the upstream it streams from,
// under KeyUpstream. A producer that finds a different upstream, or the slot
// gone, resets the stream.
type Upstream struct {
	SystemID       string   `json:"systemID"`
	Database       string   `json:"database"`
	Slot           string   `json:"slot"`
	ReplicaVersion string   `json:"replicaVersion"`
	Publications   []string `json:"publications"`
	// ResetSeq is the stream sequence of the reset message that opens the
	// current initial sync: where a consumer with no replica starts.
	ResetSeq uint64 `json:"resetSeq"`
	// Complete is set once the initial sync is wholly in the stream.
	Complete bool `json:"complete"`
}

// ErrNoUpstream reports that no producer has recorded an upstream yet.
var ErrNoUpstream = errors.New("no upstream recorded yet")
