package main

import (
	"context"
	"flag"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	producerrole "github.com/jetsync/jetsync/producers/role"
	"github.com/jetsync/jetsync/streams"
)

const changeStreamerSummary = `Run the change-streamer alone against an external NATS server: Postgres
logical replication from -upstream-db into the change stream, plus the backup
replica this role keeps, restored from the newest snapshot when it is missing
or behind, and snapshotted into the object store for view-syncers to restore
(jetsync backup now asks for one). Serves / and /metrics on -port.`

type changeStreamerFlags struct {
	roleFlags
	upstreamFlags
	natsFlags
	backup  backupFlags
	restore restoreFlags
}

func (c *changeStreamerFlags) register(fs *flag.FlagSet, e *env) {
	// zero-cache's change-streamer listens on its port + 1; doing the same
	// lets the roles share a machine with default settings.
	c.roleFlags.register(fs, e, DefaultPort+1, "backup-replica.db")
	c.upstreamFlags.register(fs, e, " (required)")
	c.natsFlags.register(fs, e)
	c.backup.register(fs, e)
	c.restore.register(fs, e, true)
}

func cmdChangeStreamer(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var c changeStreamerFlags
	e := newEnv()
	fs := flag.NewFlagSet("jetsync change-streamer", flag.ContinueOnError)
	c.register(fs, e)
	rl, ctx, stop, err := startRole(ctx, fs, e, changeStreamerSummary, args, stdout, stderr, &c.roleFlags,
		&c.upstreamFlags, &c.backup, &c.restore, check(func() error {
			if c.upstreamDB == "" {
				return usageError("change-streamer needs an upstream: set ZERO_UPSTREAM_DB or -upstream-db")
			}
			return nil
		}))
	if err != nil {
		return err
	}
	defer stop()
	log, shard, dataDir, metrics := rl.log, rl.shard, rl.dataDir, rl.metrics

	js, closeNATS, err := c.natsFlags.connect(ctx, "jetsync change-streamer "+rl.id, log)
	if err != nil {
		return err
	}
	defer closeNATS()
	scfg := c.streamConfig(shard)
	// From here on ctx also ends when another change-streamer takes the
	// producer role, which stops this one as a SIGTERM would.
	ctx, fence, releaseRole, err := holdProducerRole(ctx, rl, js, scfg)
	if err != nil {
		return err
	}
	defer releaseRole(&err)
	log.Info("upstream", "db", redact(c.upstreamDB), "app_id", shard.App, "shard_num", shard.Num)
	src, err := c.upstreamFlags.source(rl, c.upstreamDB, scfg, js, fence)
	if err != nil {
		return err
	}
	file := c.replica(dataDir, "backup-replica.db")
	cons, backed, err := backedReplica(ctx, rl, js, file, "backup", "backup-replica", &c.backup, &c.restore, c.streamReplicas)
	if err != nil {
		return err
	}
	h, err := c.roleFlags.listenHTTP(metrics, log, replicaReady(cons))
	if err != nil {
		return err
	}
	defer h.Close()
	log.Info("change-streamer running", "nats", c.displayURL(), "replica", file, logkey.Stream, shard.ChangesStream())
	return runStages(ctx, log,
		[]component{{"change-streamer", src.Run}},
		backed,
		[]component{{"http", h.Run}},
	)
}

// holdProducerRole ensures the shard's stream and state bucket, then takes
// the shard's producer role (producers/role) from
// whoever holds it, before the backup replica's restore, and keeps it in the
// background. The context it returns ends when another change-streamer takes
// the role over; the process then shuts down in order and exits 0, having
// logged who took over. fence fails from the moment the takeover is seen,
// for the publisher to check. release, deferred with the command's error, stops
// the lease, gives the role up if still held, and turns the shutdown that a
// lost role caused into a clean exit.
func holdProducerRole(ctx context.Context, rl role, js jetstream.JetStream, scfg streams.Config) (context.Context, func() error, func(*error), error) {
	_, state, err := streams.Ensure(ctx, js, scfg)
	if err != nil {
		return ctx, nil, nil, err
	}
	lease, err := producerrole.Acquire(ctx, state, producerrole.Config{TaskID: rl.id, Logger: rl.log})
	if err != nil {
		return ctx, nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if lease.Run(ctx) != nil { // only a *producerrole.LostError, logged by Run
			cancel()
		}
	}()
	release := func(errp *error) {
		cancel()
		<-done
		if lease.Check() != nil {
			rl.log.Info("change-streamer stopped: it lost the producer role")
			*errp = nil
			return
		}
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer rcancel()
		if err := lease.Release(rctx); err != nil {
			// Harmless: the next change-streamer takes it over anyway.
			rl.log.Warn("could not release the producer role", "err", err)
		}
	}
	return ctx, lease.Check, release, nil
}
