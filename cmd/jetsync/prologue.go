package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/telemetry"
	"github.com/jetsync/jetsync/streams"
)

// flagGroup is a group of a subcommand's flags that checks itself once
// parsed.
type flagGroup interface{ validate() error }

// check is a flagGroup made of a function, for a subcommand's own rule.
type check func() error

func (c check) validate() error { return c() }

// startRole is the prologue of every subcommand that runs a role: it parses
// args into fs (the caller has registered its flags), validates rf and then
// each group in order, and starts the role (logger, shard, data directory,
// task ID, and a context that ends at SIGINT or SIGTERM). Call stop when
// done.
func startRole(ctx context.Context, fs *flag.FlagSet, e *env, summary string, args []string, stdout, stderr io.Writer, rf *roleFlags, groups ...flagGroup) (role, context.Context, context.CancelFunc, error) {
	if err := parseFlags(fs, e, stdout, summary, args); err != nil {
		return role{}, ctx, nil, err
	}
	for _, g := range append([]flagGroup{rf}, groups...) {
		if err := g.validate(); err != nil {
			return role{}, ctx, nil, err
		}
	}
	// The shard is checked again, with its error, by start.
	notes, err := checkSettings(strings.TrimPrefix(fs.Name(), "jetsync "), fs, e, streams.Shard{App: rf.appID, Num: rf.shardNum})
	if err != nil {
		return role{}, ctx, nil, err
	}
	rl, ctx, stop, err := rf.start(ctx, stderr)
	if err != nil {
		return rl, ctx, stop, err
	}
	tel, err := telemetry.Start(ctx, telemetry.Options{
		Worker:   strings.TrimPrefix(fs.Name(), "jetsync "),
		Version:  readVersion().Module,
		Gatherer: rl.metrics,
		Log:      rl.log,
	})
	if err != nil {
		stop()
		return rl, ctx, nil, usageError("%v", err)
	}
	stopRole := stop
	stop = func() {
		stopRole()
		// What is pending is exported before the process exits.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			rl.log.Warn("OpenTelemetry shutdown", "err", err)
		}
	}
	for _, n := range notes {
		if n.why == "" {
			rl.log.Info(n.msg, "setting", n.env)
			continue
		}
		rl.log.Info(n.msg, "setting", n.env, "why", n.why)
	}
	return rl, ctx, stop, nil
}

// connect connects to the external NATS server as name, checks its sync
// policy, and opens JetStream. Call closeNATS when done: it drains the
// connection.
func (n *natsFlags) connect(ctx context.Context, name string, log *slog.Logger) (js jetstream.JetStream, closeNATS func(), err error) {
	nc, err := n.dial(name, log, true)
	if err != nil {
		return nil, nil, err
	}
	closeNATS = func() { drain(nc, log) }
	checkSyncPolicy(ctx, n.monitorURL, log)
	if js, err = jetstream.New(nc); err != nil {
		closeNATS()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return js, closeNATS, nil
}
