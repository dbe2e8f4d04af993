package cvrstore

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/nats-config/natstest"
)

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
