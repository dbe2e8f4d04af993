package cvrstore

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

// BenchmarkGroup_Publish times one group's Publish of an update of rows
// row events, on a server that fsyncs every write as production does: the
// cost a poke waits for. rows=100000 is a whole-table hydration's update,
// rows=1 a replica advance's. A bare JetStream publish of the same
// one-row message is the floor.
func BenchmarkGroup_Publish(b *testing.B) {
	ns := natstest.Start(b, natstest.SyncAlways())
	_, js := natstest.Connect(b, ns)
	s, err := Open(b.Context(), Config{JS: js, Shard: shard, File: filepath.Join(b.TempDir(), "cvr.db"), OwnerID: "o", CompactAfter: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	for _, rows := range []int{1, 100000} {
		b.Run(fmt.Sprint("rows=", rows), func(b *testing.B) {
			g, err := s.Load(b.Context(), fmt.Sprint("bench-", rows), nil)
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for b.Loop() {
				n++
				v := fmt.Sprintf("%08x", n)
				evs := make([]streams.CVREvent, rows)
				for i := range evs {
					evs[i] = streams.CVREvent{Op: streams.CVROpPutRow, Row: &streams.CVRRow{Table: "issue",
						Key: json.RawMessage(fmt.Sprintf(`{"id":"i%07d"}`, i)), RowVersion: "1a2b3c", PatchVersion: v, Refs: map[string]int{"q": 1}}}
				}
				if err := g.Publish(b.Context(), v, evs); err != nil {
					b.Fatal(err)
				}
			}
			start := time.Now()
			if _, err := g.State(b.Context()); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(n), "µs-apply-lag/op")
		})
	}
	b.Run("bare", func(b *testing.B) {
		msg := []byte(`{"group":"g","version":"1","prev":0,"part":0,"last":true,"events":[{"op":"put-row","row":{"table":"issue","key":{"id":"i0000001"},"rowVersion":"1a2b3c","patchVersion":"1","refs":{"q":1}}}]}`)
		for b.Loop() {
			if _, err := js.Publish(b.Context(), shard.CVRSubject("bare"), msg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCommit times one round of n one-message updates of n groups,
// the server fsyncing every write, as one atomic batch and as pipelined
// publishes (maxPipelined picks between them).
func BenchmarkCommit(b *testing.B) {
	ns := natstest.Start(b, natstest.SyncAlways())
	_, js := natstest.Connect(b, ns)
	if _, err := js.CreateStream(b.Context(), jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"}, AllowAtomicPublish: true}); err != nil {
		b.Fatal(err)
	}
	q := &committer{js: js, timeout: commitTimeout}
	last := map[string]uint64{}
	for _, n := range []int{2, 4, 8, 12, 16, 50} {
		for _, how := range []string{"atomic", "pipelined"} {
			b.Run(fmt.Sprintf("%s/n=%d", how, n), func(b *testing.B) {
				for b.Loop() {
					reqs := make([]*commitReq, n)
					for i := range reqs {
						s := fmt.Sprint("b.", i)
						reqs[i] = &commitReq{subject: s, msgs: [][]byte{make([]byte, 300)}, prev: last[s]}
					}
					if how == "atomic" {
						q.pipelined = 0
					} else {
						q.pipelined = n
					}
					q.publishChunk(b.Context(), reqs)
					for _, r := range reqs {
						if r.err != nil {
							b.Fatal(r.err)
						}
						last[r.subject] = r.last
					}
				}
			})
		}
	}
}
