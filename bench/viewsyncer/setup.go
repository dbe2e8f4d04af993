package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
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

func startUpstream(ctx context.Context, root, shared string, issues int) (*upstream, error) {
	pg, url, err := benchenv.StartUpstream(ctx, root, shared, issues, appID)
	if err != nil {
		return nil, err
	}
	return &upstream{pg: pg, url: url}, nil
}

// jetsync is a running `jetsync run`.
type jetsync struct {
	cmd     *exec.Cmd
	log     *benchenv.LogWatch
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
	j := &jetsync{log: benchenv.NewLogWatch(logFile), done: make(chan struct{})}
	j.cmd = exec.Command(bin, "run")
	j.cmd.Env = benchenv.ServerEnv(
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
	// The first backup snapshot follows the initial sync at once, and
	// takes a few seconds of both cores: measures start after it, in the
	// steady state, as zero-cache's were taken without litestream running.
	if !strings.Contains(extraEnv, "JETSYNC_BACKUP=off") {
		if _, err := j.waitLog(ctx, "a restorable snapshot exists", 5*time.Minute); err != nil {
			j.stop()
			return nil, err
		}
	}
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
		if rec := j.log.Find(msg); rec != nil {
			return rec, nil
		}
		select {
		case <-j.done:
			return nil, fmt.Errorf("jetsync exited (%v) before logging %q:\n%s", j.err, msg, j.log.Tail())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("jetsync did not log %q within %v:\n%s", msg, limit, j.log.Tail())
		}
	}
}

// alive reports an error when jetsync exited or logged an error.
func (j *jetsync) alive() error {
	select {
	case <-j.done:
		return fmt.Errorf("jetsync exited during the benchmark (%v):\n%s", j.err, j.log.Tail())
	default:
	}
	if rec := j.log.Level("ERROR"); rec != nil {
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

var errTimeout = errors.New("timed out")
