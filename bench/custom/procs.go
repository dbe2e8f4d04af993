package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
)

const (
	appID       = "zero"
	publication = "zpeer_pub"
	// clientDir is the e2e client install: Node 22, the Zero package and
	// api-server.mjs.
	clientDir = "e2e/client"
)

// nodeBin is the Node 22 that make node-deps installs (scripts/node22).
func nodeBin() (string, error) {
	out, err := exec.Command("scripts/node22", "--path").Output()
	if err != nil {
		return "", fmt.Errorf("node 22 not found (make node-deps): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// startAPIServer runs e2e/client/api-server.mjs, the app's query and mutate
// endpoints on the package's handleQueryRequest and handleMutateRequest,
// writing to upstream through its postgres.js adapter.
func startAPIServer(ctx context.Context, node, root, upstream string) (*benchenv.Proc, error) {
	cmd := exec.Command(node, "api-server.mjs", "--upstream", upstream, "--auth-secret", authSecret)
	cmd.Dir = clientDir
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	p, err := benchenv.StartProc("api-server", cmd, root)
	if err != nil {
		return nil, err
	}
	p.Stdin = stdin
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case first <- sc.Text():
			default:
			}
		}
	}()
	select {
	case l := <-first:
		var ev struct{ URL string }
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.URL == "" {
			p.Stop()
			return nil, fmt.Errorf("api-server said %q", l)
		}
		p.Base = ev.URL
		return p, nil
	case <-p.Done():
		return nil, fmt.Errorf("api-server exited (%v):\n%s", p.Err(), p.Log.Tail())
	case <-ctx.Done():
		p.Stop()
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		p.Stop()
		return nil, fmt.Errorf("api-server did not listen within 30s:\n%s", p.Log.Tail())
	}
}

// appSettings are what both sync servers are configured with: the seeded
// upstream and the app's API server behind the query and mutate URLs.
func appSettings(upstream, api string) []string {
	return []string{
		"ZERO_UPSTREAM_DB=" + upstream,
		"ZERO_APP_ID=" + appID,
		"ZERO_APP_PUBLICATIONS=" + publication,
		"ZERO_AUTH_SECRET=" + authSecret,
		"ZERO_QUERY_URL=" + api + "/query",
		"ZERO_MUTATE_URL=" + api + "/mutate",
	}
}

// startJetsync runs `jetsync run` with its own data folder and in-process
// NATS, and returns once its replica has the initial sync and it is healthy.
func startJetsync(ctx context.Context, bin, root, upstream, api string) (*benchenv.Proc, error) {
	return benchenv.StartRun(ctx, benchenv.Run{Bin: bin, Root: root, Env: appSettings(upstream, api), HealthEvery: 50 * time.Millisecond})
}

// startZeroCache runs zero-cache 1.9.0 from the e2e install, as make
// e2e-reference does, with one sync worker.
func startZeroCache(ctx context.Context, node, root, upstream, api string) (*benchenv.Proc, error) {
	script, err := filepath.EvalSymlinks(filepath.Join(clientDir, "node_modules", ".bin", "zero-cache"))
	if err != nil {
		return nil, fmt.Errorf("zero-cache (make node-deps): %w", err)
	}
	port, err := benchenv.FreePort()
	if err != nil {
		return nil, err
	}
	csPort, err := benchenv.FreePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(node, script)
	cmd.Env = append(benchenv.ServerEnv(appSettings(upstream, api)...),
		"ZERO_REPLICA_FILE="+filepath.Join(root, "replica.db"),
		"ZERO_PORT="+strconv.Itoa(port),
		"ZERO_CHANGE_STREAMER_PORT="+strconv.Itoa(csPort),
		"ZERO_NUM_SYNC_WORKERS=1",
		"ZERO_ADMIN_PASSWORD=bench",
		"ZERO_ENABLE_TELEMETRY=false", "DO_NOT_TRACK=1",
		"ZERO_LOG_LEVEL=warn",
	)
	p, err := benchenv.StartProc("zero-cache", cmd, root)
	if err != nil {
		return nil, err
	}
	p.Base = fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := p.WaitHealthy(ctx, 3*time.Minute, 50*time.Millisecond); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}
