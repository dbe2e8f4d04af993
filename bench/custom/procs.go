package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/producers/pglocal"
)

const (
	appID       = "zero"
	publication = "zpeer_pub"
	// clientDir is the e2e client install: Node 22, the Zero package and
	// api-server.mjs.
	clientDir = "e2e/client"
)

// proc is a child process in its own process group, its stderr kept as
// JSON log records (or plain lines).
type proc struct {
	name  string
	cmd   *exec.Cmd
	log   *logWatch
	stdin io.Closer // api-server.mjs stops when it closes
	done  chan struct{}
	err   error
	base  string // http://127.0.0.1:PORT
}

func startProc(name string, cmd *exec.Cmd, dir string) (*proc, error) {
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

// stop asks p to stop with SIGTERM and kills its group after 20 s (and
// what is left of it: zero-cache forks workers).
func (p *proc) stop() {
	if p.stdin != nil {
		_ = p.stdin.Close()
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
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

// waitHealthy polls GET base/ until it answers 200.
func (p *proc) waitHealthy(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		resp, err := http.Get(p.base + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was healthy:\n%s", p.name, p.err, p.log.tail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GET %s/: not healthy within %v (%v)", p.base, limit, err)
		}
	}
}

// alive reports an error when p exited.
func (p *proc) alive() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited during the benchmark (%v):\n%s", p.name, p.err, p.log.tail())
	default:
		return nil
	}
}

// startUpstream starts a throwaway Postgres and seeds it with seed.sh, with
// read rules letting anyone read every table (bench/viewsyncer's).
func startUpstream(ctx context.Context, root, shared string, issues int) (*pglocal.Cluster, string, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pg, err := pglocal.Start(ctx, pglocal.Config{Dir: filepath.Join(root, "pg"), FsyncOff: true, Logger: log})
	if err != nil {
		return nil, "", fmt.Errorf("start postgres: %w", err)
	}
	url := pg.URL("zpeer")
	if err := pg.CreateDatabase(ctx, "zpeer"); err != nil {
		_ = pg.Kill(context.WithoutCancel(ctx))
		return nil, "", err
	}
	start := time.Now()
	seed := exec.CommandContext(ctx, "bash", filepath.Join(shared, "seed.sh"), strconv.Itoa(issues))
	seed.Env = append(os.Environ(), fmt.Sprintf("PSQL=%s %s -v ON_ERROR_STOP=1 -q", filepath.Join(pglocal.DefaultBinDir, "psql"), url))
	out, err := seed.CombinedOutput()
	if err != nil {
		_ = pg.Kill(context.WithoutCancel(ctx))
		return nil, "", fmt.Errorf("seed: %w\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	fmt.Printf("seeded in %v: %s\n", time.Since(start).Round(time.Millisecond), lines[len(lines)-1])
	if err := deployPermissions(ctx, url); err != nil {
		_ = pg.Kill(context.WithoutCancel(ctx))
		return nil, "", err
	}
	return pg, url, nil
}

// deployPermissions stores in <app>.permissions what zero-deploy-permissions
// stores for rules letting anyone read every table. Only the legacy (AST)
// queries go through them.
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
func startAPIServer(ctx context.Context, node, root, upstream string) (*proc, error) {
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
	p, err := startProc("api-server", cmd, root)
	if err != nil {
		return nil, err
	}
	p.stdin = stdin
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
			p.stop()
			return nil, fmt.Errorf("api-server said %q", l)
		}
		p.base = ev.URL
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("api-server exited (%v):\n%s", p.err, p.log.tail())
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		p.stop()
		return nil, fmt.Errorf("api-server did not listen within 30s:\n%s", p.log.tail())
	}
}

// serverEnv is what both sync servers are configured with: the seeded
// upstream and the app's API server behind the query and mutate URLs.
func serverEnv(upstream, api string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ZERO_") && !strings.HasPrefix(kv, "JETSYNC_") {
			env = append(env, kv)
		}
	}
	return append(env,
		"ZERO_UPSTREAM_DB="+upstream,
		"ZERO_APP_ID="+appID,
		"ZERO_APP_PUBLICATIONS="+publication,
		"ZERO_AUTH_SECRET="+authSecret,
		"ZERO_QUERY_URL="+api+"/query",
		"ZERO_MUTATE_URL="+api+"/mutate",
	)
}

// startJetsync runs `jetsync run` with its own data folder and in-process
// NATS, and returns once its replica has the initial sync and it is healthy.
func startJetsync(ctx context.Context, bin, root, upstream, api string) (*proc, error) {
	cmd := exec.Command(bin, "run")
	cmd.Env = append(serverEnv(upstream, api),
		"JETSYNC_DATA_DIR="+filepath.Join(root, "data"),
		"ZERO_PORT=0",
		"JETSYNC_NATS_LISTEN=",
		"ZERO_LOG_FORMAT=json",
	)
	p, err := startProc("jetsync", cmd, root)
	if err != nil {
		return nil, err
	}
	rec, err := p.waitLog(ctx, "http listening", time.Minute)
	if err != nil {
		p.stop()
		return nil, err
	}
	port, _ := rec["port"].(float64)
	p.base = fmt.Sprintf("http://127.0.0.1:%d", int(port))
	if _, err := p.waitLog(ctx, "initial sync applied", 5*time.Minute); err != nil {
		p.stop()
		return nil, err
	}
	if err := p.waitHealthy(ctx, time.Minute); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// startZeroCache runs zero-cache 1.9.0 from the e2e install, as make
// e2e-reference does, with one sync worker.
func startZeroCache(ctx context.Context, node, root, upstream, api string) (*proc, error) {
	script, err := filepath.EvalSymlinks(filepath.Join(clientDir, "node_modules", ".bin", "zero-cache"))
	if err != nil {
		return nil, fmt.Errorf("zero-cache (make node-deps): %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	csPort, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(node, script)
	cmd.Env = append(serverEnv(upstream, api),
		"ZERO_REPLICA_FILE="+filepath.Join(root, "replica.db"),
		"ZERO_PORT="+strconv.Itoa(port),
		"ZERO_CHANGE_STREAMER_PORT="+strconv.Itoa(csPort),
		"ZERO_NUM_SYNC_WORKERS=1",
		"ZERO_ADMIN_PASSWORD=bench",
		"ZERO_ENABLE_TELEMETRY=false", "DO_NOT_TRACK=1",
		"ZERO_LOG_LEVEL=warn",
	)
	p, err := startProc("zero-cache", cmd, root)
	if err != nil {
		return nil, err
	}
	p.base = fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := p.waitHealthy(ctx, 3*time.Minute); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// logWatch keeps a child's log records, and copies them to a file. A line
// that is not JSON becomes a record whose line is the whole line.
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
