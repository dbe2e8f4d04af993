package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
)

// alive reports an error when p exited or logged an error.
func alive(p *benchenv.Proc) error { return p.AliveNoError() }

// startJetsync runs `jetsync role` with env (and none of this process's
// ZERO_ or JETSYNC_ settings) and returns once its HTTP server listens.
func startJetsync(ctx context.Context, bin, dir, role string, env []string) (*benchenv.Proc, error) {
	cmd := exec.Command(bin, role)
	cmd.Env = append(benchenv.ServerEnv(env...), "JETSYNC_DATA_DIR="+dir)
	p, err := benchenv.StartProc(role, cmd, dir)
	if err != nil {
		return nil, err
	}
	if err := p.WaitListening(ctx, 5*time.Minute); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

// natsPasswords are those of nats-config/cluster/auth.conf's users, which
// the cluster's nodes read from their environment.
var natsPasswords = map[string]string{
	"NATS_CHANGE_STREAMER_PASSWORD": "bench-change-streamer",
	"NATS_VIEW_SYNCER_PASSWORD":     "bench-view-syncer",
	"NATS_ADMIN_PASSWORD":           "bench-admin",
	"NATS_SYS_PASSWORD":             "bench-sys",
}

// natsUser is the settings that connect a role as its auth.conf user (a
// single node has no users and takes any).
func natsUser(user, passwordVar string) []string {
	return []string{"JETSYNC_NATS_USER=" + user, "JETSYNC_NATS_PASSWORD=" + natsPasswords[passwordVar]}
}

// startNATS runs n nats-servers: one with nats-config/server.conf's
// settings, or the nodes of nats-config/cluster, on free 127.0.0.1 ports. It appends them to
// procs and returns their client URLs.
func startNATS(ctx context.Context, bin string, n int, dir string, procs *[]*benchenv.Proc) ([]string, error) {
	ports := make([][3]int, n) // client, monitor, cluster
	for i := range ports {
		for j := range ports[i] {
			port, err := benchenv.FreePort()
			if err != nil {
				return nil, err
			}
			ports[i][j] = port
		}
	}
	var routes, urls []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p[2]))
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", p[0]))
	}
	for i, p := range ports {
		name := fmt.Sprintf("nats%d", i+1)
		conf, err := filepath.Abs(filepath.Join("nats-config", "cluster", fmt.Sprintf("node%d.conf", i+1)))
		if err != nil {
			return nil, err
		}
		args := []string{"-c", conf, "-sd", filepath.Join(dir, name)}
		if n == 1 {
			// nats-config/server.conf's settings; it names its own store.
			conf = filepath.Join(dir, "server.conf")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			body := fmt.Sprintf("server_name: %s\nmax_payload: 1MB\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", name, filepath.Join(dir, name))
			if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
				return nil, err
			}
			args = []string{"-c", conf}
		}
		args = append(args, "-a", "127.0.0.1", "-p", strconv.Itoa(p[0]), "-m", strconv.Itoa(p[1]))
		if n > 1 {
			args = append(args, "--cluster", routes[i], "--routes", strings.Join(routes, ","))
		}
		cmd := exec.Command(bin, args...)
		cmd.Env = os.Environ()
		for k, v := range natsPasswords {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		pr, err := benchenv.StartProc(name, cmd, dir)
		if err != nil {
			return nil, err
		}
		*procs = append(*procs, pr)
		if _, err := pr.WaitLog(ctx, "Server is ready", 30*time.Second); err != nil {
			return nil, err
		}
	}
	return urls, nil
}

// waitJetStream waits until JetStream answers (on a cluster: a meta leader
// is elected).
func waitJetStream(ctx context.Context, js jetstream.JetStream) error {
	deadline := time.Now().Add(time.Minute)
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("jetstream not ready after a minute: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// natsServerBin returns bin, building it first from the nats-server version
// go.mod requires, as the e2e topology tests do, when it is missing.
func natsServerBin(bin string) (string, error) {
	bin, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build nats-server: %w\n%s", err, out)
	}
	return bin, nil
}
