// Package cvrstore holds client view records: the CVR (cvr.go), the rules
// by which an update changes it and the patches that tell clients
// (update.go, patch.go), and the stores that keep it (persist.go: Mem in
// memory, Durable on JetStream).
//
// Durably, it publishes each client group's CVR updates to the CVR
// stream, loads a group by replaying its subject into the projections/cvr
// state store (a local SQLite file that caches the projection across
// restarts), compacts long histories into snapshots, and manages the
// leases that give each group one owner at a time.
//
// Two safety nets keep two view-syncers from both advancing a group: the
// lease, which tells a view-syncer to stop serving a group it lost, and
// every publish's expected last subject sequence, which JetStream checks,
// so a writer that lags behind the stream can never append.
package cvrstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/projections/cvr"
	"github.com/jetsync/jetsync/streams"
)

// Defaults.
const (
	// DefaultLeaseTTL is how long a lease lasts without renewal; Run renews
	// every third of it.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultCompactAfter is how many messages a group's subject may hold
	// beyond its last snapshot before Publish compacts it.
	DefaultCompactAfter = 1000
)

// ErrConflict reports that a group's subject moved past what this store
// loaded: another writer advanced it. The Group is then unusable; the
// caller stops serving the group (zero-cache sends Rehome).
var ErrConflict = errors.New("cvr advanced by another writer")

// ErrBroken reports a Group whose last publish failed: whether it reached
// the stream is unknown, so the group must be loaded again.
var ErrBroken = errors.New("cvr group must be reloaded")

// Config configures a Store.
type Config struct {
	JS    jetstream.JetStream
	Shard streams.Shard
	// Replicas is the JetStream replica count of the stream and bucket.
	Replicas int
	// File is the local projection's SQLite file, shared by all groups.
	File string
	// OwnerID names this view-syncer in leases and CVR messages. It must
	// be unique among live view-syncers; keeping it across a restart lets
	// the restarted process reclaim its groups at once.
	OwnerID string
	// Address is where peers forward connections for groups owned here.
	Address string
	// PeerSecret, shared by the deployment's view-syncers, signs this
	// store's lease records; OwnedError.Signed tells a peer's record that
	// checks with it. Empty signs nothing and trusts no record.
	PeerSecret []byte
	// LeaseTTL defaults to DefaultLeaseTTL. View-syncers' clocks must agree
	// to well within it, since a lease's expiry is the owner's clock.
	LeaseTTL time.Duration
	// CompactAfter defaults to DefaultCompactAfter; negative disables
	// compaction on publish.
	CompactAfter int
	// MaxMessageBytes defaults to streams.CVRMaxMessageBytes.
	MaxMessageBytes int
	// LeaseLost, if set, is called (from Run or Renew) when a lease is lost,
	// besides closing the Lease's Done channel.
	LeaseLost func(groupID string)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.CompactAfter = cmp.Or(c.CompactAfter, DefaultCompactAfter)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, streams.CVRMaxMessageBytes)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Validate checks c.
func (c Config) Validate() error {
	switch {
	case c.JS == nil:
		return errors.New("cvrstore: no JetStream")
	case c.File == "":
		return errors.New("cvrstore: no projection file")
	case c.OwnerID == "":
		return errors.New("cvrstore: no owner id")
	case c.LeaseTTL < 0:
		return errors.New("cvrstore: negative lease ttl")
	case c.MaxMessageBytes < 0 || c.MaxMessageBytes > streams.CVRMaxMessageBytes:
		return fmt.Errorf("cvrstore: max message bytes must be at most %d", streams.CVRMaxMessageBytes)
	}
	return c.Shard.Validate()
}

// Store is a view-syncer's access to the CVR stream, its local projection
// and the owners bucket. It is safe for concurrent use; each Group is used
// by one goroutine at a time.
type Store struct {
	cfg    Config
	log    *slog.Logger
	stream jetstream.Stream
	kv     jetstream.KeyValue
	// ownersStream is kv's stream, read for a record's revision even once
	// deleted.
	ownersStream jetstream.Stream
	// w is the projection's single writer; r serves State.
	w, r *sql.DB
	// stmts are the projection's statements, prepared on w's connection.
	stmts *cvr.Stmts

	// applies runs projection applies after their PubAcks (apply.go).
	applies applyQueue
	// commits gathers concurrent publishes into batches (commit.go), and
	// owners the writes of lease records (lease.go).
	commits, owners committer

	mu     sync.Mutex
	leases map[string]*Lease
	// acquiring counts Acquire calls under way per group, and purging
	// marks groups the garbage collector is purging: each keeps the other
	// off the group.
	acquiring map[string]int
	purging   map[string]bool
}

// Open ensures the CVR stream and owners bucket and opens the local
// projection. It starts no goroutine; Run renews leases.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	stream, kv, err := streams.EnsureCVR(ctx, cfg.JS, streams.Config{Shard: cfg.Shard, Replicas: cfg.Replicas})
	if err != nil {
		return nil, err
	}
	owners, err := cfg.JS.Stream(ctx, "KV_"+kv.Bucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", kv.Bucket(), err)
	}
	// A put-rows statement writes many rows, so SQLite journals each one:
	// in memory, not in a temporary file written page by page.
	w, err := sql.Open("sqlite", "file:"+cfg.File+
		"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(10000)&_pragma=temp_store(MEMORY)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", cfg.File, err)
	}
	w.SetMaxOpenConns(1)
	if err := cvr.Init(ctx, w); err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", cfg.File, err)
	}
	stmts, err := cvr.Prepare(ctx, w)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", cfg.File, err)
	}
	r, err := sql.Open("sqlite", "file:"+cfg.File+"?_pragma=busy_timeout(10000)&mode=ro")
	if err != nil {
		stmts.Close()
		w.Close()
		return nil, fmt.Errorf("open %s: %w", cfg.File, err)
	}
	r.SetMaxOpenConns(4)
	s := &Store{
		cfg:          cfg,
		log:          cfg.Logger.With(logkey.Stream, cfg.Shard.CVRStream()),
		stream:       stream,
		kv:           kv,
		ownersStream: owners,
		w:            w,
		r:            r,
		stmts:        stmts,
		leases:       map[string]*Lease{},
		acquiring:    map[string]int{},
		purging:      map[string]bool{},
	}
	s.applies.run = s.applyBatch
	s.commits.js, s.commits.timeout, s.commits.pipelined = cfg.JS, commitTimeout, maxPipelined
	// A renewal slower than this is no better than a failed one: the
	// next is due.
	s.owners.js, s.owners.timeout = cfg.JS, cfg.LeaseTTL/3
	return s, nil
}

// Close closes the local projection. Leases are left to expire; Release
// them first to hand groups over at once.
func (s *Store) Close() error {
	s.applies.waitAll()
	return errors.Join(s.r.Close(), s.stmts.Close(), s.w.Close())
}

// Forget drops a group from the local projection, so that its next Load
// replays the stream from the start.
func (s *Store) Forget(ctx context.Context, groupID string) error {
	if err := s.applies.wait(ctx, groupID); err != nil {
		return err
	}
	return cvr.Drop(ctx, s.w, groupID)
}
