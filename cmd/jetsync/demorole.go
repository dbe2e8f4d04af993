package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/jetsync/jetsync/internal/logkey"
)

const demoAPISummary = `Run the demo page's API server alone: the push endpoint (/demo/api/mutate)
that runs the demo's custom mutators against -upstream-db, for view-syncers
whose ZERO_MUTATE_URL points at it and whose JETSYNC_DEMO_PAGE serves the
page (docker-compose.yml runs it). jetsync run has the same endpoint built in.
/ answers OK.`

type demoAPIFlags struct {
	roleFlags
	upstreamDB string
}

func (c *demoAPIFlags) register(fs *flag.FlagSet, e *env) {
	c.roleFlags.register(fs, e, DefaultDemoAPIPort, "replica.db (unused)")
	e.strVar(fs, &c.upstreamDB, "ZERO_UPSTREAM_DB", "")
}

func cmdDemoAPI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c demoAPIFlags
	e := newEnv()
	fs := flag.NewFlagSet("jetsync demo-api", flag.ContinueOnError)
	c.register(fs, e)
	rl, ctx, stop, err := startRole(ctx, fs, e, demoAPISummary, args, stdout, stderr, &c.roleFlags)
	if err != nil {
		return err
	}
	defer stop()
	if c.upstreamDB == "" {
		return usageError("jetsync demo-api needs ZERO_UPSTREAM_DB (-upstream-db)")
	}
	api, err := newDemoAPI(ctx, c.upstreamDB, rl.shard.ID(), rl.log.With(logkey.Component, "demo-api"))
	if err != nil {
		return err
	}
	defer api.Close()
	h, err := c.roleFlags.listenHTTP(rl.metrics, rl.log, func() bool { return true })
	if err != nil {
		return err
	}
	defer h.Close()
	h.Handle("POST "+demoMutatePath, api)
	rl.log.Info("demo api running", "upstream", redact(c.upstreamDB), "schema", rl.shard.ID(),
		"mutate_url", fmt.Sprintf("http://127.0.0.1:%d%s", h.Port(), demoMutatePath))
	return runStages(ctx, rl.log, []component{{"http", h.Run}})
}
