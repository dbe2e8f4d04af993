package replica

import (
	"container/list"
	"context"
	"database/sql"
)

// DefaultStmtCacheSize is how many prepared statements an Applier keeps
// across transactions.
const DefaultStmtCacheSize = 256

// stmtCache keeps an Applier's prepared statements by their SQL. A
// replica applies the same few statements in every transaction, and
// preparing them again in each was a tenth of the CPU of a stream of
// single-row transactions (SQLite's parser).
//
// A statement kept across transactions must be prepared on the *sql.DB,
// and the replica's pool has one connection, which the transaction holds.
// So a statement is first prepared for its transaction alone, and once that
// transaction has committed, again on the database (keep), where
// tx.StmtContext finds it on the connection from then on. keep is a call of
// its own so that the replicator prepares after it has told its
// subscribers of the commit, not on their path. A schema change
// or a rollback drops them all (invalidate): the SQL of each table's
// statements is made from its spec, so a statement is only ever reused
// against the schema it was prepared for.
type stmtCache struct {
	db   *sql.DB // nil: statements last as long as their transaction
	size int

	bySQL map[string]*list.Element // of *cachedStmt, prepared on db
	lru   list.List                // front: most recently used

	tx *sql.Tx
	// inTx holds tx's statements, bound to it, by SQL.
	inTx map[string]*sql.Stmt
	// fresh are the SQL of statements prepared for tx alone, to prepare on
	// db once tx has committed.
	fresh []string
	// prepared counts the statements prepared for a transaction alone.
	prepared int
}

type cachedStmt struct {
	query string
	stmt  *sql.Stmt
}

func newStmtCache(db *sql.DB, size int) *stmtCache {
	if size <= 0 {
		size = DefaultStmtCacheSize
	}
	return &stmtCache{db: db, size: size, bySQL: map[string]*list.Element{}, inTx: map[string]*sql.Stmt{}}
}

// use binds the cache to tx. Statements bound to an earlier transaction
// died with it, and those it prepared for itself are lost unless keep was
// called.
func (c *stmtCache) use(tx *sql.Tx) {
	if tx == c.tx {
		return
	}
	c.closeTx()
	c.fresh = c.fresh[:0]
	c.tx = tx
}

func (c *stmtCache) closeTx() {
	for q, s := range c.inTx {
		_ = s.Close()
		delete(c.inTx, q)
	}
}

// stmt returns query prepared for tx. keep false marks a statement not
// worth keeping past tx (one with a literal of the transaction's).
func (c *stmtCache) stmt(ctx context.Context, tx *sql.Tx, query string, keep bool) (*sql.Stmt, error) {
	c.use(tx)
	if s, ok := c.inTx[query]; ok {
		return s, nil
	}
	if e, ok := c.bySQL[query]; ok {
		c.lru.MoveToFront(e)
		s := tx.StmtContext(ctx, e.Value.(*cachedStmt).stmt)
		c.inTx[query] = s
		return s, nil
	}
	s, err := tx.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.prepared++
	c.inTx[query] = s
	if keep && c.db != nil {
		c.fresh = append(c.fresh, query)
	}
	return s, nil
}

// commit ends tx, now committed. The statements it prepared for itself
// stay listed in fresh until keep prepares them on the database, or the
// next transaction forgets them.
func (c *stmtCache) commit(tx *sql.Tx) {
	if tx != c.tx {
		return
	}
	c.closeTx()
	c.tx = nil
}

// keep prepares on the database the statements the last committed
// transaction prepared for itself, so that the next ones reuse them.
// Failing to is not an error: the next transaction prepares them for
// itself.
func (c *stmtCache) keep(ctx context.Context) {
	fresh := c.fresh
	c.fresh = c.fresh[:0]
	if c.tx != nil || c.db == nil || len(fresh) == 0 {
		return
	}
	// The pool's one connection is free now, unless a caller outside the
	// Applier holds it: never wait for it.
	if st := c.db.Stats(); st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
		return
	}
	for _, q := range fresh {
		if _, ok := c.bySQL[q]; ok {
			continue
		}
		s, err := c.db.PrepareContext(ctx, q)
		if err != nil {
			continue
		}
		c.bySQL[q] = c.lru.PushFront(&cachedStmt{query: q, stmt: s})
	}
	for c.lru.Len() > c.size {
		old := c.lru.Back()
		cs := old.Value.(*cachedStmt)
		c.lru.Remove(old)
		delete(c.bySQL, cs.query)
		_ = cs.stmt.Close()
	}
}

// invalidate closes every statement: the schema changed, or a rollback
// may have undone a change the statements were prepared after.
func (c *stmtCache) invalidate() {
	c.closeTx()
	c.fresh = c.fresh[:0]
	for q, e := range c.bySQL {
		// database/sql closes it once tx lets go of it.
		_ = e.Value.(*cachedStmt).stmt.Close()
		delete(c.bySQL, q)
	}
	c.lru.Init()
}
