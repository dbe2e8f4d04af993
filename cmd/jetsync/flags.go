package main

import (
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/progress"
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
	// progressEvery paces the progress lines of long copies: initial
	// syncs, backfills and restores.
	progressEvery time.Duration
	// adminPassword is ZERO_ADMIN_PASSWORD: it opens /statz, /heapz and
	// the inspector.
	adminPassword string
	// metricsListen, when set, moves /metrics off the port to its own
	// listener.
	metricsListen string
}

func (r *roleFlags) register(fs *flag.FlagSet, e *env, port int, replicaDefault string) {
	r.common.register(fs, e)
	e.strVar(fs, &r.dataDir, "JETSYNC_DATA_DIR", DefaultDataDir)
	e.strVar(fs, &r.taskID, "ZERO_TASK_ID", "")
	rf := settingFor("ZERO_REPLICA_FILE")
	fs.StringVar(&r.replicaFile, rf.flag, e.str(rf.env, ""), rf.usageText("; default <data-dir>/"+replicaDefault))
	e.intVar(fs, &r.port, "ZERO_PORT", port)
	e.intVar(fs, &r.keepaliveMs, "ZERO_KEEPALIVE_TIMEOUT_MS", 0)
	e.durationVar(fs, &r.progressEvery, "JETSYNC_PROGRESS_INTERVAL", progress.DefaultInterval)
	e.strVar(fs, &r.metricsListen, "JETSYNC_METRICS_LISTEN", "")
	r.adminPassword = e.str("ZERO_ADMIN_PASSWORD", "")
	bindVar(fs, hidden{&r.adminPassword}, "ZERO_ADMIN_PASSWORD", "")
}

// listenHTTP binds the role's port; / answers OK once ready reports true.
func (r *roleFlags) listenHTTP(reg prometheus.Gatherer, log *slog.Logger, ready func() bool) (*httpServer, error) {
	h, err := listenHTTP(r.port, reg, log)
	if err != nil {
		return nil, err
	}
	if r.metricsListen != "" {
		if err := h.moveMetrics(r.metricsListen); err != nil {
			_ = h.Close()
			return nil, err
		}
	}
	h.logListening()
	h.SetReady(ready)
	h.keepalive = time.Duration(r.keepaliveMs) * time.Millisecond
	h.admin = adminAuth{password: r.adminPassword, dev: os.Getenv("NODE_ENV") == "development"}
	return h, nil
}

func (r *roleFlags) validate() error {
	if r.port < 0 || r.port > 65535 {
		return usageError("port %d out of range", r.port)
	}
	if r.keepaliveMs < 0 {
		return usageError("keepalive timeout %d ms is negative", r.keepaliveMs)
	}
	if r.progressEvery <= 0 {
		return usageError("progress interval %s: must be positive", r.progressEvery)
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

// note ends the -h text of -upstream-db, which differs by command.
func (u *upstreamFlags) register(fs *flag.FlagSet, e *env, note string) {
	u.upstreamDB = e.str("ZERO_UPSTREAM_DB", "")
	bindVar(fs, secret{&u.upstreamDB}, "ZERO_UPSTREAM_DB", note)
	e.strVar(fs, &u.publications, "ZERO_APP_PUBLICATIONS", "")
	e.intVar(fs, &u.copyWorkers, "ZERO_INITIAL_SYNC_TABLE_COPY_WORKERS", 0)
	e.intVar(fs, &u.streamReplicas, "JETSYNC_STREAM_REPLICAS", 0)
	e.durationVar(fs, &u.streamDuplicates, "JETSYNC_STREAM_DUPLICATES", streams.DefaultDuplicates)
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
	e.strVar(fs, &n.monitorURL, "JETSYNC_NATS_MONITOR_URL", "")
}

// replicaReady reports whether cons's replica exists: synced once, not
// being restored or rebuilt from scratch.
func replicaReady(cons *replicator.Consumer) func() bool {
	return func() bool { return cons.State().Watermark != "" }
}
