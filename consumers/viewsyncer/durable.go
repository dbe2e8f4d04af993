package viewsyncer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/zql"
	projcvr "github.com/jetsync/jetsync/projections/cvr"
	"github.com/jetsync/jetsync/streams"
)

// clockPersistMs is how far the TTL clock may run ahead of what the store
// holds before a flush writes it, as zero-cache writes it every minute.
const clockPersistMs = 60_000

// durableStore keeps CVRs in the JetStream CVR stream through a
// cvrstore.Store: loading a group takes its lease, and each flush publishes
// the records the update changed before the pokeEnd that carries its
// cookie goes out.
type durableStore struct {
	s   *cvrstore.Store
	log *slog.Logger
}

// durableGroup is a loaded group's store state: its lease, its writer, and
// the config records as the stream holds them, so that a flush writes only
// what changed. Rows are tracked by the update instead (rowStart), since
// copying them all would double the CVR's memory.
type durableGroup struct {
	lease *cvrstore.Lease
	w     *cvrstore.Group

	instance streams.CVRInstance
	schema   json.RawMessage
	clients  map[string]streams.CVRClient
	queries  map[string]queryBase
	desires  map[projcvr.DesireKey]streams.CVRDesire
}

// errPurged is what every client of a group that garbage collection
// purged gets, with or without a cookie, as from zero-cache: the client
// gives the group up and starts a new one.
var errPurged = newProtocolError(kindClientNotFound, "Client has been purged due to inactivity")

// queryBase is a query record as last written; its AST never changes once
// set, so the pointer stands for it.
type queryBase struct {
	// ast is nil for a synced query, whose AST is not stored: it is
	// transformed again after a load, as zero-cache does; name and th
	// (its transformation hash) stand for it.
	ast          *zql.AST
	name, th     string
	internal     bool
	got          bool
	patchVersion string
}

func (d *durableStore) load(ctx context.Context, id string) (*cvr, error) {
	lease, err := d.s.Acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	w, err := d.s.Load(ctx, id, lease)
	if err != nil {
		_ = d.s.Release(ctx, lease)
		return nil, err
	}
	st, err := w.State(ctx)
	if err != nil {
		_ = d.s.Release(ctx, lease)
		return nil, err
	}
	if st.Instance.Deleted {
		_ = d.s.Release(ctx, lease)
		return nil, errPurged
	}
	c, err := fromState(st)
	if err != nil {
		_ = d.s.Release(ctx, lease)
		return nil, fmt.Errorf("load cvr %s: %w", id, err)
	}
	c.dg.lease, c.dg.w = lease, w
	info := w.Info()
	d.log.Debug("cvr loaded", "client_group", id, "version", c.version, "rows", len(c.rows),
		"seq", w.Seq(), "from", info.FromSeq, "replayed", info.Replayed, "rebuilt", info.Rebuilt)
	return c, nil
}

// fromState is a loaded CVR. Row contents are not stored: a row's value
// stays nil until its query hydrates again, which a loaded group does
// before it pokes (group.cold).
func fromState(st *projcvr.State) (*cvr, error) {
	c := newCVR(st.GroupID)
	dg := &durableGroup{
		instance: st.Instance,
		schema:   st.ClientSchema,
		clients:  st.Clients,
		queries:  map[string]queryBase{},
		desires:  st.Desires,
	}
	c.dg = dg
	in := st.Instance
	c.version, c.replicaVersion, c.ttlClockMs, c.userID = in.Version, in.ReplicaVersion, in.TTLClockMs, in.UserID
	c.clientSchema = st.ClientSchema
	for id, cl := range st.Clients {
		c.clients[id] = &clientRecord{id: id, desired: map[string]*desire{}, deleted: cl.Deleted}
	}
	for k, d := range st.Desires {
		cr := c.clients[k.ClientID]
		if cr == nil {
			cr = &clientRecord{id: k.ClientID, desired: map[string]*desire{}, deleted: true}
			c.clients[k.ClientID] = cr
		}
		ds := &desire{ttl: time.Duration(d.TTLMs) * time.Millisecond, cleared: d.Cleared, patchVersion: d.PatchVersion}
		if d.InactivatedAtMs != nil {
			ds.inactive, ds.inactiveAt = true, *d.InactivatedAtMs
		}
		cr.desired[k.Hash] = ds
	}
	for h, q := range st.Queries {
		qr := &queryRecord{hash: h, internal: q.Internal, got: q.Got, everGot: q.PatchVersion != "", patchVersion: q.PatchVersion,
			name: q.Name, args: q.Args, transformationHash: q.TransformationHash}
		if len(q.AST) > 0 && q.Name == "" {
			ast, err := zql.ParseAST(q.AST)
			if err != nil {
				return nil, fmt.Errorf("query %s: %w", h, err)
			}
			qr.ast = ast
		}
		c.queries[h] = qr
		dg.queries[h] = baseOf(qr)
	}
	for _, r := range st.Rows {
		// Keys are stored as written, canonical (streams.CVRRowKey).
		if !json.Valid(r.Key) {
			return nil, fmt.Errorf("row key %s of %s is not JSON", r.Key, r.Table)
		}
		id := keyID(r.Table, r.Key)
		c.rows[id] = &rowRecord{table: r.Table, key: id[len(r.Table)+1:], rowVersion: r.RowVersion, refs: r.Refs, patchVersion: r.PatchVersion}
	}
	return c, nil
}

func (d *durableStore) flush(ctx context.Context, c *cvr, u *update) error {
	dg := c.dg
	var evs []streams.CVREvent
	if u.reset {
		evs = append(evs, streams.CVREvent{Op: streams.CVROpSnapshot, Snapshot: &streams.CVRSnapshot{Version: c.version}})
		dg.schema, dg.clients, dg.queries, dg.desires = nil, nil, map[string]queryBase{}, nil
	}
	in := streams.CVRInstance{
		Version: c.version, ReplicaVersion: c.replicaVersion, TTLClockMs: c.ttlClockMs,
		LastActiveMs: dg.instance.LastActiveMs, UserID: c.userID,
	}
	cfg, err := configEvents(c, dg)
	if err != nil {
		return err
	}
	rows, err := rowEvents(c, u)
	if err != nil {
		return err
	}
	old := dg.instance
	changed := u.reset || u.clock || len(cfg) > 0 || len(rows) > 0 || in.Version != old.Version ||
		in.ReplicaVersion != old.ReplicaVersion || in.UserID != old.UserID || in.TTLClockMs-old.TTLClockMs >= clockPersistMs
	if !changed {
		return nil
	}
	in.LastActiveMs = time.Now().UnixMilli()
	evs = slices.Grow(evs, 1+len(cfg)+len(rows))
	evs = append(evs, streams.CVREvent{Op: streams.CVROpInstance, Instance: &in})
	evs = append(append(evs, cfg...), rows...)
	if err := dg.w.Publish(ctx, c.version, evs); err != nil {
		return err
	}
	dg.instance = in
	dg.schema = c.clientSchema
	dg.clients = map[string]streams.CVRClient{}
	for id, cr := range c.clients {
		dg.clients[id] = streams.CVRClient{ID: id, Deleted: cr.deleted}
		for h, ds := range cr.desired {
			dg.desires[projcvr.DesireKey{ClientID: id, Hash: h}] = desireRecord(id, h, ds)
		}
	}
	for h, q := range c.queries {
		dg.queries[h] = baseOf(q)
	}
	return nil
}

// baseOf is what the stream holds of q.
func baseOf(q *queryRecord) queryBase {
	if q.name != "" {
		return queryBase{name: q.name, th: q.transformationHash, internal: q.internal, got: q.got, patchVersion: q.patchVersion}
	}
	return queryBase{ast: q.ast, internal: q.internal, got: q.got, patchVersion: q.patchVersion}
}

// configEvents are the events for the config records (schema, clients,
// queries, desires) that differ from what the stream holds. They are few,
// so comparing them all beats tracking every place that changes one.
func configEvents(c *cvr, dg *durableGroup) ([]streams.CVREvent, error) {
	var evs []streams.CVREvent
	if c.clientSchema != nil && !bytes.Equal(c.clientSchema, dg.schema) {
		evs = append(evs, streams.CVREvent{Op: streams.CVROpClientSchema, ClientSchema: c.clientSchema})
	}
	if dg.desires == nil {
		dg.desires = map[projcvr.DesireKey]streams.CVRDesire{}
	}
	for _, id := range sortedKeys(c.clients) {
		cr := c.clients[id]
		if old, ok := dg.clients[id]; !ok || old.Deleted != cr.deleted {
			evs = append(evs, streams.CVREvent{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: id, Deleted: cr.deleted}})
		}
		for _, h := range sortedKeys(cr.desired) {
			d := desireRecord(id, h, cr.desired[h])
			if old, ok := dg.desires[projcvr.DesireKey{ClientID: id, Hash: h}]; !ok || !sameDesire(old, d) {
				evs = append(evs, streams.CVREvent{Op: streams.CVROpPutDesire, Desire: &d})
			}
		}
	}
	for _, h := range sortedKeys(c.queries) {
		q := c.queries[h]
		if old, ok := dg.queries[h]; ok && old == baseOf(q) {
			continue
		}
		rec := streams.CVRQuery{Hash: h, Internal: q.internal, Got: q.got, PatchVersion: q.patchVersion,
			Name: q.name, Args: q.args, TransformationHash: q.transformationHash}
		if q.ast != nil && q.name == "" {
			b, err := json.Marshal(q.ast)
			if err != nil {
				return nil, fmt.Errorf("query %s: %w", h, err)
			}
			rec.AST = b
		}
		evs = append(evs, streams.CVREvent{Op: streams.CVROpPutQuery, Query: &rec})
	}
	return evs, nil
}

func desireRecord(clientID, hash string, d *desire) streams.CVRDesire {
	r := streams.CVRDesire{ClientID: clientID, Hash: hash, TTLMs: int64(d.ttl / time.Millisecond), Cleared: d.cleared, PatchVersion: d.patchVersion}
	if d.inactive {
		at := d.inactiveAt
		r.InactivatedAtMs = &at
	}
	return r
}

func sameDesire(a, b streams.CVRDesire) bool {
	ai, bi := a.InactivatedAtMs, b.InactivatedAtMs
	a.InactivatedAtMs, b.InactivatedAtMs = nil, nil
	return a == b && (ai == nil) == (bi == nil) && (ai == nil || *ai == *bi)
}

// rowEvents are the events for the rows the update touched and changed.
// A row deleted from the CVR was never sent, nor written. Consecutive rows
// that share their table, patch version and refs, as a hydration's do, go
// as put-rows events: ~32 bytes a row against ~145 for a put-row each
// (go run ./bench/cvr prints the bytes per row).
func rowEvents(c *cvr, u *update) ([]streams.CVREvent, error) {
	all := u.reset
	ids := u.rowOrder
	if all {
		ids = sortedKeys(c.rows)
	}
	var b streams.CVRRowEvents
	for _, id := range ids {
		rec := c.rows[id]
		if rec == nil {
			continue
		}
		if st := u.rowStart[id]; !all && st.existed && st.version == rec.rowVersion &&
			st.patchVersion == rec.patchVersion && (st.refs == nil) == (rec.refs == nil) && maps.Equal(st.refs, rec.refs) {
			continue
		}
		// Publish applies the events after it returns: they may share
		// the record's refs, which are replaced, never changed (addRef).
		b.Add(streams.CVRRow{Table: rec.table, Key: json.RawMessage(rec.key), RowVersion: rec.rowVersion,
			PatchVersion: rec.patchVersion, Refs: rec.refs})
	}
	return b.Events(), nil
}

func (d *durableStore) unload(ctx context.Context, c *cvr) {
	if c == nil || c.dg == nil {
		return
	}
	if err := d.s.Release(ctx, c.dg.lease); err != nil {
		d.log.Warn("release cvr lease", "client_group", c.id, "err", err)
	}
}

func (d *durableStore) drop(ctx context.Context, c *cvr) {
	d.unload(ctx, c)
	if err := d.s.Forget(ctx, c.id); err != nil {
		d.log.Warn("forget cvr", "client_group", c.id, "err", err)
	}
}
