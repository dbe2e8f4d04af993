// Command coldstart times a cold view-syncer, one with an empty data folder
// started against a stack whose change stream was purged past its initial
// sync, from its start to serving (its / answers and a query is hydrated),
// next to a fresh `jetsync run` doing the initial sync of the same data:
// seed.sh's 100,000 issues (451,020 rows).
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
	"github.com/jetsync/jetsync/streams"
)

const (
	appID       = "zero"
	publication = "zpeer_pub"
)

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin/jetsync", "jetsync binary; built from ./cmd/jetsync when missing")
	flag.StringVar(&o.shared, "shared", "../shared/bench", "folder holding seed.sh")
	flag.IntVar(&o.issues, "issues", 100000, "issues seed.sh creates (100000 makes 451,020 rows)")
	flag.IntVar(&o.txs, "txs", 2000, "one-row transactions committed after the snapshot, for the cold view-syncer to catch up")
	flag.IntVar(&o.runs, "runs", 3, "cold view-syncers to start, one after another (the median is reported)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (logs, data)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/coldstart:", err)
		os.Exit(1)
	}
}

type options struct {
	bin, shared string
	issues, txs int
	runs        int
	keep        bool
}

// backupEnv makes the change-streamer verify and purge at benchmark speed;
// snapshots after the first come from jetsync backup now.
var backupEnv = []string{
	"JETSYNC_BACKUP_CHECK_INTERVAL=500ms",
	"JETSYNC_BACKUP_CLEANUP_DELAY=1s",
	"JETSYNC_BACKUP_PURGE_WAIT=0",
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := os.Stat(filepath.Join(o.shared, "seed.sh")); err != nil {
		if _, err2 := os.Stat("/work/shared/bench/seed.sh"); err2 != nil {
			return err
		}
		o.shared = "/work/shared/bench"
	}
	root, err := os.MkdirTemp("", "jetsync-bench-coldstart-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("temporary folder:", root)
	} else {
		defer os.RemoveAll(root)
	}
	bin, err := benchenv.JetsyncBin(ctx, o.bin, root)
	if err != nil {
		return err
	}
	pg, pgURL, err := benchenv.StartUpstream(ctx, root, o.shared, o.issues, appID)
	if err != nil {
		return err
	}
	defer pg.Kill(context.WithoutCancel(ctx))
	natsPort, err := freePort()
	if err != nil {
		return err
	}
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	q := newQuery(`{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"i0000001"},"op":"="},"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments","orderBy":[["created","asc"]]},"system":"client"}],"limit":1}`)

	// 1. A fresh initial sync: jetsync run from an empty data folder.
	common := []string{"ZERO_UPSTREAM_DB=" + pgURL, "ZERO_APP_ID=" + appID, "ZERO_APP_PUBLICATIONS=" + publication, "ZERO_PORT=0", "ZERO_LOG_FORMAT=json"}
	t0 := time.Now()
	full, err := start(bin, root, "run", "run", append(append([]string{"JETSYNC_DATA_DIR=" + filepath.Join(root, "run"),
		fmt.Sprintf("JETSYNC_NATS_LISTEN=127.0.0.1:%d", natsPort), "ZERO_TASK_ID=run"}, common...), backupEnv...))
	if err != nil {
		return err
	}
	defer full.stop()
	fresh, err := full.serving(ctx, t0, q)
	if err != nil {
		return fmt.Errorf("jetsync run: %w", err)
	}
	fmt.Printf("fresh initial sync (jetsync run, empty data folder): start -> serving %s (/ answers %s)\n",
		fresh.serving.Round(time.Millisecond), fresh.health.Round(time.Millisecond))

	// 2. History after the initial sync, a snapshot past it, and a purge
	// of everything before the snapshot.
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	shard := streams.Shard{App: appID, Num: 0}
	if err := updates(ctx, pgURL, 200); err != nil {
		return err
	}
	if err := full.waitCaughtUp(ctx, js, shard); err != nil {
		return err
	}
	now := exec.CommandContext(ctx, bin, "backup", "now")
	now.Env = append(os.Environ(), "JETSYNC_NATS_URL="+natsURL, "ZERO_APP_ID="+appID)
	if out, err := now.CombinedOutput(); err != nil {
		return fmt.Errorf("jetsync backup now: %w\n%s", err, out)
	}
	snap, err := waitPurged(ctx, js, shard, 3*time.Minute)
	if err != nil {
		return err
	}
	fmt.Printf("snapshot %s: %.0f MB at seq %d; the stream was purged past the initial sync\n", snap.Name, float64(snap.Size)/1e6, snap.StreamSeq)
	if err := updates(ctx, pgURL, o.txs); err != nil {
		return err
	}
	// The view-syncer inside jetsync run has applied them.
	if err := full.waitCaughtUp(ctx, js, shard); err != nil {
		return err
	}

	// 3. Cold view-syncers: empty data folder, the stream purged past its
	// start, so that each must restore the snapshot.
	var colds []time.Duration
	for i := range o.runs {
		t0 = time.Now()
		vs, err := start(bin, root, "view-syncer", fmt.Sprintf("view-syncer-%d", i+1), append([]string{"JETSYNC_DATA_DIR=" + filepath.Join(root, fmt.Sprintf("vs%d", i+1)),
			"JETSYNC_NATS_URL=" + natsURL, fmt.Sprintf("ZERO_TASK_ID=cold-vs-%d", i+1)}, common...))
		if err != nil {
			return err
		}
		cold, err := vs.serving(ctx, t0, q)
		if err == nil {
			err = vs.report(t0, cold)
		}
		vs.stop()
		if err != nil {
			return fmt.Errorf("jetsync view-syncer: %w", err)
		}
		colds = append(colds, cold.serving)
	}
	slices.Sort(colds)
	cold := colds[len(colds)/2]
	fmt.Printf("cold view-syncer start -> serving: median %s of %d (min %s, max %s); fresh initial sync %s\n",
		cold.Round(time.Millisecond), len(colds), colds[0].Round(time.Millisecond), colds[len(colds)-1].Round(time.Millisecond), fresh.serving.Round(time.Millisecond))
	fmt.Printf("cold view-syncer / fresh initial sync: %.2f\n", cold.Seconds()/fresh.serving.Seconds())
	return nil
}

func num(v any) float64 { f, _ := v.(float64); return f }

// dur reads a duration from a JSON log record (slog writes nanoseconds).
func dur(v any) time.Duration { return time.Duration(num(v)).Round(time.Millisecond) }

// report prints a cold view-syncer's times and the steps of its restore,
// once it has caught up.
func (p *proc) report(t0 time.Time, st servingTimes) error {
	if p.log.Find("snapshot restored; catching up from the change stream") == nil {
		return fmt.Errorf("the cold view-syncer did not restore a snapshot:\n%s", p.log.Tail())
	}
	for deadline := time.Now().Add(5 * time.Minute); p.log.Find("caught up after the restore") == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the cold view-syncer did not catch up within 5 minutes:\n%s", p.log.Tail())
		}
	}
	fmt.Printf("cold view-syncer (restore from snapshot + catch-up): start -> serving %s (/ answers %s)\n",
		st.serving.Round(time.Millisecond), st.health.Round(time.Millisecond))
	for _, m := range []string{"downloading snapshot", "snapshot downloaded", "snapshot restored; catching up from the change stream",
		"http listening", "caught up after the restore"} {
		if at, ok := p.log.At(m); ok {
			fmt.Printf("  %-55s +%s\n", m, at.Sub(t0).Round(time.Millisecond))
		}
	}
	if rec := p.log.Find("snapshot downloaded"); rec != nil {
		fmt.Printf("  download: %.0f MB in %s (%v MB/s)\n", num(rec["bytes"])/1e6, dur(rec["took"]), rec["mb_per_s"])
	}
	if rec := p.log.Find("caught up after the restore"); rec != nil {
		fmt.Printf("  catch-up: %.0f stream messages in %s\n", num(rec["messages"]), dur(rec["took"]))
	}
	return nil
}

// updates commits n one-row transactions.
func updates(ctx context.Context, url string, n int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for i := range n {
		if _, err := conn.Exec(ctx, `UPDATE issue SET modified = modified + 1 WHERE id = $1`, fmt.Sprintf("i%07d", 1+i%1000)); err != nil {
			return fmt.Errorf("update: %w", err)
		}
	}
	return nil
}

// waitPurged waits for a verified snapshot past the initial sync and a
// purge of the stream past the initial sync.
func waitPurged(ctx context.Context, js jetstream.JetStream, shard streams.Shard, limit time.Duration) (streams.Snapshot, error) {
	deadline := time.Now().Add(limit)
	for {
		var up streams.Upstream
		snap, ok, info, err := position(ctx, js, shard, &up)
		if err == nil && ok && up.ResetSeq > 0 && snap.StreamSeq > up.ResetSeq && info.State.FirstSeq > up.ResetSeq {
			return snap, nil
		}
		if time.Now().After(deadline) {
			return snap, fmt.Errorf("no purge past the initial sync within %s (snapshot %v at %d, reset %d, err %v)", limit, ok, snap.StreamSeq, up.ResetSeq, err)
		}
		select {
		case <-ctx.Done():
			return snap, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func position(ctx context.Context, js jetstream.JetStream, shard streams.Shard, up *streams.Upstream) (streams.Snapshot, bool, *jetstream.StreamInfo, error) {
	kv, err := js.KeyValue(ctx, shard.StateBucket())
	if err != nil {
		return streams.Snapshot{}, false, nil, err
	}
	e, err := kv.Get(ctx, streams.KeyUpstream)
	if err != nil {
		return streams.Snapshot{}, false, nil, err
	}
	if err := json.Unmarshal(e.Value(), up); err != nil {
		return streams.Snapshot{}, false, nil, err
	}
	bkv, err := js.KeyValue(ctx, shard.BackupBucket())
	if err != nil {
		return streams.Snapshot{}, false, nil, err
	}
	snap, ok, err := streams.ReadSnapshot(ctx, bkv, streams.KeyBackupVerified)
	if err != nil {
		return snap, false, nil, err
	}
	st, err := js.Stream(ctx, shard.ChangesStream())
	if err != nil {
		return snap, ok, nil, err
	}
	info, err := st.Info(ctx)
	return snap, ok, info, err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// proc is a running jetsync subcommand.
type proc struct {
	cmd  *exec.Cmd
	log  *benchenv.LogWatch
	done chan struct{}
	err  error
}

func start(bin, root, sub, logName string, env []string) (*proc, error) {
	f, err := os.Create(filepath.Join(root, logName+".log"))
	if err != nil {
		return nil, err
	}
	p := &proc{log: benchenv.NewLogWatch(f), done: make(chan struct{})}
	p.cmd = exec.Command(bin, sub)
	p.cmd.Env = benchenv.ServerEnv(env...)
	p.cmd.Stderr = p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start jetsync %s: %w", sub, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
		f.Close()
	}()
	return p, nil
}

// stop sends SIGTERM, and SIGKILLs the process group after 20 s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

type servingTimes struct{ health, serving time.Duration }

// serving waits until p's / answers 200 and q, put by a new client group,
// is hydrated, and returns both times since t0.
func (p *proc) serving(ctx context.Context, t0 time.Time, q query) (servingTimes, error) {
	var st servingTimes
	base := ""
	for deadline := time.Now().Add(10 * time.Minute); ; {
		if rec := p.log.Find("http listening"); rec != nil && base == "" {
			port, _ := rec["port"].(float64)
			base = fmt.Sprintf("http://127.0.0.1:%d", int(port))
		}
		if base != "" {
			if resp, err := http.Get(base + "/"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					st.health = time.Since(t0)
					break
				}
			}
		}
		select {
		case <-p.done:
			return st, fmt.Errorf("exited (%v):\n%s", p.err, p.log.Tail())
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("/ not healthy within 10 minutes:\n%s", p.log.Tail())
		}
	}
	if err := hydrate(base, q); err != nil {
		return st, fmt.Errorf("query: %w\n%s", err, p.log.Tail())
	}
	st.serving = time.Since(t0)
	return st, nil
}

// waitCaughtUp waits until the stream's last message is acked by every
// replica consumer of p (jetsync run's own).
func (p *proc) waitCaughtUp(ctx context.Context, js jetstream.JetStream, shard streams.Shard) error {
	st, err := js.Stream(ctx, shard.ChangesStream())
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		behind := false
		for name := range st.ConsumerNames(ctx).Name() {
			c, err := st.Consumer(ctx, name)
			if err != nil {
				continue
			}
			ci, err := c.Info(ctx)
			if err == nil && ci.AckFloor.Stream < info.State.LastSeq {
				behind = true
			}
		}
		if !behind {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("jetsync run did not catch up within 5 minutes")
}

// query is a legacy (AST) query as a client desires it.
type query struct{ hash, ast string }

func newQuery(ast string) query {
	h := fnv.New64a()
	h.Write([]byte(ast))
	return query{hash: strconv.FormatUint(h.Sum64(), 36), ast: ast}
}

// clientSchema is the e2e app's schema as the real client sends it.
const clientSchema = `{"tables":{"comment":{"columns":{"body":{"type":"string"},"created":{"type":"number"},"id":{"type":"string"},"issue_id":{"type":"string"}},"primaryKey":["id"]},"issue":{"columns":{"created":{"type":"number"},"id":{"type":"string"},"modified":{"type":"number"},"open":{"type":"boolean"},"owner_id":{"type":"string"},"title":{"type":"string"}},"primaryKey":["id"]},"issue_label":{"columns":{"issue_id":{"type":"string"},"label_id":{"type":"string"}},"primaryKey":["issue_id","label_id"]},"label":{"columns":{"id":{"type":"string"},"name":{"type":"string"}},"primaryKey":["id"]},"user":{"columns":{"id":{"type":"string"},"name":{"type":"string"}},"primaryKey":["id"]}}}`

// hydrate connects a new client group desiring q (in the initConnection
// carried in the header, as the real client sends it) and reads until a
// finished poke has put q in its gotQueriesPatch.
func hydrate(base string, q query) error {
	init := `["initConnection",{"desiredQueriesPatch":[` + fmt.Sprintf(`{"op":"put","hash":%q,"ast":%s,"ttl":0}`, q.hash, q.ast) +
		`],"clientSchema":` + clientSchema + `}]`
	b, _ := json.Marshal(map[string]json.RawMessage{"initConnectionMessage": json.RawMessage(init)})
	proto := strings.NewReplacer("+", "%2B", "/", "%2F", "=", "%3D").Replace(base64.StdEncoding.EncodeToString(b))
	group := fmt.Sprintf("coldstart-%d", time.Now().UnixNano())
	v := url.Values{"clientGroupID": {group}, "clientID": {"c"}, "userID": {"u000001"}, "baseCookie": {""},
		"ts": {strconv.FormatInt(time.Now().UnixMilli(), 10)}, "lmid": {"0"}, "wsid": {"ws-c"}}
	d := websocket.Dialer{Subprotocols: []string{proto}, HandshakeTimeout: 30 * time.Second}
	ws, _, err := d.Dial("ws"+strings.TrimPrefix(base, "http")+"/sync/v51/connect?"+v.Encode(), nil)
	if err != nil {
		return err
	}
	defer ws.Close()
	got := false
	for {
		_ = ws.SetReadDeadline(time.Now().Add(2 * time.Minute))
		_, data, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		switch {
		case bytes.HasPrefix(data, []byte(`["error"`)):
			return fmt.Errorf("server error: %.500s", data)
		case bytes.HasPrefix(data, []byte(`["pokePart"`)) && bytes.Contains(data, []byte(`"gotQueriesPatch"`)) && bytes.Contains(data, []byte(q.hash)):
			got = true
		case bytes.HasPrefix(data, []byte(`["pokeEnd"`)) && got:
			return nil
		}
	}
}
