package pgrepl

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/streams"
)

// DefaultCopyWorkers is zero-cache's ZERO_INITIAL_SYNC_TABLE_COPY_WORKERS
// default. On two cores 1, 2 and 5 workers copy equally fast (CPU-bound on
// value conversion); more help when the upstream is remote.
const DefaultCopyWorkers = 5

const (
	// maxPending bounds the publishes awaiting a PubAck. Small, so that
	// a backlog collects in the event queue, where it is packed, rather than
	// in flight.
	maxPending = 64
	// statusInterval is how often a standby status update is sent
	// when nothing else prompts one.
	statusInterval = 10 * time.Second
	// queueLen bounds the decoded events between the replication
	// reader and the publisher.
	queueLen = 4096
)

// Config configures a Source.
type Config struct {
	// UpstreamURL is the upstream database (ZERO_UPSTREAM_DB).
	UpstreamURL string
	// Shard names the app and shard (ZERO_APP_ID, ZERO_SHARD_NUM).
	Shard streams.Shard
	// Publications are the user's publications (ZERO_APP_PUBLICATIONS);
	// empty means the default _<app>_public_<shard>, created on demand.
	Publications []string
	// Stream is passed to streams.Ensure. Its Shard is set from Shard.
	Stream streams.Config
	// CopyWorkers is the number of parallel COPY connections of an initial
	// sync; zero means DefaultCopyWorkers.
	CopyWorkers int
	// ProgressEvery is how often an initial sync, or a table's copy after
	// a schema change, logs its progress; zero means
	// progress.DefaultInterval.
	ProgressEvery time.Duration
	Logger        *slog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Fence, when set, is called before each publish; an error stops the
	// publish and the session. The change-streamer passes its producer
	// role's check, so that one replaced by a newer change-streamer
	// publishes nothing more even before its context ends (the stream's
	// expected last sequence stays the final fence).
	Fence func() error
	// SpillDir holds the transactions Postgres streams before their
	// commit, until it (files unlinked on creation); "" is the system's
	// temp directory.
	SpillDir string
}

var publicationRe = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// Validate checks c as zero-cache checks the same settings.
func (c Config) Validate() error {
	if c.UpstreamURL == "" {
		return errors.New("pgrepl: upstream URL is required")
	}
	if err := c.Shard.Validate(); err != nil {
		return fmt.Errorf("pgrepl: %w", err)
	}
	for _, p := range c.Publications {
		if !publicationRe.MatchString(p) || len(p) > 63 {
			return fmt.Errorf("pgrepl: invalid publication name %q", p)
		}
		if p[0] == '_' {
			return fmt.Errorf("pgrepl: publication names starting with '_' are reserved for internal use: %q", p)
		}
	}
	if c.CopyWorkers < 0 {
		return errors.New("pgrepl: CopyWorkers must not be negative")
	}
	if c.ProgressEvery < 0 {
		return errors.New("pgrepl: ProgressEvery must not be negative")
	}
	return nil
}
