package cvrstore

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/streams"
)

// maxApplyBatch bounds how many updates one projection transaction
// applies.
const maxApplyBatch = 256

// applyJob is one published update waiting for the local projection.
type applyJob struct {
	g   *Group
	ctx context.Context
	// last is the stream sequence of msgs' last message; the others
	// precede it one by one.
	last uint64
	msgs []*streams.CVRMessage
	done chan struct{}
}

// applyQueue runs a store's projection applies after their PubAcks, off
// the publisher's path: the stream is the truth, and the local projection
// only caches it, so a poke need not wait for it. One goroutine at a time
// drains the queue, in publish order, applying what waits in one SQLite
// transaction: an advance publishes the updates of all its groups at
// once, and a transaction each cost more than the updates (apply.go's
// Store.applyBatch). Whatever reads a group's projection waits for its
// applies first (wait).
type applyQueue struct {
	run func([]*applyJob) // applies a batch; set by Open

	mu      sync.Mutex
	wg      sync.WaitGroup
	queue   []*applyJob
	running bool
	// last is the done channel of each group's latest apply.
	last map[string]chan struct{}
	// batches counts the transactions of queued applies, for tests.
	batches atomic.Int64
}

// start queues j after every update published before it, and drains the
// queue unless a goroutine is already at it.
func (q *applyQueue) start(j *applyJob) {
	j.done = make(chan struct{})
	q.mu.Lock()
	if q.last == nil {
		q.last = map[string]chan struct{}{}
	}
	q.last[j.g.id] = j.done
	q.queue = append(q.queue, j)
	q.wg.Add(1)
	idle := !q.running
	q.running = true
	q.mu.Unlock()
	if idle {
		go q.drain()
	}
}

// drain applies the queue's jobs, what came meanwhile as the next batch,
// until none is left.
func (q *applyQueue) drain() {
	for {
		q.mu.Lock()
		n := min(len(q.queue), maxApplyBatch)
		if n == 0 {
			q.queue, q.running = nil, false
			q.mu.Unlock()
			return
		}
		batch := q.queue[:n:n]
		q.queue = q.queue[n:]
		q.mu.Unlock()
		q.batches.Add(1)
		q.run(batch)
		q.mu.Lock()
		for _, j := range batch {
			close(j.done)
			if q.last[j.g.id] == j.done {
				delete(q.last, j.g.id)
			}
		}
		q.mu.Unlock()
		q.wg.Add(-len(batch))
	}
}

// wait returns once the group's applies started so far are done.
func (q *applyQueue) wait(ctx context.Context, group string) error {
	q.mu.Lock()
	done := q.last[group]
	q.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitAll returns once every apply started so far is done.
func (q *applyQueue) waitAll() { q.wg.Wait() }

// applyBatch applies the jobs' updates in one transaction. If one fails
// (an error, or a panic: applyTx), the transaction is rolled back and
// each is applied again in one of its own, so that only the group at
// fault is broken; its next Load repairs it from the stream.
func (s *Store) applyBatch(batch []*applyJob) {
	ctx := context.Background()
	err := s.applyTx(ctx, func(tx *sql.Tx) error {
		for _, j := range batch {
			if err := s.applyJob(tx, j); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		return
	}
	if len(batch) == 1 {
		batch[0].fail(err)
		return
	}
	s.log.Debug("cvr projection batch failed; applying its updates one at a time", "updates", len(batch), "err", err)
	failed := map[*Group]bool{}
	for _, j := range batch {
		if failed[j.g] {
			continue // the group is broken already; its later updates would not follow
		}
		if err := s.applyTx(ctx, func(tx *sql.Tx) error { return s.applyJob(tx, j) }); err != nil {
			j.fail(err)
			failed[j.g] = true
		}
	}
}

func (s *Store) applyJob(tx *sql.Tx, j *applyJob) error {
	if hook := applyHook.Load(); hook != nil {
		(*hook)(j.g.id)
	}
	for i, m := range j.msgs {
		if _, err := s.stmts.Apply(j.ctx, tx, j.last-uint64(len(j.msgs)-1-i), m); err != nil {
			return err
		}
	}
	return nil
}

// fail records that the job's update is not in the local projection:
// the stream has it, and the group's next Load replays it.
func (j *applyJob) fail(err error) {
	g := j.g
	g.s.log.Warn("cvr projection apply failed; the group must be reloaded", logkey.ClientGroup, g.id, logkey.Seq, j.last, "err", err)
	g.applyMu.Lock()
	if g.applyErr == nil {
		g.applyErr = err
	}
	g.applyMu.Unlock()
}
