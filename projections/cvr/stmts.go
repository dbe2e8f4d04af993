package cvr

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
)

// Stmts holds Apply's statements prepared on one *sql.DB, for a writer
// that applies many small messages: an advance's message for one group is
// a few one-row statements, and SQLite parsing them again for every
// message cost more than running them. It is safe for concurrent use;
// Close it before its DB.
type Stmts struct {
	// byQuery is read-only once Prepare returns.
	byQuery map[string]*sql.Stmt
	// misses counts statements an Apply had to prepare in its
	// transaction, for tests.
	misses atomic.Int64
}

// Prepare prepares Apply's statements on db. It takes one of db's
// connections: call it while none is in use, such as before the first
// transaction, on a pool of one connection.
func Prepare(ctx context.Context, db *sql.DB) (*Stmts, error) {
	s := &Stmts{byQuery: map[string]*sql.Stmt{}}
	// Put-rows of one row is an advance's; of putRowsMax, a hydration's
	// bulk. Other counts are prepared in the transaction that needs them.
	for _, q := range append(applySQL[:len(applySQL):len(applySQL)], putRowsSQL(1), putRowsSQL(putRowsMax)) {
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("prepare cvr statements: %w", err), s.Close())
		}
		s.byQuery[q] = st
	}
	return s, nil
}

// Close closes the statements.
func (s *Stmts) Close() error {
	var errs []error
	for _, st := range s.byQuery {
		errs = append(errs, st.Close())
	}
	return errors.Join(errs...)
}

// get is query's prepared statement, or nil.
func (s *Stmts) get(query string) *sql.Stmt {
	if s == nil {
		return nil
	}
	st := s.byQuery[query]
	if st == nil {
		s.misses.Add(1)
	}
	return st
}

// applySQL is what Prepare prepares besides put-rows.
var applySQL = []string{progressSQL, insertInstanceSQL, progressUpdateSQL, progressVersionUpdateSQL, instanceSQL,
	clientSchemaSQL, putClientSQL, delClientSQL, putQuerySQL, gotSQL, delQuerySQL, putDesireSQL, delDesireSQL, delRowSQL}

// Apply's statements.
const (
	insertInstanceSQL        = `INSERT INTO instances (groupID) VALUES (?) ON CONFLICT DO NOTHING`
	progressUpdateSQL        = `UPDATE instances SET seq = ?, prev = ?, part = ?, last = ?, sinceSnapshot = ? WHERE groupID = ?`
	progressVersionUpdateSQL = `UPDATE instances SET seq = ?, prev = ?, part = ?, last = ?, sinceSnapshot = ?, version = ? WHERE groupID = ?`
	instanceSQL              = `UPDATE instances SET version = ?2, replicaVersion = ?3, ttlClockMs = ?4, lastActiveMs = ?5,
	owner = ?6, grantedAtMs = ?7, profileID = ?8, userID = ?9, deleted = ?10 WHERE groupID = ?1`
	clientSchemaSQL = `UPDATE instances SET clientSchema = ?2 WHERE groupID = ?1`
	putClientSQL    = `INSERT OR REPLACE INTO clients (groupID, clientID, deleted) VALUES (?1, ?2, ?3)`
	delClientSQL    = `DELETE FROM clients WHERE groupID = ?1 AND clientID = ?2`
	putQuerySQL     = `INSERT OR REPLACE INTO queries (groupID, hash, ast, name, args, transformationHash, transformationVersion,
	internal, got, patchVersion) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)`
	gotSQL = `INSERT INTO queries (groupID, hash, name, transformationHash, transformationVersion, internal, got, patchVersion)
	VALUES (?1, ?2, '', '', '', 0, ?3, ?4)
	ON CONFLICT (groupID, hash) DO UPDATE SET got = excluded.got, patchVersion = excluded.patchVersion`
	delQuerySQL  = `DELETE FROM queries WHERE groupID = ?1 AND hash = ?2`
	putDesireSQL = `INSERT OR REPLACE INTO desires (groupID, clientID, hash, ttlMs, inactivatedAtMs, cleared, patchVersion)
	VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)`
	delDesireSQL = `DELETE FROM desires WHERE groupID = ?1 AND clientID = ?2 AND hash = ?3`
	delRowSQL    = `DELETE FROM rows WHERE groupID = ?1 AND tbl = ?2 AND key = ?3`
)
