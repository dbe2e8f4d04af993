package role

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func stateBucket(t *testing.T, js jetstream.JetStream) jetstream.KeyValue {
	t.Helper()
	_, kv, err := streams.Ensure(context.Background(), js, streams.Config{Shard: streams.Shard{App: "zero"}})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func newBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, js := natstest.Connect(t, natstest.Start(t))
	return stateBucket(t, js)
}

func acquire(t *testing.T, kv jetstream.KeyValue, task string, hb time.Duration) *Lease {
	t.Helper()
	l, err := Acquire(context.Background(), kv, Config{TaskID: task, TTL: 10 * hb, Heartbeat: hb, Logger: quiet})
	if err != nil {
		t.Fatalf("Acquire(%s): %v", task, err)
	}
	return l
}

// running runs l in the background; the channel gets Run's result.
func running(t *testing.T, l *Lease) (<-chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		done <- l.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-finished })
	return done, cancel
}

func current(t *testing.T, kv jetstream.KeyValue) *streams.Producer {
	t.Helper()
	p, _, err := read(context.Background(), kv)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func wantLost(t *testing.T, err error, by *Lease) {
	t.Helper()
	var lost *LostError
	if !errors.As(err, &lost) {
		t.Fatalf("Run = %v; want a *LostError", err)
	}
	if lost.By.Instance != by.Record().Instance || lost.By.TaskID != by.Record().TaskID {
		t.Errorf("lost to %+v; want %+v", lost.By, by.Record())
	}
}

func TestConfig_Validate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"Defaults", Config{TaskID: "a"}, true},
		{"NoTaskID", Config{}, false},
		{"HeartbeatNotBelowTTL", Config{TaskID: "a", TTL: time.Second, Heartbeat: time.Second}, false},
		{"HeartbeatAboveDefaultTTL", Config{TaskID: "a", Heartbeat: time.Minute}, false},
		{"Negative", Config{TaskID: "a", TTL: -time.Second}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v; want ok %v", err, tc.ok)
			}
		})
	}
}

func TestLease_Run(t *testing.T) {
	t.Run("TakesAnEmptyRole", func(t *testing.T) {
		kv := newBucket(t)
		a := acquire(t, kv, "a", time.Second)
		if _, ok := a.Previous(); ok {
			t.Error("Previous() reports a holder on an empty bucket")
		}
		got := current(t, kv)
		if got == nil || got.TaskID != "a" || got.Instance != a.Record().Instance {
			t.Fatalf("record %+v; want task a, instance %s", got, a.Record().Instance)
		}
		if !got.Expires.After(got.Started) {
			t.Errorf("record expires %v, not after it started %v", got.Expires, got.Started)
		}
	})

	t.Run("Renews", func(t *testing.T) {
		kv := newBucket(t)
		a := acquire(t, kv, "a", 20*time.Millisecond)
		first := current(t, kv).Expires
		running(t, a)
		polltest.Until(t, 10*time.Second, "three renewals", func() bool {
			p := current(t, kv)
			return p.Beat >= 3 && p.Expires.After(first)
		})
		if err := a.Check(); err != nil {
			t.Errorf("Check() = %v while holding the role", err)
		}
	})

	t.Run("NewestTakesOver", func(t *testing.T) {
		kv := newBucket(t)
		a := acquire(t, kv, "a", time.Hour/20) // the watch, not a renewal, must notice
		done, _ := running(t, a)
		b := acquire(t, kv, "b", time.Second)
		prev, ok := b.Previous()
		if !ok || prev.Instance != a.Record().Instance {
			t.Errorf("b.Previous() = %+v, %v; want a's record", prev, ok)
		}
		select {
		case err := <-done:
			wantLost(t, err, b)
		case <-time.After(10 * time.Second):
			t.Fatal("a still runs 10s after b took the role")
		}
		var lost *LostError
		if !errors.As(a.Check(), &lost) {
			t.Errorf("a.Check() = %v; want a *LostError", a.Check())
		}
		if err := a.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := current(t, kv); got == nil || got.Instance != b.Record().Instance {
			t.Errorf("after a released: record %+v; want b's", got)
		}
	})

	t.Run("SameTaskIDTakesOver", func(t *testing.T) {
		// Two processes with one task ID (a copied data dir) still
		// tell each other apart.
		kv := newBucket(t)
		a := acquire(t, kv, "same", time.Second)
		done, _ := running(t, a)
		b := acquire(t, kv, "same", time.Second)
		select {
		case err := <-done:
			wantLost(t, err, b)
		case <-time.After(10 * time.Second):
			t.Fatal("the first holder still runs")
		}
	})

	t.Run("RenewalFindsTheTakeover", func(t *testing.T) {
		kv := newBucket(t)
		a := acquire(t, kv, "a", time.Second)
		b := acquire(t, kv, "b", time.Second)
		// a never watched: its renewal alone must find out.
		wantLost(t, a.renew(context.Background()), b)
	})

	t.Run("DeletedByHandIsWrittenBack", func(t *testing.T) {
		kv := newBucket(t)
		a := acquire(t, kv, "a", 20*time.Millisecond)
		running(t, a)
		if err := kv.Delete(context.Background(), streams.KeyProducer); err != nil {
			t.Fatal(err)
		}
		polltest.Until(t, 10*time.Second, "a to write its record back", func() bool {
			p := current(t, kv)
			return p != nil && p.Instance == a.Record().Instance
		})
	})

	t.Run("Release", func(t *testing.T) {
		kv := newBucket(t)
		a := acquire(t, kv, "a", time.Second)
		_, cancel := running(t, a)
		cancel()
		if err := a.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := current(t, kv); got != nil {
			t.Fatalf("record %+v after Release; want none", got)
		}
		b := acquire(t, kv, "b", time.Second)
		if prev, ok := b.Previous(); ok {
			t.Errorf("b.Previous() = %+v after a released", prev)
		}
	})

	t.Run("ConcurrentStarts", func(t *testing.T) {
		kv := newBucket(t)
		const n = 5
		leases := make([]*Lease, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { leases[i] = acquire(t, kv, "task"+string(rune('a'+i)), time.Second) })
		}
		wg.Wait()
		winner := current(t, kv)
		holders := 0
		for _, l := range leases {
			err := l.renew(context.Background())
			if l.Record().Instance == winner.Instance {
				holders++
				if err != nil {
					t.Errorf("the holder's renewal: %v", err)
				}
				continue
			}
			var lost *LostError
			if !errors.As(err, &lost) || lost.By.Instance != winner.Instance {
				t.Errorf("a loser's renewal = %v; want lost to %s", err, winner.Instance)
			}
		}
		if holders != 1 {
			t.Errorf("%d leases hold the record; want 1", holders)
		}
	})

	t.Run("SurvivesAServerRestart", func(t *testing.T) {
		ns := natstest.Start(t)
		_, js := natstest.Connect(t, ns)
		kv := stateBucket(t, js)
		a := acquire(t, kv, "a", 20*time.Millisecond)
		done, _ := running(t, a)
		before := current(t, kv).Beat
		natstest.Restart(t, ns)
		polltest.Until(t, 20*time.Second, "renewals after the restart", func() bool {
			p, _, err := read(context.Background(), kv)
			return err == nil && p != nil && p.Beat > before+2
		})
		select {
		case err := <-done:
			t.Fatalf("Run ended across a server restart: %v", err)
		default:
		}
		if got := current(t, kv); got.Instance != a.Record().Instance {
			t.Errorf("record %+v after the restart; want a's", got)
		}
	})
}

func TestLease_Cluster(t *testing.T) {
	c := natstest.StartCluster(t)
	_, js := c.Connect(t)
	_, kv, err := streams.Ensure(context.Background(), js, streams.Config{Shard: streams.Shard{App: "zero"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	a := acquire(t, kv, "a", 50*time.Millisecond)
	done, _ := running(t, a)
	b := acquire(t, kv, "b", 50*time.Millisecond)
	select {
	case err := <-done:
		wantLost(t, err, b)
	case <-time.After(10 * time.Second):
		t.Fatal("a still runs 10s after b took the role on the cluster")
	}
	e, err := kv.Get(context.Background(), streams.KeyProducer)
	if err != nil {
		t.Fatal(err)
	}
	var p streams.Producer
	if err := json.Unmarshal(e.Value(), &p); err != nil || p.TaskID != "b" {
		t.Errorf("record %s (%v); want b's", e.Value(), err)
	}
}
