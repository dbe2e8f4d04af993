package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
)

type upstream struct {
	pg  *pglocal.Cluster
	url string
}

func (u *upstream) close() { _ = u.pg.Kill(context.Background()) }

// startUpstream starts a throwaway Postgres, seeds it with seed.sh and
// deploys read rules letting anyone read every table.
func startUpstream(ctx context.Context, root, shared string, issues int) (*upstream, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pg, err := pglocal.Start(ctx, pglocal.Config{Dir: filepath.Join(root, "pg"), FsyncOff: true, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	u := &upstream{pg: pg, url: pg.URL("zpeer")}
	if err := pg.CreateDatabase(ctx, "zpeer"); err != nil {
		u.close()
		return nil, err
	}
	start := time.Now()
	seed := exec.CommandContext(ctx, "bash", filepath.Join(shared, "seed.sh"), strconv.Itoa(issues))
	seed.Env = append(os.Environ(), fmt.Sprintf("PSQL=%s %s -v ON_ERROR_STOP=1 -q", filepath.Join(pglocal.DefaultBinDir, "psql"), u.url))
	out, err := seed.CombinedOutput()
	if err != nil {
		u.close()
		return nil, fmt.Errorf("seed: %w\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	fmt.Printf("seeded in %v: %s\n", time.Since(start).Round(time.Millisecond), lines[len(lines)-1])
	if err := deployPermissions(ctx, u.url); err != nil {
		u.close()
		return nil, err
	}
	return u, nil
}

// deployPermissions stores in <app>.permissions what zero-deploy-permissions
// stores for the e2e app's schema (e2e/client/app/schema.mjs), whose rules
// are ANYONE_CAN on every table: read permissions deny by default, and the
// demo's own rules come only with the demo database.
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

// jetsync is a running `jetsync run`.
type jetsync struct {
	cmd     *exec.Cmd
	log     *logWatch
	done    chan struct{}
	err     error
	base    string // http://127.0.0.1:PORT
	readyIn time.Duration
}

// startJetsync runs `jetsync run` on the upstream, with its own data folder,
// in-process NATS and extraEnv (comma-separated KEY=VALUE pairs), and returns
// once its replica has applied the initial sync and its HTTP server answers.
func startJetsync(ctx context.Context, bin, root, upstreamURL, extraEnv string) (*jetsync, error) {
	logFile, err := os.Create(filepath.Join(root, "jetsync.log"))
	if err != nil {
		return nil, err
	}
	j := &jetsync{log: &logWatch{file: logFile}, done: make(chan struct{})}
	j.cmd = exec.Command(bin, "run")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ZERO_") && !strings.HasPrefix(kv, "JETSYNC_") {
			j.cmd.Env = append(j.cmd.Env, kv)
		}
	}
	j.cmd.Env = append(j.cmd.Env,
		"JETSYNC_DATA_DIR="+filepath.Join(root, "data"),
		"ZERO_UPSTREAM_DB="+upstreamURL,
		"ZERO_APP_ID="+appID,
		"ZERO_APP_PUBLICATIONS="+publication,
		"ZERO_PORT=0",
		"JETSYNC_NATS_LISTEN=",
		"ZERO_LOG_FORMAT=json",
	)
	for _, kv := range strings.Split(extraEnv, ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			j.cmd.Env = append(j.cmd.Env, kv)
		}
	}
	j.cmd.Stderr = j.log
	j.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t0 := time.Now()
	if err := j.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start jetsync: %w", err)
	}
	go func() {
		j.err = j.cmd.Wait()
		close(j.done)
		logFile.Close()
	}()
	rec, err := j.waitLog(ctx, "http listening", time.Minute)
	if err != nil {
		j.stop()
		return nil, err
	}
	port, _ := rec["port"].(float64)
	j.base = fmt.Sprintf("http://127.0.0.1:%d", int(port))
	if _, err := j.waitLog(ctx, "initial sync applied", 5*time.Minute); err != nil {
		j.stop()
		return nil, err
	}
	j.readyIn = time.Since(t0)
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := http.Get(j.base + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			j.stop()
			return nil, fmt.Errorf("GET %s/: not healthy after a minute (%v)", j.base, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return j, nil
}

func (j *jetsync) waitLog(ctx context.Context, msg string, limit time.Duration) (map[string]any, error) {
	deadline := time.Now().Add(limit)
	for {
		if rec := j.log.find(msg); rec != nil {
			return rec, nil
		}
		select {
		case <-j.done:
			return nil, fmt.Errorf("jetsync exited (%v) before logging %q:\n%s", j.err, msg, j.log.tail())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("jetsync did not log %q within %v:\n%s", msg, limit, j.log.tail())
		}
	}
}

// alive reports an error when jetsync exited or logged an error.
func (j *jetsync) alive() error {
	select {
	case <-j.done:
		return fmt.Errorf("jetsync exited during the benchmark (%v):\n%s", j.err, j.log.tail())
	default:
	}
	if rec := j.log.level("ERROR"); rec != nil {
		return fmt.Errorf("jetsync logged an error: %v", rec)
	}
	return nil
}

// stop asks jetsync to stop with SIGTERM and kills its process group after
// 20 s.
func (j *jetsync) stop() {
	_ = j.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-j.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-j.cmd.Process.Pid, syscall.SIGKILL)
		<-j.done
	}
}

type rssSample struct {
	after    string
	hwm, rss int64 // bytes
	// live is the Go heap the last GC left: half its next goal under the
	// default GOGC=100; -1 when /metrics did not say.
	live int64
}

// rss reads the process's peak (VmHWM) and current (VmRSS) resident set.
func (j *jetsync) rss(after string) rssSample {
	s := rssSample{after: after}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", j.cmd.Process.Pid))
	if err != nil {
		return s
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			s.hwm = kb << 10
		case "VmRSS:":
			s.rss = kb << 10
		}
	}
	s.live = j.metric("go_memstats_next_gc_bytes") / 2
	fmt.Printf("rss after %s: peak %d MiB, now %d MiB; Go heap live at the last GC ~%d MiB\n", after, s.hwm>>20, s.rss>>20, s.live>>20)
	return s
}

// metric reads an unlabelled gauge from /metrics; -1 when it can't.
func (j *jetsync) metric(name string) int64 {
	resp, err := http.Get(j.base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			return int64(f)
		}
	}
	return -1
}

// logWatch keeps jetsync's JSON log records, and copies them to a file.
type logWatch struct {
	file    io.Writer
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
			rec = map[string]any{"msg": string(l.partial[:i])}
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

var errTimeout = errors.New("timed out")
