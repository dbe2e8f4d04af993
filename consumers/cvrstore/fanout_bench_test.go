package cvrstore

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

// BenchmarkStore_Fanout times what one replica advance costs the CVR
// store when it changes one row seen by every one of many groups: each
// group publishes an instance record and a one-row put-rows at the same
// time (one atomic batch), and the op ends once every group's update is
// applied to the local projection. The server does not fsync: the
// figure is the store's CPU (cpu-ms/op, the process's user+sys, the
// embedded NATS server's included), not the disk's.
func BenchmarkStore_Fanout(b *testing.B) {
	for _, groups := range []int{50, 200} {
		b.Run(fmt.Sprint("groups=", groups), func(b *testing.B) {
			ns := natstest.Start(b)
			_, js := natstest.Connect(b, ns)
			s, err := Open(b.Context(), Config{JS: js, Shard: shard, File: filepath.Join(b.TempDir(), "cvr.db"), OwnerID: "o", CompactAfter: -1})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			gs := make([]*Group, groups)
			for i := range gs {
				if gs[i], err = s.Load(b.Context(), fmt.Sprint("g", i), nil); err != nil {
					b.Fatal(err)
				}
				// What the group synced: 100 rows of one query.
				keys := make([]json.RawMessage, 100)
				vers := make([]string, 100)
				for k := range keys {
					keys[k], vers[k] = json.RawMessage(fmt.Sprintf(`{"id":"i%04d"}`, k)), "r0"
				}
				evs := []streams.CVREvent{
					{Op: streams.CVROpInstance, Instance: &streams.CVRInstance{Version: "00", ReplicaVersion: "r"}},
					{Op: streams.CVROpPutQuery, Query: &streams.CVRQuery{Hash: "q", AST: json.RawMessage(`{"table":"issue"}`), Got: true, PatchVersion: "00"}},
					{Op: streams.CVROpPutRows, Rows: &streams.CVRRows{Table: "issue", Keys: keys, RowVersions: vers, PatchVersion: "00", Refs: map[string]int{"q": 1}}},
				}
				if err := gs[i].Publish(b.Context(), "00", evs); err != nil {
					b.Fatal(err)
				}
			}
			s.applies.waitAll()
			n := 0
			var ru0 syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			for b.Loop() {
				n++
				v := fmt.Sprintf("%08x", n)
				var wg sync.WaitGroup
				for _, g := range gs {
					wg.Go(func() {
						evs := []streams.CVREvent{
							{Op: streams.CVROpInstance, Instance: &streams.CVRInstance{Version: v, ReplicaVersion: "r", LastActiveMs: int64(n)}},
							{Op: streams.CVROpPutRows, Rows: &streams.CVRRows{Table: "issue", Keys: []json.RawMessage{json.RawMessage(fmt.Sprintf(`{"id":"i%04d"}`, n%100))},
								RowVersions: []string{v}, PatchVersion: v, Refs: map[string]int{"q": 1}}},
						}
						if err := g.Publish(b.Context(), v, evs); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
				s.applies.waitAll()
			}
			var ru1 syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(n), "cpu-ms/op")
		})
	}
}
