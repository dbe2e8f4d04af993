package cvrstore

import (
	"encoding/json"
	"iter"
	"slices"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/streams"
)

// TTLs of desired queries (docs/protocol.md §12).
const (
	DefaultTTL = 5 * time.Minute
	MaxTTL     = 10 * time.Minute
)

// CVR is a client group's Client View Record (docs/protocol.md §6.4): what
// the group's clients have been told, with the version at which each piece
// last changed, so that any client can be caught up from its cookie. Its
// methods must not be called concurrently.
type CVR struct {
	ID string
	// Version is the cookie; "" until the first change.
	Version string
	// ReplicaVersion is the initial sync the rows came from.
	ReplicaVersion string
	ClientSchema   json.RawMessage
	// UserID pins the group to one user once an authenticated client
	// joined.
	UserID string
	// TTLClockMs is the group's TTL clock (docs/protocol.md §12) as of its
	// last reading; it advances only while the clock runs (StartClock).
	TTLClockMs float64

	Clients map[string]*Client
	Queries map[string]*Query
	Rows    map[string]*Row

	// PrunedThrough is the newest patch version of a record Prune
	// dropped: a cookie older than it cannot be caught up. "" while
	// nothing was pruned.
	PrunedThrough string
	// marks are the versions the CVR was at, and when (MarkVersion).
	marks []versionMark

	// Now is the wall clock the TTL clock follows; nil is time.Now.
	Now func() time.Time
	// clockAt is when the TTL clock was last advanced; zero while it is
	// stopped.
	clockAt time.Time

	// oneRef holds, per query, the refs map of the rows only it holds,
	// which they share (hold).
	oneRef map[string]map[string]int
	// updates counts the query updates begun, which mark the rows they
	// touch (Row.gen).
	updates uint64

	// lease and w are the durable store's handles, nil in memory.
	lease *Lease
	w     *Group
	// written is the instance record as last written, and
	// schemaWritten the client schema; config records are tracked by
	// dirty instead, rows by each Update. Only a durable store's CVRs
	// (track) keep dirty: memory has nothing to write.
	written       streams.CVRInstance
	schemaWritten json.RawMessage
	track         bool
	dirty         dirty
}

// New is an empty CVR.
func New(id string) *CVR {
	return &CVR{
		ID:      id,
		Clients: map[string]*Client{},
		Queries: map[string]*Query{},
		Rows:    map[string]*Row{},
	}
}

// Reset empties c, keeping its store handles and its clock; the Update
// that writes it is ResetUpdate.
func (c *CVR) Reset() {
	*c = CVR{
		ID: c.ID, Clients: map[string]*Client{}, Queries: map[string]*Query{}, Rows: map[string]*Row{},
		Now: c.Now, clockAt: c.clockAt, oneRef: c.oneRef, updates: c.updates, lease: c.lease, w: c.w, written: c.written, track: c.track,
	}
}

// Durable reports whether c is kept by a durable store.
func (c *CVR) Durable() bool { return c.w != nil }

// LeaseDone is closed when the durable store lost c's ownership; nil in
// memory.
func (c *CVR) LeaseDone() <-chan struct{} {
	if c.lease == nil {
		return nil
	}
	return c.lease.Done()
}

// LeaseErr is why the lease ended.
func (c *CVR) LeaseErr() error {
	if c.lease == nil {
		return nil
	}
	return c.lease.Err()
}

// Client is one client of the group.
type Client struct {
	ID      string
	Desired map[string]*Desire
	// Deleted clients keep their inactive desires until the TTLs run out.
	Deleted bool
}

// Desire is one client's wish for one query.
type Desire struct {
	TTL time.Duration
	// Inactive is unset while the client wants the query; the desired
	// patch is then a put, else a del. InactiveAt is when it became
	// inactive, on the group's TTL clock (ms).
	Inactive   bool
	InactiveAt float64
	// Cleared desires expire at once (op "clear", or a deleted client).
	Cleared      bool
	PatchVersion string
}

// Active reports whether the client wants the query.
func (d *Desire) Active() bool { return !d.Inactive }

// ExpiresAt is when, on the TTL clock, an inactive desire stops keeping its
// query alive.
func (d *Desire) ExpiresAt() float64 {
	if d.Cleared {
		return d.InactiveAt
	}
	return d.InactiveAt + float64(d.TTL/time.Millisecond)
}

// Expired reports whether the desire no longer keeps its query alive at
// TTL clock reading clock.
func (d *Desire) Expired(clock float64) bool {
	return !d.Active() && clock >= d.ExpiresAt()
}

// Query is a query the group knows: desired by someone, got, or both.
type Query struct {
	Hash string
	// AST is a legacy or internal query's AST, or a synced query's as the
	// API server last transformed it (nil until then).
	AST *zql.AST
	// Name and Args name a synced query; TransformationHash identifies
	// its AST, and TransformErr is the API server's refusal of it.
	Name               string
	Args               json.RawMessage
	TransformationHash string
	TransformErr       *appapi.QueryError
	Internal           bool
	// Got is set while the query's rows are in the group's row set;
	// PatchVersion is when Got last changed (a put, or a del once gone).
	Got          bool
	EverGot      bool
	PatchVersion string
}

// PendingTransform reports whether q is a synced query still waiting for
// its AST (not one the API server refused).
func (q *Query) PendingTransform() bool {
	return q.Name != "" && q.AST == nil && q.TransformErr == nil
}

// Row is a row the group's clients have (or had: a tombstone).
type Row struct {
	Table string
	// Key is the row's primary key as canonical JSON (streams.CVRRowKey),
	// which is how the store keys it and a del patch names it.
	Key string
	// Value is the row as last sent, shared with the view that read it;
	// zero for a row loaded from the durable store until its query
	// hydrates again.
	Value zql.RowValue
	// RowVersion is the row's _0_version as last sent.
	RowVersion string
	// Refs counts, per got query, whether it holds the row; nil is a
	// tombstone: the row was deleted from the clients at PatchVersion.
	// It is never changed in place, only replaced (Update.Hold), so that
	// the rows one query holds share one map.
	Refs         map[string]int
	PatchVersion string
	// gen and at mark the query update that last touched the record, and
	// its entry there (Update.touched).
	gen uint64
	at  int
}

// id is the record's identity, as c.Rows keys it.
func (r *Row) id() string { return r.Table + "\x00" + r.Key }

// KeyID is the identity of the row of table whose canonical key JSON is
// key: the table, a NUL, the key. The view-syncer builds the same from a
// row's value.
func KeyID(table string, key []byte) string {
	return table + "\x00" + string(key)
}

// ClampTTL is a desired query's TTL as the client asked for it (ms, nil
// for the default), within MaxTTL.
func ClampTTL(ms *float64) time.Duration {
	if ms == nil {
		return DefaultTTL
	}
	if *ms < 0 || *ms > float64(MaxTTL/time.Millisecond) {
		return MaxTTL
	}
	return time.Duration(*ms) * time.Millisecond
}

func (c *CVR) now() time.Time {
	if c.Now == nil {
		return time.Now()
	}
	return c.Now()
}

// StartClock runs the TTL clock, which runs while the group has
// connections (docs/protocol.md §12); it is a no-op while it runs.
func (c *CVR) StartClock() {
	if c.clockAt.IsZero() {
		c.clockAt = c.now()
	}
}

// StopClock advances the TTL clock to now and stops it.
func (c *CVR) StopClock(now time.Time) {
	c.ClockAt(now)
	c.clockAt = time.Time{}
}

// Clock advances the TTL clock to Now while it runs, and reads it.
func (c *CVR) Clock() float64 { return c.ClockAt(c.now()) }

// ClockAt advances the TTL clock to now while it runs, and reads it.
func (c *CVR) ClockAt(now time.Time) float64 {
	if !c.clockAt.IsZero() {
		if d := now.Sub(c.clockAt); d > 0 {
			c.TTLClockMs += float64(d) / float64(time.Millisecond)
			c.clockAt = now
		}
	}
	return c.TTLClockMs
}

// Expired reports whether no client keeps the query alive any more at TTL
// clock reading clock.
func (c *CVR) Expired(hash string, clock float64) bool {
	for _, cl := range c.Clients {
		if d := cl.Desired[hash]; d != nil && !d.Expired(clock) {
			return false
		}
	}
	return true
}

// NextEviction is when, on the TTL clock, the earliest of queries (the
// got, non-internal ones) expires; ok is false if none will.
func (c *CVR) NextEviction(clock float64, queries iter.Seq[string]) (next float64, ok bool) {
	for hash := range queries {
		latest, found := 0.0, false
		alive := false
		for _, cl := range c.Clients {
			d := cl.Desired[hash]
			if d == nil || d.Expired(clock) {
				continue
			}
			if d.Active() {
				alive = true
				break
			}
			if at := d.ExpiresAt(); !found || at > latest {
				latest, found = at, true
			}
		}
		switch {
		case alive:
		case !found:
			return clock, true // expired already
		case !ok || latest < next:
			next, ok = latest, true
		}
	}
	return next, ok
}

// Transformed records the API server's AST for the synced query hash.
func (c *CVR) Transformed(hash string, ast *zql.AST, transformationHash string) {
	q := c.Queries[hash]
	c.touchQuery(hash, q)
	q.AST, q.TransformationHash, q.TransformErr = ast, transformationHash, nil
}

// Refused records the API server's refusal of the synced query hash.
func (c *CVR) Refused(hash string, err *appapi.QueryError) {
	q := c.Queries[hash]
	c.touchQuery(hash, q)
	q.AST, q.TransformErr = nil, err
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
