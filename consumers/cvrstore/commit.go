package cvrstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The stream fsyncs every write before its PubAck (sync_interval: always),
// and one stream stores its messages one after another: with one publish
// per group, a replica advance that changes 200 groups waits for 200
// fsyncs in a row. The committer is a group commit: publishes of many
// groups that wait at the same time go out as one JetStream atomic batch,
// which the server stores at a fixed cost rather than an fsync per
// message (maxPipelined), and each caller gets its own
// sequences back. Each group's first message keeps its expected last
// subject sequence, which JetStream checks per subject inside a batch, so
// a stale writer is still refused; since the batch is all or nothing, a
// refused batch is retried one group at a time, and only the group at
// fault gets the error.
//
// A few one-message updates are cheaper as publishes of their own, sent
// back to back (maxPipelined), and go so.
//
// Durability is unchanged: Publish returns only after the PubAck of the
// batch, or the publish, that holds its messages, so a pokeEnd never
// carries a cookie the stream lacks.
//
// The owners bucket is fsynced alike, and its lease records are written the
// same way (Store.owners), always in atomic batches: a record's expected last subject sequence is
// the revision a KV update expects.

// maxCommitMessages bounds an atomic batch: JetStream refuses batches
// over 1,000 messages by default.
const maxCommitMessages = 1000

// maxPipelined bounds the requests, of one message each, that go out as
// publishes of their own, sent back to back, rather than as an atomic
// batch. A file stream of one replica stages each atomic batch in a file
// store of its own, created, fsynced and deleted on the way: 2.4-4.6 ms
// on this machine's quiet disk whatever the batch's size, 8-17 ms on a
// busy one, where pipelined publishes take one fsync each, 0.2-0.3 ms
// quiet and 1-1.5 ms busy (BenchmarkCommit). Eight is below the crossing
// on both.
const maxPipelined = 8

// commitTimeout bounds one batch's round trip of CVR updates; the callers'
// contexts do not, since a batch carries other groups' updates too.
const commitTimeout = 10 * time.Second

// commitReq is one update of one subject waiting to be published.
type commitReq struct {
	subject string
	msgs    [][]byte
	prev    uint64 // expected last sequence of the subject
	// last is the sequence of the update's last message, once stored.
	last uint64
	err  error
}

// commitJob is one caller's requests in the queue.
type commitJob struct {
	reqs []*commitReq
	// wake is closed when the job is done, or when its caller is to lead
	// the next batch (lead).
	wake chan struct{}
	lead bool
}

// committer gathers concurrent publishes to one stream into batches: the
// first caller to find none in flight leads, publishing everything queued;
// callers that come meanwhile queue, and the first of them leads the next
// batch.
type committer struct {
	js      jetstream.JetStream
	timeout time.Duration
	// pipelined is how many single-message requests of different
	// subjects a round may publish one by one (maxPipelined); 0: always
	// an atomic batch.
	pipelined int

	mu    sync.Mutex
	queue []*commitJob
	busy  bool
	// trips counts publish round trips, and batches the atomic batches
	// among them, for tests. Pipelined publishes count as one trip.
	trips, batches atomic.Int64
}

// commit publishes msgs on subject, the first message expecting prev as
// the subject's last sequence, with whatever else is queued, and returns
// the sequence of the last message.
func (s *Store) commit(ctx context.Context, subject string, msgs [][]byte, prev uint64) (uint64, error) {
	r := &commitReq{subject: subject, msgs: msgs, prev: prev}
	s.commits.run(ctx, []*commitReq{r})
	return r.last, r.err
}

// run publishes reqs with whatever else is queued, and sets each one's
// outcome.
func (q *committer) run(ctx context.Context, reqs []*commitReq) {
	if len(reqs) == 0 {
		return
	}
	j := &commitJob{reqs: reqs, wake: make(chan struct{})}
	q.mu.Lock()
	q.queue = append(q.queue, j)
	lead := !q.busy
	q.busy = true
	q.mu.Unlock()
	if !lead {
		<-j.wake
		if !j.lead {
			return
		}
	}
	q.mu.Lock()
	batch := q.queue
	q.queue = nil
	q.mu.Unlock()

	var all []*commitReq
	for _, b := range batch {
		all = append(all, b.reqs...)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.timeout)
	q.publishAll(cctx, all)
	cancel()

	q.mu.Lock()
	if len(q.queue) > 0 {
		next := q.queue[0]
		next.lead = true
		close(next.wake)
	} else {
		q.busy = false
	}
	q.mu.Unlock()
	for _, b := range batch {
		if b != j {
			close(b.wake)
		}
	}
}

// publishAll publishes the requests, as few atomic batches as fit, and
// sets each one's outcome.
func (q *committer) publishAll(ctx context.Context, reqs []*commitReq) {
	for len(reqs) > 0 {
		n, size := 0, 0
		for n < len(reqs) && (n == 0 || size+len(reqs[n].msgs) <= maxCommitMessages) {
			size += len(reqs[n].msgs)
			n++
		}
		q.publishChunk(ctx, reqs[:n])
		reqs = reqs[n:]
	}
}

func (q *committer) publishChunk(ctx context.Context, reqs []*commitReq) {
	if len(reqs) == 1 {
		q.publishOne(ctx, reqs[0])
		return
	}
	if q.canPipeline(reqs) {
		q.publishPipelined(ctx, reqs)
		return
	}
	last, err := q.publishBatch(ctx, reqs)
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		// A batch's messages take consecutive sequences, in order.
		seq := last
		for i := len(reqs) - 1; i >= 0; i-- {
			reqs[i].last = seq
			seq -= uint64(len(reqs[i].msgs))
		}
	case errors.As(err, &apiErr):
		// JetStream refused the whole batch, so none of it is stored:
		// one request at a time, only the one at fault fails.
		for _, r := range reqs {
			q.publishOne(ctx, r)
		}
	default:
		// Whether the batch was stored is unknown.
		for _, r := range reqs {
			r.err = err
		}
	}
}

// publishOne publishes one request on its own.
func (q *committer) publishOne(ctx context.Context, r *commitReq) {
	if len(r.msgs) > 1 {
		r.last, r.err = q.publishBatch(ctx, []*commitReq{r})
		return
	}
	q.trips.Add(1)
	ack, err := q.js.PublishMsg(ctx, &nats.Msg{Subject: r.subject, Data: r.msgs[0]},
		jetstream.WithExpectLastSequencePerSubject(r.prev))
	if err != nil {
		r.err = err
		return
	}
	r.last = ack.Sequence
}

// canPipeline reports whether reqs may go as publishes of their own: few
// enough, one message each, and no two of the same subject, whose second
// would expect a sequence the first has not taken yet.
func (q *committer) canPipeline(reqs []*commitReq) bool {
	if len(reqs) > q.pipelined {
		return false
	}
	for i, r := range reqs {
		if len(r.msgs) != 1 {
			return false
		}
		for _, o := range reqs[:i] {
			if o.subject == r.subject {
				return false
			}
		}
	}
	return true
}

// publishPipelined publishes each request as its own message, expecting
// its prev, all sent before the first ack is awaited. Each is stored, and
// fsynced, on its own, and gets its own outcome: one refused fails alone,
// as a refused batch's retry one at a time would have it.
func (q *committer) publishPipelined(ctx context.Context, reqs []*commitReq) {
	q.trips.Add(1)
	futs := make([]jetstream.PubAckFuture, len(reqs))
	for i, r := range reqs {
		futs[i], r.err = q.js.PublishMsgAsync(&nats.Msg{Subject: r.subject, Data: r.msgs[0]},
			jetstream.WithExpectLastSequencePerSubject(r.prev))
	}
	for i, r := range reqs {
		if futs[i] == nil {
			continue
		}
		select {
		case ack := <-futs[i].Ok():
			r.last = ack.Sequence
		case err := <-futs[i].Err():
			r.err = err
		case <-ctx.Done():
			r.err = ctx.Err()
		}
	}
}

// publishBatch publishes the requests' messages as one JetStream atomic
// batch, each request's first message expecting its prev as its subject's
// last sequence, and returns the sequence of the last message. Only the
// commit message asks for a reply: JetStream answers it with the whole
// batch's outcome. A refusal is a *jetstream.APIError.
func (q *committer) publishBatch(ctx context.Context, reqs []*commitReq) (uint64, error) {
	q.trips.Add(1)
	q.batches.Add(1)
	var id [16]byte
	rand.Read(id[:])
	bid := hex.EncodeToString(id[:])
	nc := q.js.Conn()
	total := 0
	for _, r := range reqs {
		total += len(r.msgs)
	}
	n := 0
	for _, r := range reqs {
		for i, b := range r.msgs {
			n++
			m := nats.NewMsg(r.subject)
			m.Data = b
			m.Header.Set("Nats-Batch-Id", bid)
			m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(n))
			if i == 0 {
				m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(r.prev, 10))
			}
			if n < total {
				if err := nc.PublishMsg(m); err != nil {
					return 0, fmt.Errorf("batch publish: %w", err)
				}
				continue
			}
			m.Header.Set("Nats-Batch-Commit", "1")
			resp, err := nc.RequestMsgWithContext(ctx, m)
			if err != nil {
				return 0, fmt.Errorf("batch publish: %w", err)
			}
			var ack struct {
				Error *jetstream.APIError `json:"error"`
				Seq   uint64              `json:"seq"`
				Count int                 `json:"count"`
			}
			if err := json.Unmarshal(resp.Data, &ack); err != nil {
				return 0, fmt.Errorf("batch publish: ack: %w", err)
			}
			if ack.Error != nil {
				return 0, fmt.Errorf("batch publish: %w", ack.Error)
			}
			if ack.Count != total {
				return 0, fmt.Errorf("batch publish: stored %d of %d messages", ack.Count, total)
			}
			return ack.Seq, nil
		}
	}
	return 0, errors.New("batch publish: no messages")
}
