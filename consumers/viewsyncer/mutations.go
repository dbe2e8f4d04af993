package viewsyncer

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/internal/logkey"
)

// cleanupKey marks the pusher entries that carry _zero_cleanupResults
// mutations: never combined with a client's pushes, and their failures
// only logged (docs/protocol.md §14).
const cleanupKey = "\x00cleanup"

// mutationPatch is a mutations row's mutationsPatch entry: a put of its
// result, or a del once the row left (docs/protocol.md §8). Rows of
// another group are left out.
func (g *group) mutationPatch(rec *cvrstore.Row) json.RawMessage {
	type mutationID struct {
		ClientID string  `json:"clientID"`
		ID       float64 `json:"id"`
	}
	if rec.Refs == nil {
		var k struct {
			ClientGroupID string  `json:"clientGroupID"`
			ClientID      string  `json:"clientID"`
			MutationID    float64 `json:"mutationID"`
		}
		if err := json.Unmarshal([]byte(rec.Key), &k); err != nil || k.ClientGroupID != g.id {
			return nil
		}
		b, _ := json.Marshal(struct {
			Op string     `json:"op"`
			ID mutationID `json:"id"`
		}{"del", mutationID{k.ClientID, k.MutationID}})
		return b
	}
	if rec.Value.IsZero() {
		return nil
	}
	cgid, _ := rec.Value.Get("clientGroupID").(string)
	cid, _ := rec.Value.Get("clientID").(string)
	mid, ok := rec.Value.Get("mutationID").(float64)
	if cgid != g.id || cid == "" || !ok {
		return nil
	}
	result, _ := rec.Value.Get("result").(json.RawMessage)
	if len(result) == 0 {
		result = json.RawMessage("null")
	}
	type mutation struct {
		ID     mutationID      `json:"id"`
		Result json.RawMessage `json:"result"`
	}
	b, err := json.Marshal(struct {
		Op       string   `json:"op"`
		Mutation mutation `json:"mutation"`
	}{"put", mutation{mutationID{cid, mid}, result}})
	if err != nil {
		return nil
	}
	return b
}

// push forwards a push's custom mutations to the mutate endpoint through
// the group's pusher (docs/protocol.md §14). Legacy CRUD mutations go to
// pushCRUD, or are refused as zero-cache refuses them with
// ZERO_ENABLE_CRUD_MUTATIONS off.
func (g *group) push(ctx context.Context, c *conn, body *appapi.PushBody) error {
	if body.ClientGroupID != g.id {
		return newProtocolError(kindInvalidPush, "clientGroupID in mutation %q does not match clientGroupID of connection %q", body.ClientGroupID, g.id)
	}
	if len(body.Mutations) == 0 {
		return nil
	}
	if body.Mutations[0].Type != "custom" {
		if g.s.cfg.Mutagen == nil {
			return newProtocolError(kindInvalidPush, "Support for legacy CRUD mutations is disabled")
		}
		return g.pushCRUD(ctx, c, body)
	}
	if !g.s.api.MutateConfigured() {
		return newProtocolError(kindInvalidPush, "A ZERO_MUTATE_URL must be set in order to process custom mutations.")
	}
	unlock := g.lock()
	defer unlock()
	if !g.current(c) || g.unloaded {
		return nil
	}
	ac, err := g.cc.MustConn(c.selector())
	if err != nil {
		return err
	}
	g.s.metrics.pushes.Inc()
	g.s.metrics.customMutations.Add(float64(len(body.Mutations)))
	err = g.pusherLocked().Enqueue(appapi.PushEntry{
		Key:     appapi.PushKey{ClientID: c.clientID, WSID: c.wsID, Revision: int64(ac.Revision)},
		Request: appapi.PushRequest{Conn: c.apiConn(ac), URL: ac.Mutate.url, Headers: ac.Mutate.headers, Body: *body},
	})
	if errors.Is(err, appapi.ErrPushQueueFull) {
		perr := newProtocolError(kindServerOverloaded, "Too many pending pushes")
		return perr
	}
	return err
}

// ackMutationResponses asks the API server to delete the client's mutation
// results up to the acknowledged one; the deletes come back as
// mutationsPatch dels (docs/protocol.md §4.6).
func (g *group) ackMutationResponses(c *conn, id *appapi.MutationID) error {
	if !g.s.api.MutateConfigured() {
		return nil
	}
	body, err := g.s.api.CleanupResultsBody(g.id, id.ClientID, id.ID)
	if err != nil {
		return err
	}
	return g.cleanup(c, body)
}

// cleanupClients asks the API server to delete deleted clients' results.
func (g *group) cleanupClients(c *conn, ids []string) error {
	if len(ids) == 0 || !g.s.api.MutateConfigured() {
		return nil
	}
	body, err := g.s.api.CleanupClientsBody(g.id, ids)
	if err != nil {
		return err
	}
	return g.cleanup(c, body)
}

// cleanup queues a cleanup push on c's behalf.
func (g *group) cleanup(c *conn, body appapi.PushBody) error {
	unlock := g.lock()
	defer unlock()
	if !g.current(c) || g.unloaded {
		return nil
	}
	ac, err := g.cc.MustConn(c.selector())
	if err != nil {
		return err
	}
	err = g.pusherLocked().Enqueue(appapi.PushEntry{
		Key:     appapi.PushKey{ClientID: cleanupKey, WSID: body.RequestID},
		Request: appapi.PushRequest{Conn: c.apiConn(ac), URL: ac.Mutate.url, Headers: ac.Mutate.headers, Body: body},
	})
	if err != nil {
		g.log.Warn("mutation results cleanup dropped", "err", err)
	}
	return nil
}

// pusherLocked returns the group's pusher, starting it on first use. It
// stops when the group leaves memory (stopPusherLocked).
func (g *group) pusherLocked() *appapi.Pusher {
	if g.pusher != nil {
		return g.pusher
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := g.s.api.NewPusher(0, g.pushed)
	g.pusher, g.stopPush = p, cancel
	g.s.bg.Go(func() {
		defer g.contain("pusher")
		if err := p.Run(ctx); err != nil {
			g.log.Error("pusher", "err", err)
		}
	})
	return p
}

// stopPusherLocked stops the group's pusher; queued pushes are dropped, and
// their clients push them again after reconnecting.
func (g *group) stopPusherLocked() {
	if g.stopPush != nil {
		g.stopPush()
	}
}

// pushed handles the outcome of one push, on the pusher's goroutine: a
// failure goes to the clients whose mutations it names, an auth failure
// also invalidates their connection; a success validates the pushing
// connection, and an out-of-order result fails its client.
func (g *group) pushed(_ context.Context, o appapi.PushOutcome) {
	unlock := g.lock()
	defer unlock()
	testPanicHook("pusher", g.id)
	key := o.Entry.Key
	if key.ClientID == cleanupKey {
		if o.Err != nil {
			g.log.Warn("mutation results cleanup failed", "request", o.Entry.Request.Body.RequestID, "err", o.Err)
		}
		return
	}
	failClient := func(clientID string, err error) {
		c := g.conns[clientID]
		if c == nil {
			return
		}
		if appapi.IsAuth(err) {
			rev := -1
			if clientID == key.ClientID && c.wsID == key.WSID {
				rev = int(key.Revision)
			} else if ac, ok := g.cc.Conn(c.selector()); ok {
				rev = ac.Revision
			}
			if _, ok := g.cc.Fail(c.selector(), rev); !ok {
				return // the connection changed since: its new auth stands
			}
		}
		c.ready = false
		c.failErr(err)
	}
	if o.Err != nil {
		g.log.Info("push failed", logkey.Client, key.ClientID, "err", o.Err)
		var f *appapi.Failure
		if !errors.As(o.Err, &f) {
			failClient(key.ClientID, o.Err)
			return
		}
		by := f.ByClient()
		if len(by) == 0 {
			failClient(key.ClientID, f)
		}
		for cid, cf := range by {
			failClient(cid, cf)
		}
		return
	}
	for cid, f := range o.Result.OutOfOrder() {
		failClient(cid, f)
	}
	c := g.conns[key.ClientID]
	if c == nil || c.wsID != key.WSID {
		return
	}
	if _, _, err := g.cc.Validate(c.selector(), int(key.Revision), validation(o.Result.Validation)); err != nil {
		g.cc.Fail(c.selector(), int(key.Revision))
		c.ready = false
		c.failErr(err)
	}
}
