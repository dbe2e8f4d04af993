package cvrstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/projections/cvr"
	"github.com/jetsync/jetsync/streams"
)

// clockPersistMs is how far the TTL clock may run ahead of what the store
// holds before a flush writes it, as zero-cache writes it every minute.
const clockPersistMs = 60_000

// ErrPurged is what loading a group that garbage collection purged gives:
// its clients must start a new group.
var ErrPurged = errors.New("cvr purged")

// dirty holds the config records (clients, desires, queries) changed since
// the last flush, each as it was before its first change: what the store
// holds of it, absent (existed false) for a record the store lacks. A flush
// writes those that differ from it. It lives on the CVR, not an Update,
// since a transform changes queries between updates.
type dirty struct {
	clients map[string]clientWas
	desires map[DesireKey]desireWas
	queries map[string]queryWas
}

type clientWas struct{ existed, deleted bool }

type desireWas struct {
	existed bool
	rec     streams.CVRDesire
}

type queryWas struct {
	existed bool
	base    queryBase
}

// queryBase is what the stream holds of a query; its AST never changes
// once set, so the pointer stands for it.
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

func baseOf(q *Query) queryBase {
	if q.Name != "" {
		return queryBase{name: q.Name, th: q.TransformationHash, internal: q.Internal, got: q.Got, patchVersion: q.PatchVersion}
	}
	return queryBase{ast: q.AST, internal: q.Internal, got: q.Got, patchVersion: q.PatchVersion}
}

// touchClient records cl (nil: none) before a change to client id.
func (c *CVR) touchClient(id string, cl *Client) {
	if !c.track {
		return
	}
	if _, ok := c.dirty.clients[id]; ok {
		return
	}
	if c.dirty.clients == nil {
		c.dirty.clients = map[string]clientWas{}
	}
	w := clientWas{}
	if cl != nil {
		w = clientWas{existed: true, deleted: cl.Deleted}
	}
	c.dirty.clients[id] = w
}

func (c *CVR) touchDesire(clientID, hash string, d *Desire) {
	if !c.track {
		return
	}
	k := DesireKey{clientID, hash}
	if _, ok := c.dirty.desires[k]; ok {
		return
	}
	if c.dirty.desires == nil {
		c.dirty.desires = map[DesireKey]desireWas{}
	}
	w := desireWas{}
	if d != nil {
		w = desireWas{existed: true, rec: desireRecord(clientID, hash, d)}
	}
	c.dirty.desires[k] = w
}

func (c *CVR) touchQuery(hash string, q *Query) {
	if !c.track {
		return
	}
	if _, ok := c.dirty.queries[hash]; ok {
		return
	}
	if c.dirty.queries == nil {
		c.dirty.queries = map[string]queryWas{}
	}
	w := queryWas{}
	if q != nil {
		w = queryWas{existed: true, base: baseOf(q)}
	}
	c.dirty.queries[hash] = w
}

// Mem keeps CVRs in memory, for a view-syncer without a CVR stream.
type Mem struct {
	mu   sync.Mutex
	cvrs map[string]*CVR
}

// NewMem is an empty Mem.
func NewMem() *Mem { return &Mem{cvrs: map[string]*CVR{}} }

// Load returns the group's CVR, nil for a group never flushed.
func (m *Mem) Load(_ context.Context, id string) (*CVR, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cvrs[id], nil
}

// Flush keeps c.
func (m *Mem) Flush(_ context.Context, c *CVR, _ *Update) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cvrs[c.ID] = c
	return nil
}

// Quiet is always true: memory has nothing to write.
func (m *Mem) Quiet(*CVR) bool { return true }

// Unload does nothing: memory has no owners.
func (m *Mem) Unload(context.Context, *CVR) {}

// Drop forgets the CVR: Mem's copy is the broken one itself.
func (m *Mem) Drop(_ context.Context, c *CVR) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cvrs[c.ID] == c {
		delete(m.cvrs, c.ID)
	}
}

// Durable keeps CVRs in the JetStream CVR stream through a Store: loading a
// group takes its lease, and each flush publishes the records the update
// changed before the pokeEnd that carries its cookie goes out.
type Durable struct {
	Store *Store
	Log   *slog.Logger
}

// Load returns the group's CVR, nil for a group never written. It takes
// the group's ownership; *OwnedError reports a live peer that holds it,
// ErrPurged a group garbage collection purged.
func (d *Durable) Load(ctx context.Context, id string) (*CVR, error) {
	s := d.Store
	lease, err := s.Acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	w, err := s.Load(ctx, id, lease)
	if err != nil {
		_ = s.Release(ctx, lease)
		return nil, err
	}
	st, err := w.State(ctx)
	if err != nil {
		_ = s.Release(ctx, lease)
		return nil, err
	}
	if st.Instance.Deleted {
		_ = s.Release(ctx, lease)
		return nil, ErrPurged
	}
	c, err := fromState(st)
	if err != nil {
		_ = s.Release(ctx, lease)
		return nil, fmt.Errorf("load cvr %s: %w", id, err)
	}
	c.lease, c.w = lease, w
	info := w.Info()
	d.Log.Debug("cvr loaded", logkey.ClientGroup, id, "version", c.Version, "rows", len(c.Rows),
		logkey.Seq, w.Seq(), "from", info.FromSeq, "replayed", info.Replayed, "rebuilt", info.Rebuilt)
	return c, nil
}

// fromState is a loaded CVR. Row contents are not stored: a row's value
// stays zero until its query hydrates again, which a loaded group does
// before it pokes.
func fromState(st *cvr.State) (*CVR, error) {
	c := New(st.GroupID)
	c.track = true
	in := st.Instance
	c.written, c.schemaWritten = in, st.ClientSchema
	c.Version, c.ReplicaVersion, c.TTLClockMs, c.UserID = in.Version, in.ReplicaVersion, in.TTLClockMs, in.UserID
	c.ClientSchema = st.ClientSchema
	for id, cl := range st.Clients {
		c.Clients[id] = &Client{ID: id, Desired: map[string]*Desire{}, Deleted: cl.Deleted}
	}
	for k, d := range st.Desires {
		cl := c.Clients[k.ClientID]
		if cl == nil {
			// A desire outlived its client's record: the client is
			// written back, deleted.
			c.touchClient(k.ClientID, nil)
			cl = &Client{ID: k.ClientID, Desired: map[string]*Desire{}, Deleted: true}
			c.Clients[k.ClientID] = cl
		}
		ds := &Desire{TTL: time.Duration(d.TTLMs) * time.Millisecond, Cleared: d.Cleared, PatchVersion: d.PatchVersion}
		if d.InactivatedAtMs != nil {
			ds.Inactive, ds.InactiveAt = true, *d.InactivatedAtMs
		}
		cl.Desired[k.Hash] = ds
	}
	for h, q := range st.Queries {
		qr := &Query{Hash: h, Internal: q.Internal, Got: q.Got, EverGot: q.PatchVersion != "", PatchVersion: q.PatchVersion,
			Name: q.Name, Args: q.Args, TransformationHash: q.TransformationHash}
		if len(q.AST) > 0 && q.Name == "" {
			ast, err := zql.ParseAST(q.AST)
			if err != nil {
				return nil, fmt.Errorf("query %s: %w", h, err)
			}
			qr.AST = ast
		}
		c.Queries[h] = qr
	}
	for _, r := range st.Rows {
		// Keys are stored as written, canonical (streams.CVRRowKey).
		if !json.Valid(r.Key) {
			return nil, fmt.Errorf("row key %s of %s is not JSON", r.Key, r.Table)
		}
		id := KeyID(r.Table, r.Key)
		c.Rows[id] = &Row{Table: r.Table, Key: id[len(r.Table)+1:], RowVersion: r.RowVersion, Refs: r.Refs, PatchVersion: r.PatchVersion}
	}
	return c, nil
}

// Quiet reports whether a Flush of an update that changed nothing, with
// the TTL clock run to now, would write nothing: the view-syncer then
// moves an untouched group on without one.
func (d *Durable) Quiet(c *CVR) bool {
	w := c.written
	return c.Version == w.Version && c.ReplicaVersion == w.ReplicaVersion && c.UserID == w.UserID &&
		c.Clock()-w.TTLClockMs < clockPersistMs && c.dirty.clients == nil && c.dirty.desires == nil && c.dirty.queries == nil &&
		(c.ClientSchema == nil || bytes.Equal(c.ClientSchema, c.schemaWritten))
}

// Flush makes the update durable; it returns before the pokeEnd that
// carries its cookie goes out. It writes the instance record, the config
// records changed since the last flush, and the rows the update changed.
func (d *Durable) Flush(ctx context.Context, c *CVR, u *Update) error {
	var evs []streams.CVREvent
	if u.Reset {
		evs = append(evs, streams.CVREvent{Op: streams.CVROpSnapshot, Snapshot: &streams.CVRSnapshot{Version: c.Version}})
		c.schemaWritten = nil
	}
	in := streams.CVRInstance{
		Version: c.Version, ReplicaVersion: c.ReplicaVersion, TTLClockMs: c.TTLClockMs,
		LastActiveMs: c.written.LastActiveMs, UserID: c.UserID,
	}
	cfg, err := configEvents(c)
	if err != nil {
		return err
	}
	rows := rowEvents(c, u)
	old := c.written
	changed := u.Reset || u.Clock || len(cfg) > 0 || len(rows) > 0 || in.Version != old.Version ||
		in.ReplicaVersion != old.ReplicaVersion || in.UserID != old.UserID || in.TTLClockMs-old.TTLClockMs >= clockPersistMs
	if !changed {
		c.dirty = dirty{}
		return nil
	}
	in.LastActiveMs = time.Now().UnixMilli()
	evs = slices.Grow(evs, 1+len(cfg)+len(rows))
	evs = append(evs, streams.CVREvent{Op: streams.CVROpInstance, Instance: &in})
	evs = append(append(evs, cfg...), rows...)
	if err := c.w.Publish(ctx, c.Version, evs); err != nil {
		return err
	}
	c.written, c.schemaWritten, c.dirty = in, c.ClientSchema, dirty{}
	return nil
}

// configEvents are the events for the config records (schema, clients,
// desires, queries) that changed since the last flush, in the order of
// client ID (each client before its desires, by hash), then of query hash.
func configEvents(c *CVR) ([]streams.CVREvent, error) {
	var evs []streams.CVREvent
	if c.ClientSchema != nil && !bytes.Equal(c.ClientSchema, c.schemaWritten) {
		evs = append(evs, streams.CVREvent{Op: streams.CVROpClientSchema, ClientSchema: c.ClientSchema})
	}
	dt := &c.dirty
	ids := slices.Collect(maps.Keys(dt.clients))
	byClient := map[string][]string{}
	for k := range dt.desires {
		if _, ok := byClient[k.ClientID]; !ok {
			if _, ok := dt.clients[k.ClientID]; !ok {
				ids = append(ids, k.ClientID)
			}
		}
		byClient[k.ClientID] = append(byClient[k.ClientID], k.Hash)
	}
	slices.Sort(ids)
	for _, id := range ids {
		cl := c.Clients[id]
		if cl == nil {
			continue
		}
		if was, ok := dt.clients[id]; ok && (!was.existed || was.deleted != cl.Deleted) {
			evs = append(evs, streams.CVREvent{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: id, Deleted: cl.Deleted}})
		}
		hs := byClient[id]
		slices.Sort(hs)
		for _, h := range hs {
			ds := cl.Desired[h]
			if ds == nil {
				continue
			}
			rec := desireRecord(id, h, ds)
			if was := dt.desires[DesireKey{id, h}]; !was.existed || !sameDesire(was.rec, rec) {
				evs = append(evs, streams.CVREvent{Op: streams.CVROpPutDesire, Desire: &rec})
			}
		}
	}
	for _, h := range sortedKeys(dt.queries) {
		q := c.Queries[h]
		if q == nil {
			continue
		}
		if was := dt.queries[h]; was.existed && was.base == baseOf(q) {
			continue
		}
		rec := streams.CVRQuery{Hash: h, Internal: q.Internal, Got: q.Got, PatchVersion: q.PatchVersion,
			Name: q.Name, Args: q.Args, TransformationHash: q.TransformationHash}
		if q.AST != nil && q.Name == "" {
			b, err := json.Marshal(q.AST)
			if err != nil {
				return nil, fmt.Errorf("query %s: %w", h, err)
			}
			rec.AST = b
		}
		evs = append(evs, streams.CVREvent{Op: streams.CVROpPutQuery, Query: &rec})
	}
	return evs, nil
}

func desireRecord(clientID, hash string, d *Desire) streams.CVRDesire {
	r := streams.CVRDesire{ClientID: clientID, Hash: hash, TTLMs: int64(d.TTL / time.Millisecond), Cleared: d.Cleared, PatchVersion: d.PatchVersion}
	if d.Inactive {
		at := d.InactiveAt
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
func rowEvents(c *CVR, u *Update) []streams.CVREvent {
	var b streams.CVRRowEvents
	add := func(rec *Row) {
		// Publish applies the events after it returns: they may share
		// the record's refs, which are replaced, never changed (addRef).
		b.Add(streams.CVRRow{Table: rec.Table, Key: json.RawMessage(rec.Key), RowVersion: rec.RowVersion,
			PatchVersion: rec.PatchVersion, Refs: rec.Refs})
	}
	if u.Reset {
		for _, id := range sortedKeys(c.Rows) {
			add(c.Rows[id])
		}
		return b.Events()
	}
	for i := range u.touched {
		e := &u.touched[i]
		rec, st := e.rec, e.st(u)
		if rec == nil {
			continue
		}
		if st.existed && st.version == rec.RowVersion && st.patchVersion == rec.PatchVersion &&
			(st.refs == nil) == (rec.Refs == nil) && maps.Equal(st.refs, rec.Refs) {
			continue
		}
		add(rec)
	}
	return b.Events()
}

// Unload gives up a group no longer in memory: its ownership goes back, so
// that a peer may serve it.
func (d *Durable) Unload(ctx context.Context, c *CVR) {
	if c == nil || c.lease == nil {
		return
	}
	if err := d.Store.Release(ctx, c.lease); err != nil {
		d.Log.Warn("release cvr lease", logkey.ClientGroup, c.ID, "err", err)
	}
}

// Drop forgets a group whose in-memory CVR can no longer be trusted; the
// next Load starts from what was durably written.
func (d *Durable) Drop(ctx context.Context, c *CVR) {
	d.Unload(ctx, c)
	if err := d.Store.Forget(ctx, c.ID); err != nil {
		d.Log.Warn("forget cvr", logkey.ClientGroup, c.ID, "err", err)
	}
}
