package appapi

import (
	"context"
	"errors"
)

// DefaultPusherQueue is the default capacity of a Pusher's queue.
const DefaultPusherQueue = 1024

// ErrPushQueueFull is returned by Pusher.Enqueue when the queue is full.
var ErrPushQueueFull = errors.New("push queue full")

// PushKey is the snapshot a push was made under. Only pushes with equal
// keys are combined, so a reconnect or an auth change never mixes
// credentials (zero-cache combinePushes).
type PushKey struct {
	ClientID string
	WSID     string
	Revision int64
}

// PushEntry is one queued push.
type PushEntry struct {
	Key     PushKey
	Request PushRequest
}

// PushOutcome is the result of one (combined) push.
type PushOutcome struct {
	// Entry is the push as sent: the first entry of its key, with the
	// mutations of every entry combined into it in arrival order.
	Entry  PushEntry
	Result PushResult
	// Err is the *Failure of the push, if any (see Client.Push).
	Err error
}

// Pusher forwards one client group's pushes to the mutate endpoint, one
// request at a time, as zero-cache's PusherService: pushes that arrive while
// a request is in flight wait in the queue, and the next round combines
// those of the same PushKey into one request. Mutations of one client thus
// reach the API server in order.
type Pusher struct {
	c      *Client
	queue  chan PushEntry
	handle func(context.Context, PushOutcome)
}

// NewPusher returns a Pusher with a queue of capacity entries (<= 0 means
// DefaultPusherQueue). handle is called from Run for every outcome, in
// order; it fans failures out to the clients (Failure.ByClient,
// PushResult.OutOfOrder) and validates or fails connections.
func (c *Client) NewPusher(capacity int, handle func(context.Context, PushOutcome)) *Pusher {
	if capacity <= 0 {
		capacity = DefaultPusherQueue
	}
	return &Pusher{c: c, queue: make(chan PushEntry, capacity), handle: handle}
}

// Enqueue queues a push without blocking.
func (p *Pusher) Enqueue(e PushEntry) error {
	select {
	case p.queue <- e:
		return nil
	default:
		return ErrPushQueueFull
	}
}

// Run sends queued pushes until ctx is done, then returns nil. Pushes still
// queued are dropped: their mutations stay pending on the clients, which
// push them again after reconnecting.
func (p *Pusher) Run(ctx context.Context) error {
	for {
		var first PushEntry
		select {
		case <-ctx.Done():
			return nil
		case first = <-p.queue:
		}
		batch := []PushEntry{first}
	drain:
		for {
			select {
			case e := <-p.queue:
				batch = append(batch, e)
			default:
				break drain
			}
		}
		for _, e := range CombinePushes(batch) {
			res, err := p.c.Push(ctx, e.Request)
			if ctx.Err() != nil {
				return nil
			}
			p.handle(ctx, PushOutcome{Entry: e, Result: res, Err: err})
		}
	}
}

// CombinePushes merges entries with the same key into one push each, in the
// order their keys first appear, concatenating their mutations.
func CombinePushes(entries []PushEntry) []PushEntry {
	idx := map[PushKey]int{}
	var out []PushEntry
	for _, e := range entries {
		i, ok := idx[e.Key]
		if !ok {
			c := e
			c.Request.Body.Mutations = append([]Mutation(nil), e.Request.Body.Mutations...)
			idx[e.Key] = len(out)
			out = append(out, c)
			continue
		}
		out[i].Request.Body.Mutations = append(out[i].Request.Body.Mutations, e.Request.Body.Mutations...)
	}
	return out
}
