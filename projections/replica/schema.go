// Package replica is the SQLite replica projection: it applies the change
// stream's parts to a SQLite database laid out as zero-cache's replica
// (docs/replica.md), so that view-syncers can read it as
// they would read zero-cache's. It is pure: SQLite only, no NATS, goroutines
// or clock.
//
// User tables are named "table" for schema public, else "schema.table";
// columns carry zero's lite type strings ("int8|NOT_NULL", "mood[]|TEXT_ENUM|TEXT_ARRAY")
// as declared types, plus "_0_version" holding the watermark of the last
// write; a unique index on the primary key stands in for a PRIMARY KEY
// constraint. zero's "_zero.changeLog2" is not kept: a consumer learns which
// rows changed from a Collector instead.
package replica

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jetsync/jetsync/streams"
)

// Bookkeeping tables. Their names contain a dot, as zero-cache's do: SQLite
// sees one quoted identifier in the main schema.
const (
	ReplicationConfigTable = "_zero.replicationConfig"
	ReplicationStateTable  = "_zero.replicationState"
	ColumnMetadataTable    = "_zero.column_metadata"
	TableMetadataTable     = "_zero.tableMetadata"
	// StateTable holds jetsync's progress through the change stream.
	StateTable = "_jetsync.state"
	// TablesTable holds each user table's streams.TableSpec, which the
	// Applier needs after a restart, and the name of its primary-key index.
	TablesTable = "_jetsync.tables"
)

// VersionColumn is the row-version column every user table gets.
const VersionColumn = "_0_version"

const schemaDDL = `
CREATE TABLE IF NOT EXISTS "_zero.replicationConfig" (
  replicaVersion TEXT NOT NULL,
  publications TEXT NOT NULL,
  initialSyncContext TEXT,
  lock INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock = 1)
);
CREATE TABLE IF NOT EXISTS "_zero.replicationState" (
  stateVersion TEXT NOT NULL,
  writeTimeMs INTEGER,
  lock INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock = 1)
);
CREATE TABLE IF NOT EXISTS "_zero.column_metadata" (
  table_name TEXT NOT NULL,
  column_name TEXT NOT NULL,
  upstream_type TEXT NOT NULL,
  is_not_null INTEGER NOT NULL,
  is_enum INTEGER NOT NULL,
  is_array INTEGER NOT NULL,
  character_max_length INTEGER,
  backfill TEXT,
  PRIMARY KEY (table_name, column_name)
);
CREATE TABLE IF NOT EXISTS "_zero.tableMetadata" (
  "schema" TEXT NOT NULL,
  "table" TEXT NOT NULL,
  minRowVersion TEXT NOT NULL DEFAULT '00',
  upstreamMetadata TEXT,
  metadata TEXT,
  PRIMARY KEY ("schema", "table")
);
CREATE TABLE IF NOT EXISTS "_jetsync.state" (
  streamSeq INTEGER NOT NULL,
  resetSeq INTEGER NOT NULL,
  lock INTEGER PRIMARY KEY DEFAULT 1 CHECK (lock = 1)
);
CREATE TABLE IF NOT EXISTS "_jetsync.tables" (
  name TEXT PRIMARY KEY,
  spec TEXT NOT NULL,
  pkIndex TEXT
);
`

// Init creates the bookkeeping tables that are missing.
func Init(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, schemaDDL); err != nil {
		return fmt.Errorf("init replica schema: %w", err)
	}
	return nil
}

// TableName is the replica's name for an upstream table, as zero-cache
// names it.
func TableName(schema, table string) string {
	if schema == "" || schema == "public" {
		return table
	}
	return schema + "." + table
}

// LiteType is the declared type of a replica column: the upstream type
// name plus zero's attributes, in zero's order.
func LiteType(c streams.ColumnSpec) string {
	t := c.DataType
	if c.NotNull {
		t += "|NOT_NULL"
	}
	if c.Enum {
		t += "|TEXT_ENUM"
	}
	if c.Array {
		t += "|TEXT_ARRAY"
	}
	return t
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// bookkeeping reports whether a table in sqlite_master belongs to SQLite,
// zero's or jetsync's bookkeeping, or litestream, rather than to the user.
func bookkeeping(name string) bool {
	for _, p := range []string{"_zero.", "_jetsync.", "sqlite_", "_litestream"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
