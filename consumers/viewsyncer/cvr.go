package viewsyncer

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/jetsync/jetsync/consumers/zql"
)

// cvr is a client group's Client View Record (server-model.md §3): what
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
	// inactiveAt is zero while the client wants the query; the desired
	// patch is then a put, else a del.
	inactiveAt time.Time
	// cleared desires expire at once (op "clear", or a deleted client).
	cleared      bool
	patchVersion string
}

func (d *desire) active() bool { return d.inactiveAt.IsZero() }

// expired reports whether the desire no longer keeps its query alive.
func (d *desire) expired(now time.Time) bool {
	if d.active() {
		return false
	}
	return d.cleared || !now.Before(d.inactiveAt.Add(d.ttl))
}

// queryRecord is a query the group knows: desired by someone, got, or both.
type queryRecord struct {
	hash     string
	ast      *zql.AST
	internal bool
	// got is set while the query's rows are in the group's row set;
	// patchVersion is when got last changed (a put, or a del once gone).
	got          bool
	everGot      bool
	patchVersion string
}

// rowRecord is a row the group's clients have (or had: a tombstone).
type rowRecord struct {
	table string
	id    map[string]any
	value zql.Row
	// rowVersion is the row's _0_version as last sent.
	rowVersion string
	// refs counts, per got query, whether it holds the row; nil is a
	// tombstone: the row was deleted from the clients at patchVersion.
	refs         map[string]int
	patchVersion string
}

// cvrStore keeps CVRs beyond a group's life in memory. The next issue puts a
// durable implementation on JetStream behind it; flush gets the update's
// touched records, so that a durable store writes only those.
type cvrStore interface {
	load(ctx context.Context, groupID string) (*cvr, error)
	flush(ctx context.Context, c *cvr, u *update) error
	// drop forgets a CVR that can no longer be trusted.
	drop(groupID string)
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

func (m *memStore) drop(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.cvrs, id)
}
