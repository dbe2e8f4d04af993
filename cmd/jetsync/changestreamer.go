package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"

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

func cmdChangeStreamer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c changeStreamerFlags
	e := newEnv()
	fs := flag.NewFlagSet("jetsync change-streamer", flag.ContinueOnError)
	// zero-cache's change-streamer listens on its port + 1; doing the same
	// lets the roles share a machine with default settings.
	c.roleFlags.register(fs, e, DefaultPort+1, "backup-replica.db")
	c.upstreamFlags.register(fs, e, "upstream Postgres `URL` (required)")
	c.natsFlags.register(fs, e)
	c.backup.register(fs, e)
	c.restore.register(fs, e, true)
	if err := parseFlags(fs, e, stdout, changeStreamerSummary, args); err != nil {
		return err
	}
	if err := c.roleFlags.validate(); err != nil {
		return err
	}
	if err := c.upstreamFlags.validate(); err != nil {
		return err
	}
	if err := c.backup.validate(); err != nil {
		return err
	}
	if err := c.restore.validate(); err != nil {
		return err
	}
	if c.upstreamDB == "" {
		return usageError("change-streamer needs an upstream: set ZERO_UPSTREAM_DB or -upstream-db")
	}
	rl, ctx, stop, err := c.roleFlags.start(ctx, stderr)
	if err != nil {
		return err
	}
	defer stop()
	log, shard, dataDir, metrics := rl.log, rl.shard, rl.dataDir, rl.metrics

	nc, err := connectNATS(c.natsURL, "jetsync change-streamer "+rl.id, log)
	if err != nil {
		return err
	}
	defer drain(nc, log)
	checkSyncPolicy(ctx, c.monitorURL, log)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	scfg := c.streamConfig(shard)
	if _, _, err := streams.Ensure(ctx, js, scfg); err != nil {
		return err
	}
	log.Info("upstream", "db", redact(c.upstreamDB), "app_id", shard.App, "shard_num", shard.Num)
	src, err := c.upstreamFlags.source(rl, c.upstreamDB, scfg, js)
	if err != nil {
		return err
	}
	file := c.replica(dataDir, "backup-replica.db")
	// A change-streamer taking over restores its backup replica under the
	// purge lock.
	hold, err := c.restore.restoreReplica(ctx, rl, js, file, c.backup.reservationTTL, true)
	if err != nil {
		return err
	}
	cons, err := rl.replica(js, file, "backup", "backup-replica")
	if err != nil {
		return err
	}
	bp, err := c.backup.producer(rl, js, file, c.streamReplicas)
	if err != nil {
		return err
	}
	h, err := listenHTTP(c.port, metrics, log)
	if err != nil {
		return err
	}
	defer h.Close()
	log.Info("change-streamer running", "nats", redact(c.natsURL), "replica", file, "stream", shard.ChangesStream())
	return runStages(ctx, log,
		[]component{{"change-streamer", src.Run}},
		append([]component{{"backup-replica", cons.Run}, {"backup", bp.Run}}, endHold(rl, hold, cons)...),
		[]component{{"http", h.Run}},
	)
}
