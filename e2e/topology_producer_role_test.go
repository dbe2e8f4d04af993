package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/streams"
)

// TestTopology_ProducerRoleHandoff is issue 8's lifecycle point on the
// producer role: under a write workload, a second change-streamer (another
// host: its own data dir, task ID and port) starts while the first still
// runs. The second takes the role; the first sees it lost it and stops
// cleanly (exit 0, saying who took over); the second carries on from the
// stream and the snapshot without a new initial sync, every transaction
// exactly once, and its replica equals Postgres.
func TestTopology_ProducerRoleHandoff(t *testing.T) {
	seed, tp, url, c, replicaVersion := startProducerRig(t, 9)
	first := tp.procs["change-streamer"]
	if h := tp.producer(); h == nil || h.TaskID != "change-streamer" {
		t.Fatalf("producer role held by %+v; want the change-streamer", h)
	}

	cw := startWriter(t, url, seed)
	runFor(t, first, c.randDuration(time.Second, 2*time.Second))
	second := tp.secondStreamer("change-streamer-2")
	took := time.Now()
	p := tp.startJetsync(second, second)
	rec := p.logRecord(t, "took the producer role over from a live change-streamer; it will stop", 30*time.Second)
	if got := str(t, rec, "previous_task_id"); got != "change-streamer" {
		t.Errorf("the second change-streamer took the role from %q; want change-streamer", got)
	}

	select {
	case <-first.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the first change-streamer still runs 30s after the second took the role:\n%s", first.stderr.String())
	}
	if code := first.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("the first change-streamer exited %d after losing the role; want 0:\n%s", code, first.stderr.String())
	}
	lost := findRecord(first, "lost the producer role: another change-streamer took over")
	if lost == nil {
		t.Errorf("the first change-streamer did not log that it lost the role:\n%s", first.stderr.String())
	} else if got := str(t, lost, "by_task_id"); got != "change-streamer-2" {
		t.Errorf("the first change-streamer lost the role to %q; want change-streamer-2", got)
	}
	if findRecord(first, "change-streamer stopped: it lost the producer role") == nil {
		t.Error("the first change-streamer did not log its clean stop")
	}
	t.Logf("the first change-streamer stopped %v after the second started, %d transactions in",
		time.Since(took).Round(time.Millisecond), cw.w.seq)

	runFor(t, p, c.randDuration(time.Second, 2*time.Second))
	// The slot stays busy until the first one's replication connection
	// closes, so the second may retry its start once or twice.
	t.Logf("the second change-streamer retried replication %d times", countLogs(p, "replication interrupted; retrying"))
	if err := cw.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("the writer committed %d transactions, %d of them big", len(cw.changes), cw.big)
	c.file = filepath.Join(tp.r.root, second.name, "backup-replica.db")
	c.waitCaughtUp(2 * time.Minute)
	c.checkReplicaEqualsPostgres()
	if u := c.upstreamRecord(); u.ReplicaVersion != replicaVersion {
		t.Errorf("replica version %s after the handoff; was %s: a resync", u.ReplicaVersion, replicaVersion)
	}
	if h := tp.producer(); h == nil || h.TaskID != second.name {
		t.Errorf("producer role held by %+v; want %s", h, second.name)
	}
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Errorf("the second change-streamer's exit code %d after SIGTERM; want 0", code)
	}
	if h := tp.producer(); h != nil {
		t.Errorf("producer role held by %+v after its holder stopped; want it released", h)
	}
	c.checkStreamExactlyOnce(cw, replicaVersion)
}

// secondStreamer is the change-streamer service again as another host:
// its own name, data dir, task ID and port.
func (tp *topology) secondStreamer(name string) topoService {
	tp.t.Helper()
	s := tp.svcs["change-streamer"]
	s.name = name
	s.env = maps.Clone(s.env)
	s.env["ZERO_TASK_ID"] = name
	s.env["ZERO_PORT"] = "{port:" + name + ":4849}"
	tp.r.ports[name+":4849"] = freePort(tp.t)
	tp.svcs[name] = s
	return s
}

// producer is the producer role's record, nil when nobody holds it.
func (tp *topology) producer() *streams.Producer {
	tp.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := tp.js.KeyValue(ctx, tp.shard.StateBucket())
	if err != nil {
		tp.t.Fatal(err)
	}
	e, err := kv.Get(ctx, streams.KeyProducer)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		tp.t.Fatal(err)
	}
	var p streams.Producer
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		tp.t.Fatalf("producer record %q: %v", e.Value(), err)
	}
	return &p
}
