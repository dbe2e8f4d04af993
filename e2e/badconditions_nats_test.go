package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// natsServer is a nats-server child process: JetStream on a file store that
// outlives the process, on a port that stays the same across restarts.
type natsServer struct {
	t    *testing.T
	bin  string
	conf string
	url  string
	addr string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

var natsServerBuild struct {
	once sync.Once
	bin  string
	err  error
}

// natsServerBin builds nats-server, at the version go.mod requires, beside
// the jetsync binary.
func natsServerBin(t *testing.T) string {
	t.Helper()
	b := &natsServerBuild
	b.once.Do(func() {
		b.bin = filepath.Join(filepath.Dir(jetsyncBin), "nats-server")
		root, err := filepath.Abs("..")
		if err != nil {
			b.err = err
			return
		}
		cmd := exec.Command("go", "build", "-o", b.bin, "github.com/nats-io/nats-server/v2")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

// startNATSServer runs nats-server with the settings of nats-config/server.conf
// that matter here (fsync on every write, 1 MB payloads) on a free port.
func startNATSServer(t *testing.T) *natsServer {
	t.Helper()
	bin := natsServerBin(t)
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	dir := t.TempDir()
	conf := filepath.Join(dir, "server.conf")
	body := fmt.Sprintf("server_name: e2e_external\nlisten: %q\nmax_payload: 1MB\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", addr, filepath.Join(dir, "store"))
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &natsServer{t: t, bin: bin, conf: conf, addr: addr, url: "nats://" + addr}
	s.start()
	t.Cleanup(func() {
		s.stop(syscall.SIGTERM)
		if t.Failed() {
			t.Logf("nats-server output:\n%s", s.out.String())
		}
	})
	return s
}

// start starts the server and waits until it accepts connections.
func (s *natsServer) start() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, "-c", s.conf)
	s.out = &syncBuffer{}
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.done = make(chan struct{})
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start nats-server: %v", err)
	}
	done := s.done
	go func() {
		s.cmd.Wait()
		close(done)
	}()
	polltest.Until(s.t, 30*time.Second, "nats-server to be ready", func() bool {
		return strings.Contains(s.out.String(), "Server is ready")
	})
}

// stop signals the server and waits for it to exit; SIGKILL leaves its
// store as a crash would (minus the machine: the page cache survives).
func (s *natsServer) stop(sig syscall.Signal) {
	s.t.Helper()
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}

// countLogs counts p's JSON log lines with this msg.
func countLogs(p *proc, msg string) int {
	return strings.Count(p.stderr.String(), fmt.Sprintf(`"msg":%q`, msg))
}

// TestBadConditions_ExternalNATSRestart runs a change-streamer and a
// replicator as child processes against a nats-server of their own, also a
// child process, and restarts that server three times under a live
// workload: SIGTERM, SIGKILL, SIGTERM, each time on the same store. The
// roles reconnect by themselves (they never exit), the stream holds every
// committed transaction once, and both replicas equal Postgres.
func TestBadConditions_ExternalNATSRestart(t *testing.T) {
	seed := crashSeed(t)
	pgBin(t)
	cluster := pgtest.Start(t)
	url := pgtest.NewDB(t, cluster)
	ctx := context.Background()
	pg, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	if _, err := pg.Exec(ctx, spineSchema+`
		INSERT INTO every (id, t, j, ai) SELECT g, 'seed ' || g, '{"seed": true}', '{1,2}' FROM generate_series(1, 2000) g;
		INSERT INTO pair SELECT 'seed-' || g, g % 5, 'v' FROM generate_series(1, 100) g;`); err != nil {
		t.Fatalf("setup: %v", err)
	}
	ns := startNATSServer(t)
	nc, err := nats.Connect(ns.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := &crashRig{
		spine: &spine{t: t, pg: pg, url: url, js: js, shard: streams.Shard{App: "zero", Num: 0}, nats: ns.url},
		root:  dataRoot(t),
		r:     rand.New(rand.NewPCG(seed, 7)),
	}
	c.file = c.replicatorReplica()
	cs := c.startStreamer()
	rep := c.startReplicator()
	polltest.Until(t, 2*time.Minute, "the initial sync", func() bool {
		u := c.upstreamRecord()
		return u != nil && u.Complete
	})
	replicaVersion := c.upstreamRecord().ReplicaVersion
	cw := startWriter(t, url, seed)

	roles := []*proc{cs, rep}
	both := func(d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			for _, p := range roles {
				runFor(t, p, 10*time.Millisecond)
			}
		}
	}
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, syscall.SIGTERM} {
		both(c.randDuration(time.Second, 2*time.Second))
		if err := cw.err; err != nil {
			t.Fatalf("writer: %v", err)
		}
		before := make([]int, len(roles))
		for j, p := range roles {
			before[j] = countLogs(p, "nats reconnected")
		}
		ns.stop(sig)
		// Down for a while: the change-streamer's publishes fail and it
		// backs off; the replicator's pulls go unanswered.
		both(c.randDuration(300*time.Millisecond, 1500*time.Millisecond))
		ns.start()
		for j, p := range roles {
			polltest.Until(t, time.Minute, fmt.Sprintf("%v to reconnect after restart %d", p.cmd.Args[1:], i+1), func() bool {
				if p.exited() {
					t.Fatalf("%v exited: %v\n%s", p.cmd.Args, p.err, p.stderr.String())
				}
				return countLogs(p, "nats reconnected") > before[j]
			})
		}
		t.Logf("restart %d (%s): both roles reconnected", i+1, sig)
	}
	both(time.Second)
	if err := cw.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("the writer committed %d transactions, %d of them big", len(cw.changes), cw.big)
	c.waitCaughtUp(2 * time.Minute)
	c.checkReplicaEqualsPostgres()
	backup := *c.spine
	backup.file = c.streamerReplica()
	backup.waitCaughtUp(2 * time.Minute)
	backup.checkReplicaEqualsPostgres()
	for _, p := range roles {
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Errorf("%v exit code %d after SIGTERM; want 0", p.cmd.Args, code)
		}
		if strings.Contains(p.stderr.String(), "panic") {
			t.Errorf("%v panicked:\n%s", p.cmd.Args, p.stderr.String())
		}
		// A message lost on the wire is read again, never taken for lost
		// history: no replica is rebuilt.
		if n := countLogs(p, "replica missed history; rebuilding it"); n > 0 {
			t.Errorf("%v rebuilt a replica %d times", p.cmd.Args[1:], n)
		}
		t.Logf("%v: %d reconnects, %d replication retries, %d gaps read again", p.cmd.Args[1:], countLogs(p, "nats reconnected"),
			countLogs(p, "replication interrupted; retrying"), countLogs(p, "change stream gap; reading again from the replica's position before rebuilding it"))
	}
	c.checkStreamExactlyOnce(cw, replicaVersion)
}
