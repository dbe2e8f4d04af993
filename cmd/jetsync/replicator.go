package main

import (
	"context"
	"flag"
	"io"
)

const replicatorSummary = `Run a replica consumer alone against an external NATS server: it applies the
change stream to its own SQLite replica. Serves / and /metrics on -port.`

func cmdReplicator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("jetsync replicator", flag.ContinueOnError)
	return runConsumerRole(ctx, fs, replicatorRole, args, stdout, stderr)
}

var replicatorRole = consumerRole{
	name:        "replicator",
	summary:     replicatorSummary,
	port:        DefaultPort + 2,
	replicaFile: "replicator-replica.db",
}
