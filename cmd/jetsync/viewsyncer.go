package main

import (
	"context"
	"flag"
	"io"

	"github.com/jetsync/jetsync/internal/logkey"
)

const viewSyncerSummary = `Run a view-syncer against an external NATS server: a replica consumer with its
own SQLite replica, and the HTTP server on -port: the Zero sync endpoint
(/sync/v51/connect), / and /metrics.`

func cmdViewSyncer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetsync view-syncer", flag.ContinueOnError)
	return runConsumerRole(ctx, fs, viewSyncerRole, args, stdout, stderr)
}

var viewSyncerRole = consumerRole{
	name:        "view-syncer",
	summary:     viewSyncerSummary,
	port:        DefaultPort,
	replicaFile: "view-syncer-replica.db",
	sync:        true,
}

// consumerRole describes a role built on one replica consumer.
type consumerRole struct {
	name        string
	summary     string
	port        int
	replicaFile string
	// sync serves the Zero sync endpoint over the role's replica.
	sync bool
}

type consumerFlags struct {
	roleFlags
	natsFlags
	auth    syncFlags
	restore restoreFlags
	// demoPage serves the demo page at /demo (sync roles only).
	demoPage bool
}

func (c *consumerFlags) register(fs *flag.FlagSet, e *env, r consumerRole) {
	c.roleFlags.register(fs, e, r.port, r.replicaFile)
	c.natsFlags.register(fs, e)
	if r.sync {
		c.auth.register(fs, e)
		e.boolVar(fs, &c.demoPage, "JETSYNC_DEMO_PAGE", false)
		c.auth.crud.registerUpstream(fs, e)
	}
	c.restore.register(fs, e, false)
}

// runConsumerRole runs a replica consumer and the HTTP server against an
// external NATS server until ctx ends.
func runConsumerRole(ctx context.Context, fs *flag.FlagSet, r consumerRole, args []string, stdout, stderr io.Writer) error {
	var c consumerFlags
	e := newEnv()
	c.register(fs, e, r)
	rl, ctx, stop, err := startRole(ctx, fs, e, r.summary, args, stdout, stderr, &c.roleFlags, &c.restore)
	if err != nil {
		return err
	}
	defer stop()
	log, shard, dataDir, metrics := rl.log, rl.shard, rl.dataDir, rl.metrics

	js, closeNATS, err := c.natsFlags.connect(ctx, "jetsync "+r.name+" "+rl.id, log)
	if err != nil {
		return err
	}
	defer closeNATS()
	file := c.replica(dataDir, r.replicaFile)
	// A cold replica restores the newest snapshot first.
	hold, err := c.restore.restoreReplica(ctx, rl, js, file, 0, false)
	if err != nil {
		return err
	}
	cons, err := rl.replica(js, file, r.name, r.name+"-replica")
	if err != nil {
		return err
	}
	h, err := c.roleFlags.listenHTTP(metrics, log, replicaReady(cons))
	if err != nil {
		return err
	}
	defer h.Close()
	stages := [][]component{append([]component{{r.name, cons.Run}}, endHold(rl, hold, cons)...), {{"http", h.Run}}}
	if r.sync {
		if c.demoPage {
			serveDemoPage(h, false)
			logDemoPage(h, &c.auth, false, log)
		}
		srv, closeSrv, err := newSyncServer(ctx, h, rl, js, file, cons, c.auth)
		if err != nil {
			return err
		}
		defer closeSrv()
		// The sync server stops before the replica it reads.
		stages = append([][]component{{{"sync", srv.Run}}}, stages...)
	}
	log.Info(r.name+" running", "nats", c.displayURL(), "replica", file, logkey.Stream, shard.ChangesStream(), "port", h.Port())
	return runStages(ctx, log, stages...)
}
