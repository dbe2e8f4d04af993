package cvrstore

import (
	"context"
	"sync"
)

// applyQueue runs a store's projection applies after their PubAcks, off
// the publisher's path: the stream is the truth, and the local projection
// only caches it, so a poke need not wait for it. Applies of one group run
// in publish order; whatever reads a group's projection waits for its
// applies first (wait). The zero applyQueue is ready.
type applyQueue struct {
	mu sync.Mutex
	wg sync.WaitGroup
	// last is the done channel of each group's latest apply.
	last map[string]chan struct{}
}

// start runs f after the group's earlier applies.
func (q *applyQueue) start(group string, f func()) {
	done := make(chan struct{})
	q.mu.Lock()
	if q.last == nil {
		q.last = map[string]chan struct{}{}
	}
	prev := q.last[group]
	q.last[group] = done
	q.wg.Add(1)
	q.mu.Unlock()
	go func() {
		defer q.wg.Done()
		if prev != nil {
			<-prev
		}
		f()
		close(done)
		q.mu.Lock()
		if q.last[group] == done {
			delete(q.last, group)
		}
		q.mu.Unlock()
	}()
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
