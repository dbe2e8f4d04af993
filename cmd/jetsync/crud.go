package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetsync/jetsync/consumers/mutagen"
)

// crudFlags are the settings of legacy CRUD mutations, which the sync
// endpoint writes upstream itself (consumers/mutagen).
type crudFlags struct {
	enabled bool
	// upstreamDB is where they are written: `run`'s upstream, or the
	// view-syncer's own ZERO_UPSTREAM_DB.
	upstreamDB  string
	maxConns    int
	limitMax    int
	limitWindow time.Duration
	timeout     time.Duration
}

func (c *crudFlags) register(fs *flag.FlagSet, e *env) {
	e.boolVar(fs, &c.enabled, "ZERO_ENABLE_CRUD_MUTATIONS", true)
	e.intVar(fs, &c.maxConns, "ZERO_UPSTREAM_MAX_CONNS", 20)
	e.intVar(fs, &c.limitMax, "ZERO_PER_USER_MUTATION_LIMIT_MAX", 0)
	c.limitWindow = e.units("ZERO_PER_USER_MUTATION_LIMIT_WINDOW_MS", time.Minute, time.Millisecond)
	bindVar(fs, units{&c.limitWindow, time.Millisecond}, "ZERO_PER_USER_MUTATION_LIMIT_WINDOW_MS", "")
	e.durationVar(fs, &c.timeout, "JETSYNC_CRUD_MUTATION_TIMEOUT", mutagen.DefaultTimeout)
	if err := c.check(); err != nil {
		e.errs = append(e.errs, err)
	}
}

func (c *crudFlags) check() error {
	if c.maxConns < 1 {
		return fmt.Errorf("ZERO_UPSTREAM_MAX_CONNS=%d: must be at least 1", c.maxConns)
	}
	if c.timeout <= 0 {
		return fmt.Errorf("JETSYNC_CRUD_MUTATION_TIMEOUT=%v: must be above zero", c.timeout)
	}
	if c.limitMax < 0 {
		return fmt.Errorf("ZERO_PER_USER_MUTATION_LIMIT_MAX=%d: must not be negative", c.limitMax)
	}
	return nil
}

// registerUpstream gives a role without an upstream of its own (the
// view-syncer) ZERO_UPSTREAM_DB, for CRUD writes only.
func (c *crudFlags) registerUpstream(fs *flag.FlagSet, e *env) {
	c.upstreamDB = e.str("ZERO_UPSTREAM_DB", "")
	bindVar(fs, secret{&c.upstreamDB}, "ZERO_UPSTREAM_DB", "; CRUD mutations are written there")
}

// mutagen returns the CRUD writer, or nil when CRUD mutations are off or
// there is no upstream to write to (they are then answered InvalidPush).
// The pool connects on first use; close closes it.
func (c *crudFlags) mutagen(ctx context.Context, rl role) (m *mutagen.Mutagen, closeFn func(), err error) {
	if !c.enabled {
		return nil, func() {}, nil
	}
	if c.upstreamDB == "" {
		rl.log.Warn("legacy CRUD mutations are refused (InvalidPush): no ZERO_UPSTREAM_DB to write them to")
		return nil, func() {}, nil
	}
	if err := c.check(); err != nil {
		return nil, nil, usageError("%v", err)
	}
	pc, err := pgxpool.ParseConfig(c.upstreamDB)
	if err != nil {
		return nil, nil, fmt.Errorf("upstream for CRUD mutations: %s", redact(err.Error()))
	}
	pc.MaxConns = int32(c.maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, fmt.Errorf("upstream for CRUD mutations: %w", err)
	}
	return mutagen.New(pool, mutagen.Config{
		AppID: rl.shard.App, Shard: rl.shard.Num,
		LimitMax: c.limitMax, LimitWindow: c.limitWindow, Timeout: c.timeout, Log: rl.log,
	}), pool.Close, nil
}
