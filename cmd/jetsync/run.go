package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	natsconfig "github.com/jetsync/jetsync/nats-config"
)

const runSummary = `Run everything in one process: an embedded NATS server (JetStream files under
<data-dir>/nats, listening on -nats-listen for jetsync tail, the nats CLI and
other consumers), the change-streamer from the upstream Postgres, one SQLite
replica, and the HTTP server: the Zero sync endpoint (/sync/v51/connect), /
and /metrics. Without -upstream-db it starts
a demo Postgres under <data-dir>/postgres, with a small schema and rows,
logs how to connect to it with psql, and serves the demo page (an issue
tracker on the Zero client) at / to browsers.`

type runFlags struct {
	roleFlags
	upstreamFlags
	auth       syncFlags
	backup     backupFlags
	restore    restoreFlags
	natsListen string
	demoPGPort int
	demoPage   bool
	pgBin      string
}

func (c *runFlags) register(fs *flag.FlagSet, e *env) {
	c.roleFlags.register(fs, e, DefaultPort, "replica.db")
	c.upstreamFlags.register(fs, e, "; unset starts the demo Postgres")
	c.auth.register(fs, e)
	c.backup.register(fs, e)
	c.restore.register(fs, e, true)
	e.strVar(fs, &c.natsListen, "JETSYNC_NATS_LISTEN", DefaultNATSListen)
	e.intVar(fs, &c.demoPGPort, "JETSYNC_DEMO_PG_PORT", DefaultDemoPGPort)
	e.boolVar(fs, &c.demoPage, "JETSYNC_DEMO_PAGE", false)
	e.strVar(fs, &c.pgBin, "JETSYNC_PG_BIN", DefaultPGBin)
}

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var c runFlags
	e := newEnv()
	fs := flag.NewFlagSet("jetsync run", flag.ContinueOnError)
	c.register(fs, e)
	rl, ctx, stop, err := startRole(ctx, fs, e, runSummary, args, stdout, stderr, &c.roleFlags, &c.upstreamFlags, &c.backup, &c.restore)
	if err != nil {
		return err
	}
	defer stop()
	log, shard, dataDir, metrics := rl.log, rl.shard, rl.dataDir, rl.metrics

	ns, err := natsconfig.Start(natsconfig.Config{
		StoreDir: filepath.Join(dataDir, "nats"),
		Listen:   c.natsListen,
		Logger:   log,
	})
	if err != nil {
		return err
	}
	defer shutdownNATS(ns, log)
	if u := natsconfig.ListenURL(ns); u != "" {
		log.Info("nats listening", "url", u)
	} else {
		log.Info("nats accepts in-process connections only")
	}
	nc, err := natsconfig.Connect(ns, nats.Name("jetsync run"))
	if err != nil {
		return err
	}
	defer drain(nc, log)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	scfg := c.streamConfig(shard)
	// A change-streamer attached to the embedded server can take the
	// producer role over; this process then stops.
	ctx, fence, releaseRole, err := holdProducerRole(ctx, rl, js, scfg)
	if err != nil {
		return err
	}
	defer releaseRole(&err)

	upstream := c.upstreamDB
	if upstream == "" {
		cl, url, err := startDemo(ctx, dataDir, c.demoPGPort, c.pgBin, shard.App, log)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := cl.Stop(sctx); err != nil {
				log.Warn("stop demo postgres", "err", err)
				return
			}
			log.Info("demo postgres stopped")
		}()
		upstream = url
		log.Info("demo upstream ready: connect with psql",
			"psql", fmt.Sprintf("%s '%s'", filepath.Join(c.pgBin, "psql"), url), "url", url)
	}
	log.Info("upstream", "db", redact(upstream), "app_id", shard.App, "shard_num", shard.Num)

	src, err := c.upstreamFlags.source(rl, upstream, scfg, js, fence)
	if err != nil {
		return err
	}
	file := c.replica(dataDir, "replica.db")
	// The one replica is also the backup replica.
	cons, backed, err := backedReplica(ctx, rl, js, file, "replica", "replica", &c.backup, &c.restore, c.streamReplicas)
	if err != nil {
		return err
	}
	h, err := c.roleFlags.listenHTTP(metrics, log, replicaReady(cons))
	if err != nil {
		return err
	}
	defer h.Close()
	if c.upstreamDB == "" || c.demoPage {
		closeDemo, err := serveDemo(ctx, h, &c.auth, upstream, shard.ID(), c.upstreamDB == "", log)
		if err != nil {
			return err
		}
		defer closeDemo()
	}
	c.auth.crud.upstreamDB = upstream
	srv, closeSrv, err := newSyncServer(ctx, h, rl, js, file, cons, c.auth)
	if err != nil {
		return err
	}
	defer closeSrv()
	log.Info("jetsync running", "replica", file, logkey.Stream, shard.ChangesStream(), "data_dir", dataDir, "port", h.Port())
	return runStages(ctx, log,
		[]component{{"change-streamer", src.Run}},
		[]component{{"view-syncer", srv.Run}},
		backed,
		[]component{{"http", h.Run}},
	)
}

func shutdownNATS(ns *server.Server, log *slog.Logger) {
	ns.Shutdown()
	ns.WaitForShutdown()
	log.Info("nats server stopped")
}
