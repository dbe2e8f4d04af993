package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/internal/pglocal"
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

func startUpstream(ctx context.Context, root, data string, issues int) (*upstream, error) {
	pg, url, err := benchenv.StartUpstream(ctx, root, data, issues, appID)
	if err != nil {
		return nil, err
	}
	return &upstream{pg: pg, url: url}, nil
}

// jetsync is a running `jetsync run`.
type jetsync struct {
	*benchenv.Proc
	readyIn time.Duration
}

// startJetsync runs `jetsync run` on the upstream, with its own data folder,
// in-process NATS and extraEnv (comma-separated KEY=VALUE pairs), and returns
// once its replica has applied the initial sync and its HTTP server answers.
func startJetsync(ctx context.Context, bin, root, upstreamURL, extraEnv string) (*jetsync, error) {
	t0 := time.Now()
	// The measures start after the first backup snapshot, in the steady
	// state, as zero-cache's were taken without litestream running.
	p, err := benchenv.StartRun(ctx, benchenv.Run{
		Bin: bin, Root: root, Extra: extraEnv, AfterBackup: true,
		Env: []string{"ZERO_UPSTREAM_DB=" + upstreamURL, "ZERO_APP_ID=" + appID, "ZERO_APP_PUBLICATIONS=" + publication},
	})
	if err != nil {
		return nil, err
	}
	ready, _ := p.Log.At("initial sync applied")
	return &jetsync{Proc: p, readyIn: ready.Sub(t0)}, nil
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
	var err error
	if s.hwm, s.rss, err = benchenv.Mem(j.Cmd.Process.Pid); err != nil {
		return s
	}
	s.live = j.metric("go_memstats_next_gc_bytes") / 2
	fmt.Printf("rss after %s: peak %d MiB, now %d MiB; Go heap live at the last GC ~%d MiB\n", after, s.hwm>>20, s.rss>>20, s.live>>20)
	return s
}

// metric reads a gauge from /metrics, the first series of it; -1 when it
// can't.
func (j *jetsync) metric(name string) int64 {
	resp, err := http.Get(j.Base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		// jetsync run labels each component's metrics: name{...} value.
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			v := rest[strings.LastIndexByte(rest, ' ')+1:]
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

// cpu is the CPU time (user and system) the jetsync process used so far;
// 0 when /proc does not say.
func (j *jetsync) cpu() time.Duration {
	d, _ := benchenv.CPUTime(j.Cmd.Process.Pid)
	return d
}
