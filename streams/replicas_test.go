package streams

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
)

// ensureAll runs every Ensure function with c, as the roles do: the
// change-streamer with its count, the others with whatever they were given.
// A cluster that has just had a node back (and a race-detector build on a
// busy machine) can leave an API call unanswered for a while, so an attempt
// that fails is retried, as the roles' own start-up retries, within a bound.
func ensureAll(t *testing.T, js jetstream.JetStream, producer, others Config) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := ensureAllOnce(js, producer, others)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		t.Logf("retrying: %v", err)
		// An error that comes back at once (no responders) would
		// otherwise spin.
		time.Sleep(100 * time.Millisecond)
	}
}

func ensureAllOnce(js jetstream.JetStream, producer, others Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := Ensure(ctx, js, producer); err != nil {
		return fmt.Errorf("Ensure(R%d): %w", producer.Replicas, err)
	}
	if _, err := EnsureBackup(ctx, js, producer); err != nil {
		return fmt.Errorf("EnsureBackup(R%d): %w", producer.Replicas, err)
	}
	if _, _, err := EnsureCVR(ctx, js, others); err != nil {
		return fmt.Errorf("EnsureCVR(R%d): %w", others.Replicas, err)
	}
	if _, err := EnsureBackup(ctx, js, others); err != nil {
		return fmt.Errorf("EnsureBackup(R%d): %w", others.Replicas, err)
	}
	return nil
}

// allStreams names the JetStream streams behind every resource of shard.
func allStreams(s Shard) []string {
	return []string{s.ChangesStream(), "KV_" + s.StateBucket(), s.CVRStream(), "KV_" + s.OwnersBucket(),
		"OBJ_" + s.SnapshotBucket(), "KV_" + s.BackupBucket(), "KV_" + s.ReservationBucket()}
}

// waitReplicas waits until every stream of shard runs with n replicas, all
// of them current.
func waitReplicas(t *testing.T, js jetstream.JetStream, shard Shard, n int) {
	t.Helper()
	polltest.UntilNil(t, 30*time.Second, fmt.Sprintf("%d current replicas of every stream", n), func() error {
		for _, name := range allStreams(shard) {
			if got, why := replicasOf(js, name); got != n || why != "" {
				return fmt.Errorf("stream %s: %d replicas (%s); want %d, all current", name, got, why, n)
			}
		}
		return nil
	})
}

func replicasOf(js jetstream.JetStream, name string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0, err.Error()
	}
	info := s.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return info.Config.Replicas, "no leader"
	}
	for _, p := range info.Cluster.Replicas {
		if !p.Current || p.Offline {
			return info.Config.Replicas, "peer " + p.Name + " not current"
		}
	}
	if peers := len(info.Cluster.Replicas) + 1; peers != info.Config.Replicas {
		return info.Config.Replicas, fmt.Sprintf("%d peers", peers)
	}
	return info.Config.Replicas, ""
}

// TestEnsure_Replicas scales every resource of a shard up and back down on
// a real three-node cluster while it holds data and a durable consumer.
func TestEnsure_Replicas(t *testing.T) {
	c := natstest.StartCluster(t)
	_, js := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	shard := Shard{App: "scale", Num: 0}

	ensureAll(t, js, Config{Shard: shard, Replicas: 1}, Config{Shard: shard})
	waitReplicas(t, js, shard, 1)
	const msgs = 50
	for i := range msgs {
		if _, err := js.Publish(ctx, shard.Prefix()+".changes.public.t", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := js.KeyValue(ctx, shard.StateBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, KeyUpstream, []byte(`{"slot":"s"}`)); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, shard.ChangesStream())
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	// read fetches n messages, retrying while the consumer's leader is
	// being placed or moved (no responders).
	read := func(n int) {
		t.Helper()
		got := 0
		deadline := time.Now().Add(30 * time.Second)
		for got < n {
			batch, err := cons.Fetch(n-got, jetstream.FetchMaxWait(2*time.Second))
			if err == nil {
				for m := range batch.Messages() {
					if err := m.Ack(); err != nil {
						t.Fatal(err)
					}
					got++
				}
				err = batch.Error()
			}
			if got < n && time.Now().After(deadline) {
				t.Fatalf("consumer read %d messages; want %d (%v)", got, n, err)
			}
		}
	}
	read(10)

	want, acked := uint64(msgs), uint64(10)
	check := func(t *testing.T) {
		t.Helper()
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != want {
			t.Errorf("change stream holds %d messages; want %d", info.State.Msgs, want)
		}
		e, err := kv.Get(ctx, KeyUpstream)
		if err != nil || string(e.Value()) != `{"slot":"s"}` {
			t.Errorf("state bucket %s = %v, %v", KeyUpstream, e, err)
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatalf("the durable consumer after scaling: %v", err)
		}
		if ci.AckFloor.Stream != acked {
			t.Errorf("consumer ack floor %d; want %d", ci.AckFloor.Stream, acked)
		}
	}

	t.Run("Up", func(t *testing.T) {
		// The change-streamer asks for R3; a view-syncer and a restorer,
		// given no count, follow it.
		ensureAll(t, js, Config{Shard: shard, Replicas: 3}, Config{Shard: shard})
		waitReplicas(t, js, shard, 3)
		check(t)
		read(10)
		acked += 10
		// With a node down, an R3 stream keeps its quorum.
		c.Stop(1)
		// Retried (deduplicated by its ID) while a new leader is elected.
		for {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := js.Publish(pctx, shard.Prefix()+".changes.public.t", []byte("while down"), jetstream.WithMsgID("while-down"))
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("publish with one node down: %v", err)
			}
		}
		c.Restart(1)
		want++
	})
	t.Run("ReaderKeepsCount", func(t *testing.T) {
		// A role that was given no count never scales back.
		ensureAll(t, js, Config{Shard: shard}, Config{Shard: shard})
		waitReplicas(t, js, shard, 3)
	})
	t.Run("Down", func(t *testing.T) {
		ensureAll(t, js, Config{Shard: shard, Replicas: 1}, Config{Shard: shard})
		waitReplicas(t, js, shard, 1)
		check(t)
		read(10)
	})
	t.Run("ClusterDefault", func(t *testing.T) {
		fresh := Shard{App: "fresh", Num: 0}
		ensureAll(t, js, Config{Shard: fresh}, Config{Shard: fresh})
		waitReplicas(t, js, fresh, 3)
	})
}

func TestEnsure_ReplicasSingleServer(t *testing.T) {
	_, js := natstest.Connect(t, natstest.Start(t))
	shard := Shard{App: "single", Num: 0}
	ensureAll(t, js, Config{Shard: shard}, Config{Shard: shard})
	for _, name := range allStreams(shard) {
		if n, why := replicasOf(js, name); n != 1 {
			t.Errorf("stream %s: R%d (%s); want R1 on one server", name, n, why)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := Ensure(ctx, js, Config{Shard: shard, Replicas: 3}); err == nil {
		t.Error("Ensure(R3) on one server succeeded")
	}
}
