package viewsyncer

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/jetsync/jetsync/consumers/appapi"
	"github.com/jetsync/jetsync/consumers/zql"
)

// cvr is a client group's Client View Record (docs/protocol.md §6.4): what
// the group's clients have been told, with the version at which each piece
// last changed, so that any client can be caught up from its cookie.
type cvr struct {
	id string
	// version is the cookie; "" until the first change.
	version string
	// replicaVersion is the initial sync the rows came from.
	replicaVersion string
	clientSchema   json.RawMessage
	// userID pins the group to one user once an authenticated client joined.
	userID string
	// ttlClockMs is the group's TTL clock (docs/protocol.md §12) as of its
	// last sync; it advances only while the group has connections.
	ttlClockMs float64

	// dg is the durable store's handle on the group, nil in memory.
	dg *durableGroup

	clients map[string]*clientRecord
	queries map[string]*queryRecord
	rows    map[string]*rowRecord
}

func newCVR(id string) *cvr {
	return &cvr{
		id:      id,
		clients: map[string]*clientRecord{},
		queries: map[string]*queryRecord{},
		rows:    map[string]*rowRecord{},
	}
}

type clientRecord struct {
	id      string
	desired map[string]*desire
	// deleted clients keep their inactive desires until the TTLs run out.
	deleted bool
}

// desire is one client's wish for one query.
type desire struct {
	ttl time.Duration
	// inactive is unset while the client wants the query; the desired
	// patch is then a put, else a del. inactiveAt is when it became
	// inactive, on the group's TTL clock (ms).
	inactive   bool
	inactiveAt float64
	// cleared desires expire at once (op "clear", or a deleted client).
	cleared      bool
	patchVersion string
}

func (d *desire) active() bool { return !d.inactive }

// expiresAt is when, on the TTL clock, an inactive desire stops keeping its
// query alive.
func (d *desire) expiresAt() float64 {
	if d.cleared {
		return d.inactiveAt
	}
	return d.inactiveAt + float64(d.ttl/time.Millisecond)
}

// expired reports whether the desire no longer keeps its query alive at
// TTL clock reading clock.
func (d *desire) expired(clock float64) bool {
	return !d.active() && clock >= d.expiresAt()
}

// queryRecord is a query the group knows: desired by someone, got, or both.
type queryRecord struct {
	hash string
	// ast is a legacy or internal query's AST, or a synced query's as the
	// API server last transformed it (nil until then).
	ast *zql.AST
	// name and args name a synced query; transformationHash identifies
	// its AST, and transformErr is the API server's refusal of it.
	name               string
	args               json.RawMessage
	transformationHash string
	transformErr       *appapi.QueryError
	internal           bool
	// got is set while the query's rows are in the group's row set;
	// patchVersion is when got last changed (a put, or a del once gone).
	got          bool
	everGot      bool
	patchVersion string
}

// rowRecord is a row the group's clients have (or had: a tombstone).
type rowRecord struct {
	table string
	// key is the row's primary key as canonical JSON (streams.CVRRowKey),
	// which is how the store keys it and a del patch names it.
	key string
	// value is the row as last sent, shared with the view that read it;
	// zero for a row loaded from the durable store until its query
	// hydrates again.
	value zql.RowValue
	// rowVersion is the row's _0_version as last sent.
	rowVersion string
	// refs counts, per got query, whether it holds the row; nil is a
	// tombstone: the row was deleted from the clients at patchVersion.
	refs         map[string]int
	patchVersion string
}

// cvrStore keeps CVRs beyond a group's life in memory: memStore in the
// process, durableStore (durable.go) on JetStream. flush gets the update's
// touched records, so that a durable store writes only those.
type cvrStore interface {
	// load returns the group's CVR, nil for a group never written. It
	// takes the group's ownership; *cvrstore.OwnedError reports a live
	// peer that holds it.
	load(ctx context.Context, groupID string) (*cvr, error)
	// flush makes the update durable; it returns before the pokeEnd that
	// carries its cookie goes out.
	flush(ctx context.Context, c *cvr, u *update) error
	// unload gives up a group no longer in memory: its ownership goes
	// back, so that a peer may serve it.
	unload(ctx context.Context, c *cvr)
	// drop forgets a group whose in-memory CVR can no longer be trusted;
	// the next load starts from what was durably written.
	drop(ctx context.Context, c *cvr)
}

// memStore keeps CVRs in memory.
type memStore struct {
	mu   sync.Mutex
	cvrs map[string]*cvr
}

func newMemStore() *memStore { return &memStore{cvrs: map[string]*cvr{}} }

func (m *memStore) load(_ context.Context, id string) (*cvr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cvrs[id], nil
}

func (m *memStore) flush(_ context.Context, c *cvr, _ *update) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cvrs[c.id] = c
	return nil
}

func (m *memStore) unload(context.Context, *cvr) {}

// drop forgets the CVR: memStore's copy is the broken one itself.
func (m *memStore) drop(_ context.Context, c *cvr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cvrs[c.id] == c {
		delete(m.cvrs, c.id)
	}
}
