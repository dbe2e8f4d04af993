package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/producers/pglocal"
)

// proc is a child process in its own process group, its stderr kept as
// JSON log records (or plain lines).
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *logWatch
	done chan struct{}
	err  error
	base string // http://127.0.0.1:PORT, for jetsync
}

func startProc(name string, cmd *exec.Cmd, dir string) (*proc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, log: &logWatch{file: f}, done: make(chan struct{})}
	cmd.Stderr = p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
		f.Close()
	}()
	return p, nil
}

// stop asks p to stop with SIGTERM and kills its group after 20 s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// waitLog waits for a log record whose msg is msg (or a plain line holding it).
func (p *proc) waitLog(ctx context.Context, msg string, limit time.Duration) (map[string]any, error) {
	deadline := time.Now().Add(limit)
	for {
		if rec := p.log.find(msg); rec != nil {
			return rec, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited (%v) before logging %q:\n%s", p.name, p.err, msg, p.log.tail())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s did not log %q within %v:\n%s", p.name, msg, limit, p.log.tail())
		}
	}
}

// alive reports an error when p exited or logged an error.
func (p *proc) alive() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited during the benchmark (%v):\n%s", p.name, p.err, p.log.tail())
	default:
	}
	if rec := p.log.level("ERROR"); rec != nil {
		return fmt.Errorf("%s logged an error: %v", p.name, rec)
	}
	return nil
}

// startJetsync runs `jetsync role` with env (and none of this process's
// ZERO_ or JETSYNC_ settings) and returns once its HTTP server listens.
func startJetsync(ctx context.Context, bin, dir, role string, env []string) (*proc, error) {
	cmd := exec.Command(bin, role)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ZERO_") && !strings.HasPrefix(kv, "JETSYNC_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Env = append(cmd.Env, "JETSYNC_DATA_DIR="+dir)
	p, err := startProc(role, cmd, dir)
	if err != nil {
		return nil, err
	}
	rec, err := p.waitLog(ctx, "http listening", 5*time.Minute)
	if err != nil {
		p.stop()
		return nil, err
	}
	port, _ := rec["port"].(float64)
	p.base = fmt.Sprintf("http://127.0.0.1:%d", int(port))
	return p, nil
}

// startNATS runs n nats-servers: one with nats-config/server.conf's
// settings, or the nodes of nats-config/cluster, on free 127.0.0.1 ports. It appends them to
// procs and returns their client URLs.
func startNATS(ctx context.Context, bin string, n int, dir string, procs *[]*proc) ([]string, error) {
	ports := make([][3]int, n) // client, monitor, cluster
	for i := range ports {
		for j := range ports[i] {
			port, err := freePort()
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
		pr, err := startProc(name, exec.Command(bin, args...), dir)
		if err != nil {
			return nil, err
		}
		*procs = append(*procs, pr)
		if _, err := pr.waitLog(ctx, "Server is ready", 30*time.Second); err != nil {
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// seed loads the benchmark dataset with seed.sh and lets anyone read every
// table, as bench/viewsyncer does.
func seed(ctx context.Context, o options, url string) error {
	start := time.Now()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(o.shared, "seed.sh"), strconv.Itoa(o.issues))
	cmd.Env = append(os.Environ(), fmt.Sprintf("PSQL=%s %s -v ON_ERROR_STOP=1 -q", filepath.Join(pglocal.DefaultBinDir, "psql"), url))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("seed: %w\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	fmt.Printf("seeded in %v: %s\n", time.Since(start).Round(time.Millisecond), lines[len(lines)-1])
	return deployPermissions(ctx, url)
}

// deployPermissions stores in <app>.permissions what zero-deploy-permissions
// stores for rules letting anyone read every table.
func deployPermissions(ctx context.Context, url string) error {
	anyone := `{"row":{"select":[["allow",{"type":"and","conditions":[]}]]}}`
	rules := `{"tables":{"user":` + anyone + `,"issue":` + anyone + `,"comment":` + anyone +
		`,"label":` + anyone + `,"issue_label":` + anyone + `}}`
	schema := pgx.Identifier{appID}.Sanitize()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.PgConn().Exec(ctx, `
CREATE SCHEMA IF NOT EXISTS `+schema+`;
CREATE TABLE IF NOT EXISTS `+schema+`.permissions (
	"permissions" JSONB,
	"hash" TEXT,
	"lock" BOOL PRIMARY KEY DEFAULT true CHECK (lock)
);
INSERT INTO `+schema+`.permissions (permissions, hash) VALUES ('`+rules+`', md5('`+rules+`'::jsonb::text))
	ON CONFLICT (lock) DO UPDATE SET permissions = EXCLUDED.permissions, hash = EXCLUDED.hash;
`).ReadAll()
	if err != nil {
		return fmt.Errorf("deploy permissions: %w", err)
	}
	return nil
}

// logWatch keeps a child's log records, and copies them to a file. A line
// that is not JSON becomes a record whose msg is the whole line.
type logWatch struct {
	file    *os.File
	mu      sync.Mutex
	partial []byte
	recs    []map[string]any
}

func (l *logWatch) Write(b []byte) (int, error) {
	_, _ = l.file.Write(b)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		var rec map[string]any
		if json.Unmarshal(l.partial[:i], &rec) != nil {
			rec = map[string]any{"line": string(l.partial[:i])}
		}
		l.recs = append(l.recs, rec)
		l.partial = l.partial[i+1:]
	}
}

func (l *logWatch) find(msg string) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r["msg"] == msg {
			return r
		}
		if line, ok := r["line"].(string); ok && strings.Contains(line, msg) {
			return r
		}
	}
	return nil
}

func (l *logWatch) level(level string) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r["level"] == level {
			return r
		}
	}
	return nil
}

func (l *logWatch) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.recs[max(0, len(l.recs)-20):] {
		line, _ := json.Marshal(r)
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}
