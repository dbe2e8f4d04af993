package zql

import (
	"container/list"
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"
)

// DefaultStmtCacheSize is how many statements a StmtCache keeps.
const DefaultStmtCacheSize = 256

// prepareWait bounds the wait for a pool connection to prepare on, for
// when another caller took the last idle one first.
const prepareWait = 20 * time.Millisecond

var errNoIdleConn = errors.New("no idle connection to prepare on")

// StmtCache keeps prepared statements of one *sql.DB by their SQL text.
// A view's lookups are the same few statements for every client group
// that runs the query and at every change, and parsing them again each
// time was most of what a one-row update cost (SQLite's prepare). Each
// statement is prepared once per connection of the pool and kept; the
// least recently used go beyond the cache's size. It is safe for
// concurrent use.
type StmtCache struct {
	db   *sql.DB
	size int

	mu    sync.Mutex
	bySQL map[string]*list.Element // of *cachedStmt
	lru   list.List                // front: most recently used
}

type cachedStmt struct {
	query string
	stmt  *sql.Stmt
}

// NewStmtCache returns a cache of db's statements holding at most size
// (DefaultStmtCacheSize when size is not positive).
func NewStmtCache(db *sql.DB, size int) *StmtCache {
	if size <= 0 {
		size = DefaultStmtCacheSize
	}
	return &StmtCache{db: db, size: size, bySQL: map[string]*list.Element{}}
}

// Querier runs tx's queries through the cache. tx must be a transaction
// of the cache's *sql.DB.
func (c *StmtCache) Querier(tx *sql.Tx) Querier { return cachedTx{tx: tx, c: c} }

// Close closes the cached statements.
func (c *StmtCache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.bySQL {
		_ = e.Value.(*cachedStmt).stmt.Close()
	}
	c.bySQL = map[string]*list.Element{}
	c.lru.Init()
	return nil
}

func (c *StmtCache) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	if e, ok := c.bySQL[query]; ok {
		c.lru.MoveToFront(e)
		c.mu.Unlock()
		return e.Value.(*cachedStmt).stmt, nil
	}
	c.mu.Unlock()
	// Preparing takes a connection of the pool (a transaction's own
	// connection prepares it again for itself). Its caller holds one
	// already: never wait for another, which could wait for ever if
	// every holder did the same. Run unprepared this time instead.
	if st := c.db.Stats(); st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
		return nil, errNoIdleConn
	}
	pctx, cancel := context.WithTimeout(ctx, prepareWait)
	defer cancel()
	st, err := c.db.PrepareContext(pctx, query)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.bySQL[query]; ok {
		// Another caller prepared it meanwhile.
		_ = st.Close()
		c.lru.MoveToFront(e)
		return e.Value.(*cachedStmt).stmt, nil
	}
	c.bySQL[query] = c.lru.PushFront(&cachedStmt{query: query, stmt: st})
	for c.lru.Len() > c.size {
		old := c.lru.Back()
		cs := old.Value.(*cachedStmt)
		c.lru.Remove(old)
		delete(c.bySQL, cs.query)
		// database/sql defers the close while a transaction uses it.
		_ = cs.stmt.Close()
	}
	return st, nil
}

// cachedTx is a transaction whose queries use the cache's statements,
// bound to the transaction's connection.
type cachedTx struct {
	tx *sql.Tx
	c  *StmtCache
}

func (q cachedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := q.c.stmt(ctx, query)
	if err != nil {
		// Preparing failed (such as a pool closing): the transaction
		// says why, or runs it.
		return q.tx.QueryContext(ctx, query, args...)
	}
	rows, err := q.tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	if err != nil && ctx.Err() == nil {
		// Such as a statement of another pool's: a read is safe to
		// run again, unprepared.
		return q.tx.QueryContext(ctx, query, args...)
	}
	return rows, err
}
