package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/producers/pgrepl"
	"github.com/jetsync/jetsync/streams"
)

// Defaults shared by the subcommands.
const (
	DefaultDataDir    = "./jetsync-data"
	DefaultNATSURL    = "nats://127.0.0.1:4222"
	DefaultNATSListen = "127.0.0.1:4222"
	DefaultPort       = 4848
	DefaultPGBin      = "/usr/lib/postgresql/15/bin"
	DefaultDemoPGPort = 5433
	// DefaultDemoAPIPort is jetsync demo-api's, after the roles' 4848-4850.
	DefaultDemoAPIPort = 4851
)

// prepareDataDir creates the data directory. Mode 0755 rather than 0700: the
// demo Postgres under it runs as the postgres user, which must traverse it.
func prepareDataDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("data dir %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", fmt.Errorf("data dir: %w", err)
	}
	return abs, nil
}

var taskIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// taskID returns the instance's identity: given when set, else the one
// persisted in dataDir, else a new random one that is persisted there so that
// a restart keeps its durable consumers.
func taskID(dataDir, given string) (string, error) {
	if given != "" {
		// It becomes part of durable consumer names, where '.', '*', '>'
		// and spaces are not allowed.
		if !taskIDRe.MatchString(given) {
			return "", usageError("task id %q: use 1-64 of [A-Za-z0-9_-]", given)
		}
		return given, nil
	}
	path := filepath.Join(dataDir, "task-id")
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(b))
		if !taskIDRe.MatchString(id) {
			return "", fmt.Errorf("task id in %s is malformed: %q", path, id)
		}
		return id, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("read task id: %w", err)
	}
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", fmt.Errorf("new task id: %w", err)
	}
	id := hex.EncodeToString(r[:])
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("write task id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("write task id: %w", err)
	}
	return id, nil
}

// drain flushes what nc still has to send and acks to receive, and closes it.
func drain(nc *nats.Conn, log *slog.Logger) {
	if nc == nil || nc.IsClosed() {
		return
	}
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		log.Warn("nats drain", "err", err)
		nc.Close()
		return
	}
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		log.Warn("nats drain timed out")
		nc.Close()
	}
}

// checkSyncPolicy warns when an external server's JetStream does not fsync
// every write, as read from its monitoring endpoint's /varz. Without such an
// endpoint the policy can't be seen from a client, so it says so once.
func checkSyncPolicy(ctx context.Context, monitorURL string, log *slog.Logger) {
	if monitorURL == "" {
		log.Info("not checking the nats server's sync policy: no monitoring URL (JETSYNC_NATS_MONITOR_URL)")
		return
	}
	pol, err := fetchSyncPolicy(ctx, monitorURL)
	if err != nil {
		log.Warn("could not check the nats server's sync policy", "err", err)
		return
	}
	if !pol.SyncAlways {
		log.Warn("nats server does not fsync every write: an acked change can be lost if the server's machine crashes; set jetstream { sync_interval: always }",
			"sync_interval", pol.SyncInterval.String())
		return
	}
	log.Info("nats server fsyncs every write", "sync_always", true)
}

type syncPolicy struct {
	SyncInterval time.Duration
	SyncAlways   bool
}

func fetchSyncPolicy(ctx context.Context, monitorURL string) (syncPolicy, error) {
	u := strings.TrimSuffix(monitorURL, "/") + "/varz"
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return syncPolicy{}, fmt.Errorf("varz: %w", err)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return syncPolicy{}, fmt.Errorf("varz: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return syncPolicy{}, fmt.Errorf("varz: %s", resp.Status)
	}
	return parseVarz(io.LimitReader(resp.Body, 16<<20))
}

func parseVarz(r io.Reader) (syncPolicy, error) {
	var v struct {
		JetStream struct {
			Config *struct {
				SyncInterval time.Duration `json:"sync_interval"`
				SyncAlways   bool          `json:"sync_always"`
			} `json:"config"`
		} `json:"jetstream"`
	}
	if err := json.NewDecoder(r).Decode(&v); err != nil {
		return syncPolicy{}, fmt.Errorf("varz: %w", err)
	}
	if v.JetStream.Config == nil {
		return syncPolicy{}, errors.New("varz shows no jetstream config: is jetstream enabled?")
	}
	c := v.JetStream.Config
	// nats-server leaves sync_interval out for its 2-minute default.
	iv := c.SyncInterval
	if iv == 0 && !c.SyncAlways {
		iv = 2 * time.Minute
	}
	return syncPolicy{SyncInterval: iv, SyncAlways: c.SyncAlways}, nil
}

// role is what every subcommand that runs components sets up first.
type role struct {
	log     *slog.Logger
	shard   streams.Shard
	dataDir string
	id      string
	metrics *metricSet
	// progressEvery paces long copies' progress lines.
	progressEvery time.Duration
}

// start sets a role up from its flags: logger, shard, data directory and
// task ID. The context it returns ends at the first SIGINT or SIGTERM; call
// stop when done.
func (r *roleFlags) start(ctx context.Context, stderr io.Writer) (role, context.Context, context.CancelFunc, error) {
	var rl role
	log, err := r.logger(stderr)
	if err != nil {
		return rl, nil, nil, err
	}
	if rl.shard, err = r.shard(); err != nil {
		return rl, nil, nil, err
	}
	if rl.dataDir, err = prepareDataDir(r.dataDir); err != nil {
		return rl, nil, nil, err
	}
	if rl.id, err = taskID(rl.dataDir, r.taskID); err != nil {
		return rl, nil, nil, err
	}
	rl.log = log.With(logkey.TaskID, rl.id)
	rl.log.Info("jetsync starting", readVersion().attrs()...)
	rl.metrics = newMetricSet()
	rl.progressEvery = r.progressEvery
	ctx, stop := notifyContext(ctx, rl.log)
	return rl, ctx, stop, nil
}

// replica makes the role's replica consumer named name, logging and
// registering metrics as component.
func (rl role) replica(js jetstream.JetStream, file, name, component string) (*replicator.Consumer, error) {
	return replicator.New(replicator.Config{
		File:       file,
		Shard:      rl.shard,
		TaskID:     rl.id,
		Name:       name,
		Logger:     rl.log.With(logkey.Component, component),
		Registerer: rl.metrics.For(component),
	}, js)
}

// source makes the change-streamer for upstream; fence is the producer
// role's check, asked before each publish.
func (u *upstreamFlags) source(rl role, upstream string, scfg streams.Config, js jetstream.JetStream, fence func() error) (*pgrepl.Source, error) {
	return pgrepl.New(pgrepl.Config{
		UpstreamURL:   upstream,
		Shard:         rl.shard,
		Publications:  u.publicationList(),
		Stream:        scfg,
		CopyWorkers:   u.copyWorkers,
		ProgressEvery: rl.progressEvery,
		Logger:        rl.log,
		Registerer:    rl.metrics.For("change-streamer"),
		Fence:         fence,
		SpillDir:      rl.dataDir,
	}, js)
}
