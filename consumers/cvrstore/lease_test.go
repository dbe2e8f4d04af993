package cvrstore

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
)

// ownerWrites watches the writes to the owners bucket, as published:
// trips(n) waits for n of them and returns how many round trips they took
// (one per atomic batch, one per other write), since the last call.
func ownerWrites(t *testing.T, ns *server.Server) (trips func(n int) int) {
	nc, _ := natstest.Connect(t, ns)
	var mu sync.Mutex
	writes, batches := 0, map[string]bool{}
	sub, err := nc.Subscribe("$KV."+shard.OwnersBucket()+".>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		writes++
		batches[m.Header.Get("Nats-Batch-Id")] = true
		if m.Header.Get("Nats-Batch-Id") == "" {
			batches[fmt.Sprint("single ", writes)] = true
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return func(n int) int {
		t.Helper()
		polltest.Until(t, 10*time.Second, fmt.Sprintf("%d owner writes", n), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return writes >= n
		})
		mu.Lock()
		defer mu.Unlock()
		if writes != n {
			t.Errorf("%d owner writes; want %d", writes, n)
		}
		delete(batches, "")
		k := len(batches)
		writes, batches = 0, map[string]bool{}
		return k
	}
}

func TestLease_BatchedWrites(t *testing.T) {
	ns := natstest.Start(t, natstest.SyncAlways())
	var mu sync.Mutex
	var lostGroups []string
	onLost := func(c *Config) {
		c.LeaseLost = func(g string) { mu.Lock(); lostGroups = append(lostGroups, g); mu.Unlock() }
	}
	long := func(c *Config) { c.LeaseTTL = time.Minute }
	secret := func(c *Config) { c.PeerSecret = []byte("s") }
	a := openStore(t, ns, "a", "", long, onLost, secret)
	b := openStore(t, ns, "b", "", long, secret)
	ctx := testCtx(t)
	trips := ownerWrites(t, ns)
	const n = 60
	group := func(i int) string { return fmt.Sprintf("cg%02d", i) }

	// Some groups were served and given up before: their records are
	// deleted, which a create must step over.
	for i := range n / 2 {
		l, err := a.Acquire(ctx, group(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	trips(n)

	// Acquisitions at once share round trips.
	release := holdQueue(t, &a.owners)
	leases := make([]*Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { leases[i], errs[i] = a.Acquire(ctx, group(i)) })
	}
	release(n)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if k := trips(n); k > 2 {
		t.Errorf("%d acquisitions took %d round trips; want them batched", n, k)
	}
	for i, l := range leases {
		var owned *OwnedError
		if _, err := b.Acquire(ctx, group(i)); !errors.As(err, &owned) || !owned.Signed {
			t.Fatalf("b's Acquire(%q) = %v; want a's signed record", group(i), err)
		}
		if e, err := a.kv.Get(ctx, l.key); err != nil || e.Revision() != l.rev {
			t.Fatalf("%s: record %v, %v; want revision %d", group(i), e, err, l.rev)
		}
	}

	// Renewals due together: one round trip.
	before := time.Now()
	a.renewAll(ctx, a.Leases())
	if k := trips(n); k != 1 {
		t.Errorf("%d renewals took %d round trips; want 1", n, k)
	}
	check := func(skip int) {
		t.Helper()
		for i, l := range leases {
			if i == skip {
				continue
			}
			if err := l.Err(); err != nil {
				t.Fatalf("%s: %v", group(i), err)
			}
			e, err := a.kv.Get(ctx, l.key)
			if err != nil || e.Revision() != l.rev || !l.expires.After(before.Add(time.Minute)) {
				t.Fatalf("%s: record %v, %v; want it renewed at revision %d", group(i), e, err, l.rev)
			}
		}
	}
	check(-1)

	// A peer takes one group over while its renewal is due: only that
	// lease is lost, the batch's others are renewed.
	const taken = 17
	peer := &Lease{s: b, groupID: group(taken), key: leases[taken].key, granted: time.Now().UnixMilli()}
	if _, err := b.kv.Update(ctx, peer.key, peer.record(time.Now()), leases[taken].rev); err != nil {
		t.Fatal(err)
	}
	trips(1)
	before = time.Now()
	a.renewAll(ctx, a.Leases())
	// The batch, refused, then each record on its own.
	if k := trips(2 * n); k != n+1 {
		t.Errorf("a refused batch of %d renewals and the retries took %d round trips; want %d", n, k, n+1)
	}
	if !errors.Is(leases[taken].Err(), ErrLeaseLost) {
		t.Errorf("the lease taken over: Err = %v; want ErrLeaseLost", leases[taken].Err())
	}
	mu.Lock()
	if len(lostGroups) != 1 || lostGroups[0] != group(taken) {
		t.Errorf("LeaseLost calls = %q; want only %q", lostGroups, group(taken))
	}
	mu.Unlock()
	check(taken)
	if o, err := a.Owner(ctx, group(taken)); err != nil || o.ID != "b" {
		t.Errorf("owner of the group taken over = %+v, %v; want b", o, err)
	}
	if _, err := a.Acquire(ctx, group(taken)); !errors.As(err, new(*OwnedError)) {
		t.Errorf("a's Acquire of the group taken over = %v; want OwnedError", err)
	}

	// Renewals whose answer was lost moved the record on: the next
	// batch is refused, and the lease finds the record still its own.
	if _, err := a.kv.Put(ctx, leases[3].key, leases[3].record(time.Now())); err != nil {
		t.Fatal(err)
	}
	trips(1)
	a.renewAll(ctx, a.Leases())
	// The batch, each record on its own, and lease 3 once more at the
	// record's revision.
	trips(2*(n-1) + 1)
	check(taken)

	// The batches go back to one round trip.
	a.renewAll(ctx, a.Leases())
	if k := trips(n - 1); k != 1 {
		t.Errorf("%d renewals took %d round trips; want 1", n-1, k)
	}
	if got := len(a.Leases()); got != n-1 {
		t.Errorf("%d leases held; want %d", got, n-1)
	}
}
