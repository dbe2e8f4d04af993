package cvrstore

import (
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/jetsync/jetsync/consumers/zql"
)

// Update is one change to the CVR: config-driven (clients and their desired
// queries) or query-driven (hydrations, replica advances, evictions). It
// remembers what it touched, so that clients at its starting version get
// exactly those patches (Delta) and a durable store writes only the rows
// that changed.
type Update struct {
	c             *CVR
	From, Version string
	// Query is set for a query-driven update.
	Query bool
	// Reset replaces the whole CVR (a durable store writes it all); Clock
	// asks a durable store to write the TTL clock even if nothing else
	// changed.
	Reset, Clock bool
	// Compare has Put and Finish compare row values, not only versions:
	// a re-hydration after a resync resends only what differs.
	Compare bool

	// touched holds the rows the update touched, in order, each with its
	// state before; a record finds its entry by its touch mark (Row.gen,
	// Row.at), so that a whole-table hydration builds no map of 100k
	// entries beside the CVR's own.
	touched []touchedRow
	starts  []rowStart
	gen     uint64
	rows    []*Row // the rows whose PatchVersion is Version
	queries []string
	desires []DesireKey
}

// DesireKey names one client's desire for one query.
type DesireKey struct{ ClientID, Hash string }

// touchedRow is a row the update touched: its record (nil once Finish
// forgot a row never sent), how the update found it (starts[start], or
// absent when start is -1), and whether its put was streamed (Stream).
// It is small: a hydration touches every row of its query.
type touchedRow struct {
	rec      *Row
	start    int32
	streamed bool
}

func (e *touchedRow) st(u *Update) rowStart {
	if e.start < 0 {
		return rowStart{}
	}
	return u.starts[e.start]
}

// rowStart is a row as the update found it.
type rowStart struct {
	version string
	// value is kept for a comparing update (Update.Compare) only.
	value zql.RowValue
	// existed, patchVersion and refs are the record as the update found
	// it, so that a durable store writes only the records that changed.
	patchVersion string
	refs         map[string]int
	// live and existed sit together, so that a start takes 64 bytes: a
	// dropped whole-table query has one per row.
	live, existed bool
}

// BeginConfig starts a config-driven update.
func (c *CVR) BeginConfig() *Update {
	return &Update{c: c, From: c.Version, Version: c.Version}
}

// BeginQuery starts a query-driven update at replica state version state:
// the CVR moves to it if it is newer (docs/protocol.md §6.3).
func (c *CVR) BeginQuery(state string) *Update {
	c.updates++
	u := &Update{c: c, From: c.Version, Version: c.Version, Query: true, gen: c.updates}
	if state > StateOf(c.Version) {
		u.Version = state
	}
	return u
}

// ResetUpdate is the update that writes a CVR emptied by Reset.
func (c *CVR) ResetUpdate() *Update { return &Update{c: c, Reset: true} }

// V is the update's new version, bumping the config version at the first
// material change that needs one.
func (u *Update) V() string {
	if u.Version == u.From {
		u.Version = BumpConfig(u.From)
	}
	return u.Version
}

// Changed reports whether the update moved the version.
func (u *Update) Changed() bool { return u.Version != u.From }

// Idle reports whether a finished query-driven update changed nothing but
// the state version it would move to: no patch for the clients and no row
// record for the store. Such an update settles at its starting version
// (Settle), as zero-cache neither writes its CVR nor pokes when an
// advance leaves the group's rows as they were: the rows are the same at
// both versions, so the older one still describes them.
func (u *Update) Idle() bool {
	if !u.Query || u.Reset || u.From == "" || len(u.rows) > 0 || len(u.queries) > 0 || len(u.desires) > 0 {
		return false
	}
	if StateOf(u.Version) != u.Version && u.Version != u.From {
		return false // a config bump: something was patched
	}
	for i := range u.touched {
		e := &u.touched[i]
		st, rec := e.st(u), e.rec
		if rec == nil {
			if st.existed {
				return false
			}
			continue
		}
		if !st.existed || st.version != rec.RowVersion || st.patchVersion != rec.PatchVersion ||
			(st.refs == nil) != (rec.Refs == nil) || !maps.Equal(st.refs, rec.Refs) {
			return false
		}
	}
	return true
}

// Settle keeps an Idle update at its starting version.
func (u *Update) Settle() { u.Version = u.From }

// PatchedRows counts the rows the update patches (after Finish).
func (u *Update) PatchedRows() int { return len(u.rows) }

// SetClientSchema records the group's client schema, once.
func (u *Update) SetClientSchema(schema json.RawMessage) {
	u.c.ClientSchema = schema
	u.V()
}

// PutClient registers a client, or brings a deleted one back with no
// desires.
func (u *Update) PutClient(id string) {
	c := u.c
	if cl := c.Clients[id]; cl == nil || cl.Deleted {
		c.touchClient(id, cl)
		c.Clients[id] = &Client{ID: id, Desired: map[string]*Desire{}}
		u.V()
	}
}

// PatchOp is one op of a desiredQueriesPatch (docs/protocol.md §5): put,
// del or clear. AST is a put's parsed AST; Name, for a synced query, its
// name (Args its arguments).
type PatchOp struct {
	Op, Hash string
	TTL      *float64
	AST      *zql.AST
	Name     *string
	Args     json.RawMessage
}

// ApplyPatch applies one client's desiredQueriesPatch at TTL clock reading
// clock. A put of a query someone wanted before keeps the longer TTL; a
// del inactivates the desire, whose TTL then runs; a clear also makes every
// desire of the client expire at once.
func (u *Update) ApplyPatch(clientID string, ops []PatchOp, clock float64) {
	c := u.c
	cl := c.Clients[clientID]
	for _, op := range ops {
		switch op.Op {
		case "put":
			q := c.Queries[op.Hash]
			if q == nil {
				c.touchQuery(op.Hash, nil)
				q = &Query{Hash: op.Hash, AST: op.AST}
				if op.Name != nil {
					q.Name, q.Args = *op.Name, op.Args
					if len(q.Args) == 0 {
						q.Args = json.RawMessage("[]")
					}
				}
				c.Queries[op.Hash] = q
			} else if q.AST == nil && q.Name == "" {
				c.touchQuery(op.Hash, q)
				q.AST = op.AST
			}
			ttl := ClampTTL(op.TTL)
			d := cl.Desired[op.Hash]
			switch {
			case d == nil || !d.Active():
				c.touchDesire(clientID, op.Hash, d)
				cl.Desired[op.Hash] = &Desire{TTL: max(ttl, ttlOf(d)), PatchVersion: u.V()}
				u.desires = append(u.desires, DesireKey{clientID, op.Hash})
			case ttl > d.TTL:
				c.touchDesire(clientID, op.Hash, d)
				d.TTL = ttl
			}
		case "del":
			if d := cl.Desired[op.Hash]; d != nil && d.Active() {
				c.touchDesire(clientID, op.Hash, d)
				d.Inactive, d.InactiveAt, d.PatchVersion = true, clock, u.V()
				u.desires = append(u.desires, DesireKey{clientID, op.Hash})
			}
		case "clear":
			// In order, so that the delta's patches come in one order.
			for _, hash := range sortedKeys(cl.Desired) {
				d := cl.Desired[hash]
				c.touchDesire(clientID, hash, d)
				d.Cleared = true
				if d.Active() {
					d.Inactive, d.InactiveAt, d.PatchVersion = true, clock, u.V()
					u.desires = append(u.desires, DesireKey{clientID, hash})
				}
			}
		}
	}
}

func ttlOf(d *Desire) time.Duration {
	if d == nil {
		return 0
	}
	return d.TTL
}

// DeleteClient inactivates a client's queries with their TTLs and drops it
// from the group (docs/protocol.md §4.3).
func (u *Update) DeleteClient(id string, clock float64) {
	c := u.c
	cl := c.Clients[id]
	if cl == nil || cl.Deleted {
		return
	}
	for _, hash := range sortedKeys(cl.Desired) {
		if d := cl.Desired[hash]; d.Active() {
			c.touchDesire(id, hash, d)
			d.Inactive, d.InactiveAt, d.PatchVersion = true, clock, u.V()
			u.desires = append(u.desires, DesireKey{id, hash})
		}
	}
	c.touchClient(id, cl)
	cl.Deleted = true
	u.V()
}

// PutInternalQuery (re)places the internal query hash, which the group
// runs for itself: its rows become other patches than rows'.
func (u *Update) PutInternalQuery(hash string, ast *zql.AST) *Query {
	c := u.c
	c.touchQuery(hash, c.Queries[hash])
	q := &Query{Hash: hash, AST: ast, Internal: true}
	c.Queries[hash] = q
	return q
}

// Got puts a query in the got set: its rows are the clients' from now on.
// Internal queries are never got.
func (u *Update) Got(hash string) {
	q := u.c.Queries[hash]
	if q.Internal || q.Got {
		return
	}
	u.c.touchQuery(hash, q)
	q.Got, q.EverGot, q.PatchVersion = true, true, u.V()
	u.queries = append(u.queries, hash)
}

// Unget takes a query out of the got set.
func (u *Update) Unget(hash string) {
	if q := u.c.Queries[hash]; q != nil && q.Got {
		u.c.touchQuery(hash, q)
		q.Got, q.PatchVersion = false, u.V()
		u.queries = append(u.queries, hash)
	}
}

func (u *Update) touchRow(rec *Row) {
	if rec != nil && rec.gen == u.gen {
		return
	}
	e := touchedRow{rec: rec, start: -1}
	if rec != nil {
		st := rowStart{existed: true, version: rec.RowVersion, patchVersion: rec.PatchVersion, refs: rec.Refs} // never changed in place
		if rec.Refs != nil {
			st.live = true
			if u.Compare {
				// Only a comparing update reads it; keeping it otherwise
				// would hold every value of a dropped query's rows until
				// the update is gone.
				st.value = rec.Value
			}
		}
		e.start = int32(len(u.starts))
		u.starts = append(u.starts, st)
		rec.gen, rec.at = u.gen, len(u.touched)
	}
	u.touched = append(u.touched, e)
}

// entry is rec's touched entry, nil if u did not touch it.
func (u *Update) entry(rec *Row) *touchedRow {
	if rec == nil || u.gen == 0 || rec.gen != u.gen {
		return nil
	}
	return &u.touched[rec.at]
}

// start is how u found rec: the zero rowStart for a row it created.
func (u *Update) start(rec *Row) rowStart {
	if e := u.entry(rec); e != nil {
		return e.st(u)
	}
	return rowStart{}
}

// Hold makes the query hash hold the row id (key its canonical key JSON)
// with value r, creating its record; the caller then asks Put whether to
// stream it.
func (u *Update) Hold(id, key, hash string, r zql.RowValue) *Row {
	c := u.c
	rec := c.Rows[id]
	u.touchRow(rec)
	if rec == nil {
		rec = &Row{Table: r.Table(), Key: key}
		c.Rows[id] = rec
		rec.gen, rec.at = u.gen, len(u.touched)-1
		u.touched[len(u.touched)-1].rec = rec
	}
	c.addRef(rec, hash)
	rec.Value, rec.RowVersion = r, r.Version()
	return rec
}

// Release makes the query hash no longer hold the row id; Finish turns a
// row no query holds into a del.
func (u *Update) Release(id, hash string) {
	rec := u.c.Rows[id]
	u.touchRow(rec)
	u.c.delRef(rec, hash)
}

// Put reports whether the held row rec (id) will be sent as a put if it
// stays live to the end of the update: it is new to the clients, or
// changed.
func (u *Update) Put(id string, rec *Row) bool {
	return putNeeded(u.start(rec), rec, u.Compare)
}

// Stream records that the put of rec, held by u, was streamed: Finish
// checks that it ends as one, and Unstreamed leaves it out.
func (u *Update) Stream(rec *Row) {
	if e := u.entry(rec); e != nil {
		e.streamed = true
	}
}

// Streamed reports whether the put of rec was streamed (Stream).
func (u *Update) Streamed(rec *Row) bool {
	e := u.entry(rec)
	return e != nil && e.streamed
}

func putNeeded(st rowStart, rec *Row, compare bool) bool {
	return !st.live || rec.RowVersion != st.version || compare && !st.value.IsZero() && !rec.Value.Equal(st.value)
}

// A row's refs map is never changed in place, only replaced (addRef,
// delRef), so that the rows one query holds share one map: a whole-table
// query's 100k rows hold one instead of 100k. Updates and store events
// may then keep a record's refs without copying them.

// addRef makes the query hash hold rec.
func (c *CVR) addRef(rec *Row, hash string) {
	if rec.Refs[hash] == 1 {
		return
	}
	if len(rec.Refs) == 0 {
		one := c.oneRef[hash]
		if one == nil {
			one = map[string]int{hash: 1}
			if c.oneRef == nil {
				c.oneRef = map[string]map[string]int{}
			}
			c.oneRef[hash] = one
		}
		rec.Refs = one
		return
	}
	m := maps.Clone(rec.Refs)
	m[hash] = 1
	rec.Refs = m
}

// delRef makes the query hash no longer hold rec; the refs of a row no
// query holds any more are empty, not nil, until Finish. A row left with
// no query, or with one, shares the CVR's map for that, as addRef's rows
// do: dropping a whole-table query makes no map per row.
func (c *CVR) delRef(rec *Row, hash string) {
	if _, ok := rec.Refs[hash]; !ok {
		return
	}
	switch len(rec.Refs) {
	case 1:
		rec.Refs = noRefs
		return
	case 2:
		for h, n := range rec.Refs {
			if h != hash && n == 1 {
				rec.Refs = nil
				c.addRef(rec, h)
				return
			}
		}
	}
	m := make(map[string]int, len(rec.Refs)-1)
	for h, n := range rec.Refs {
		if h != hash {
			m[h] = n
		}
	}
	rec.Refs = m
}

// noRefs is the refs of a row no query holds any more, until Finish. Like
// every refs map, it is never written.
var noRefs = map[string]int{}

// Finish turns the update's reference changes into row patches: a put for
// a row that appeared or changed, a del (and a tombstone) for one no got
// query holds any more (docs/protocol.md §7.1). A row never sent is
// forgotten.
//
// streamed holds rows already sent as puts, beside those marked by
// Stream: each must end as one, or a client would hold a row the CVR does
// not record.
func (u *Update) Finish(streamed map[string]struct{}) error {
	c := u.c
	for i := range u.touched {
		e := &u.touched[i]
		st, rec := e.st(u), e.rec
		live := len(rec.Refs) > 0
		put := live && putNeeded(st, rec, u.Compare)
		if !put {
			ok := e.streamed
			if !ok && streamed != nil {
				_, ok = streamed[rec.id()]
			}
			if ok {
				return fmt.Errorf("row %q was streamed as a put but is not one", rec.id())
			}
		}
		switch {
		case put:
			rec.PatchVersion = u.V()
			u.rows = append(u.rows, rec)
		case !live && st.live:
			// A tombstone needs only its key: a del carries that, and a
			// row that comes back is read again. Keeping the value would
			// hold a whole table's rows after its query goes.
			rec.Refs, rec.Value, rec.PatchVersion = nil, zql.RowValue{}, u.V()
			u.rows = append(u.rows, rec)
		case !live && rec.PatchVersion == "":
			delete(c.Rows, rec.id()) // never sent
			e.rec = nil
		case !live:
			rec.Refs = nil
		}
	}
	return nil
}
