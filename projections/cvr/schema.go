// Package cvr is the client view record projection: it applies the CVR
// stream's messages (streams.CVRMessage) to a SQLite state store laid out
// like zero-cache's CVR tables, and
// reads back a group's state and catch-up diffs. Many groups share one
// database. It is pure: SQLite only, no NATS, goroutines or clock.
//
// Application is idempotent by stream sequence: each group records the
// sequence of its last applied message, and an older or repeated one is
// skipped. Each message also names the sequence before it (Prev), so a
// reader that missed messages (history purged by compaction) notices:
// it is then at a snapshot, which replaces the group's state, or Apply
// reports ErrGap.
package cvr

import (
	"context"
	"database/sql"
	"fmt"
)

// Execer is what Init and Drop write with: a *sql.DB, *sql.Tx or *sql.Conn.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Querier is what Load reads with.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Tables are named as zero-cache names them; instances also holds each
// group's progress through the stream.
const schemaDDL = `
CREATE TABLE IF NOT EXISTS instances (
  groupID TEXT PRIMARY KEY,
  seq INTEGER NOT NULL DEFAULT 0,
  prev INTEGER NOT NULL DEFAULT 0,
  part INTEGER NOT NULL DEFAULT 0,
  last INTEGER NOT NULL DEFAULT 1,
  sinceSnapshot INTEGER NOT NULL DEFAULT 0,
  version TEXT NOT NULL DEFAULT '',
  replicaVersion TEXT NOT NULL DEFAULT '',
  ttlClockMs REAL NOT NULL DEFAULT 0,
  lastActiveMs INTEGER NOT NULL DEFAULT 0,
  owner TEXT NOT NULL DEFAULT '',
  grantedAtMs INTEGER NOT NULL DEFAULT 0,
  profileID TEXT NOT NULL DEFAULT '',
  userID TEXT NOT NULL DEFAULT '',
  deleted INTEGER NOT NULL DEFAULT 0,
  clientSchema TEXT
);
CREATE TABLE IF NOT EXISTS clients (
  groupID TEXT NOT NULL,
  clientID TEXT NOT NULL,
  deleted INTEGER NOT NULL,
  PRIMARY KEY (groupID, clientID)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queries (
  groupID TEXT NOT NULL,
  hash TEXT NOT NULL,
  ast TEXT,
  name TEXT NOT NULL,
  args TEXT,
  transformationHash TEXT NOT NULL,
  transformationVersion TEXT NOT NULL,
  internal INTEGER NOT NULL,
  got INTEGER NOT NULL,
  patchVersion TEXT NOT NULL,
  PRIMARY KEY (groupID, hash)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS desires (
  groupID TEXT NOT NULL,
  clientID TEXT NOT NULL,
  hash TEXT NOT NULL,
  ttlMs INTEGER NOT NULL,
  inactivatedAtMs REAL,
  cleared INTEGER NOT NULL,
  patchVersion TEXT NOT NULL,
  PRIMARY KEY (groupID, clientID, hash)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rows (
  groupID TEXT NOT NULL,
  tbl TEXT NOT NULL,
  key TEXT NOT NULL,
  rowVersion TEXT NOT NULL,
  patchVersion TEXT NOT NULL,
  refs TEXT,
  PRIMARY KEY (groupID, tbl, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rows_patch ON rows (groupID, patchVersion);
CREATE INDEX IF NOT EXISTS queries_patch ON queries (groupID, patchVersion);
CREATE INDEX IF NOT EXISTS desires_patch ON desires (groupID, patchVersion);
`

// Init creates the tables that are missing.
func Init(ctx context.Context, ex Execer) error {
	if _, err := ex.ExecContext(ctx, schemaDDL); err != nil {
		return fmt.Errorf("init cvr schema: %w", err)
	}
	return nil
}

// Drop forgets everything about a group.
func Drop(ctx context.Context, ex Execer, groupID string) error {
	for _, t := range []string{"instances", "clients", "queries", "desires", "rows"} {
		if _, err := ex.ExecContext(ctx, "DELETE FROM "+t+" WHERE groupID = ?", groupID); err != nil {
			return fmt.Errorf("drop group from %s: %w", t, err)
		}
	}
	return nil
}
