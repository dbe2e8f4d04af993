package main

import (
	"flag"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/consumers/replica"
	"github.com/jetsync/jetsync/streams"
)

// roleFlags are the settings of every long-running role.
type roleFlags struct {
	common
	dataDir     string
	taskID      string
	replicaFile string
	port        int
	// keepaliveMs is zero-cache's ZERO_KEEPALIVE_TIMEOUT_MS; 0 turns the
	// heartbeat monitor off.
	keepaliveMs int
}

func (r *roleFlags) register(fs *flag.FlagSet, e *env, port int, replicaDefault string) {
	r.common.register(fs, e)
	fs.StringVar(&r.dataDir, "data-dir", e.str("JETSYNC_DATA_DIR", DefaultDataDir), "directory for everything this instance keeps [JETSYNC_DATA_DIR]")
	fs.StringVar(&r.taskID, "task-id", e.str("ZERO_TASK_ID", ""), "instance identity, naming its durable consumers; default a random ID kept in the data dir [ZERO_TASK_ID]")
	fs.StringVar(&r.replicaFile, "replica-file", e.str("ZERO_REPLICA_FILE", ""), "SQLite replica file; default <data-dir>/"+replicaDefault+" [ZERO_REPLICA_FILE]")
	fs.IntVar(&r.port, "port", e.int("ZERO_PORT", port), "HTTP port for / (health: OK once the replica is ready), /keepalive and /metrics; 0 picks a free port [ZERO_PORT]")
	fs.IntVar(&r.keepaliveMs, "keepalive-timeout-ms", e.int("ZERO_KEEPALIVE_TIMEOUT_MS", 0), "drain once /keepalive, called once, goes uncalled this long; 0: never [ZERO_KEEPALIVE_TIMEOUT_MS]")
}

// listenHTTP binds the role's port; / answers OK once ready reports true.
func (r *roleFlags) listenHTTP(reg prometheus.Gatherer, log *slog.Logger, ready func() bool) (*httpServer, error) {
	h, err := listenHTTP(r.port, reg, log)
	if err != nil {
		return nil, err
	}
	h.SetReady(ready)
	h.keepalive = time.Duration(r.keepaliveMs) * time.Millisecond
	return h, nil
}

func (r *roleFlags) validate() error {
	if r.port < 0 || r.port > 65535 {
		return usageError("port %d out of range", r.port)
	}
	if r.keepaliveMs < 0 {
		return usageError("keepalive timeout %d ms is negative", r.keepaliveMs)
	}
	return nil
}

// replica is the replica file, made absolute under dataDir by default.
func (r *roleFlags) replica(dataDir, def string) string {
	if r.replicaFile != "" {
		return r.replicaFile
	}
	return filepath.Join(dataDir, def)
}

// upstreamFlags are the settings of the roles that run the change-streamer,
// which also defines the stream.
type upstreamFlags struct {
	upstreamDB       string
	publications     string
	copyWorkers      int
	streamReplicas   int
	streamDuplicates time.Duration
}

func (u *upstreamFlags) validate() error {
	if u.streamReplicas < 0 || u.streamReplicas > 5 {
		return usageError("stream replicas %d: want 0 (automatic) to 5", u.streamReplicas)
	}
	if u.streamDuplicates < 0 {
		return usageError("stream duplicates window %s: must not be negative", u.streamDuplicates)
	}
	return nil
}

func (u *upstreamFlags) streamConfig(shard streams.Shard) streams.Config {
	return streams.Config{Shard: shard, Replicas: u.streamReplicas, Duplicates: u.streamDuplicates}
}

func (u *upstreamFlags) register(fs *flag.FlagSet, e *env, usage string) {
	u.upstreamDB = e.str("ZERO_UPSTREAM_DB", "")
	fs.Var(secret{&u.upstreamDB}, "upstream-db", usage+" [ZERO_UPSTREAM_DB]")
	fs.StringVar(&u.publications, "app-publications", e.str("ZERO_APP_PUBLICATIONS", ""), "comma-separated publications to replicate; default one covering the public schema [ZERO_APP_PUBLICATIONS]")
	fs.IntVar(&u.copyWorkers, "initial-sync-table-copy-workers", e.int("ZERO_INITIAL_SYNC_TABLE_COPY_WORKERS", 0), "parallel table copies of an initial sync; 0 means the default (5) [ZERO_INITIAL_SYNC_TABLE_COPY_WORKERS]")
	fs.IntVar(&u.streamReplicas, "stream-replicas", e.int("JETSYNC_STREAM_REPLICAS", 0), "JetStream replicas of the streams and buckets; 0 keeps what the change stream has, or picks 1 on one server and 3 on a cluster [JETSYNC_STREAM_REPLICAS]")
	fs.DurationVar(&u.streamDuplicates, "stream-duplicates", e.duration("JETSYNC_STREAM_DUPLICATES", streams.DefaultDuplicates), "the change stream's JetStream dedup window; exactly-once does not rest on it [JETSYNC_STREAM_DUPLICATES]")
}

func (u *upstreamFlags) publicationList() []string {
	var out []string
	for p := range strings.SplitSeq(u.publications, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// natsFlags are the settings of the roles that attach to an external server.
type natsFlags struct {
	natsConn
	monitorURL string
}

func (n *natsFlags) register(fs *flag.FlagSet, e *env) {
	n.natsConn.register(fs, e)
	fs.StringVar(&n.monitorURL, "nats-monitor-url", e.str("JETSYNC_NATS_MONITOR_URL", ""), "the NATS server's monitoring endpoint `URL` (like http://127.0.0.1:8222), to check that it fsyncs every write [JETSYNC_NATS_MONITOR_URL]")
}

// replicaReady reports whether cons's replica exists: synced once, not
// being restored or rebuilt from scratch.
func replicaReady(cons *replica.Consumer) func() bool {
	return func() bool { return cons.State().Watermark != "" }
}
