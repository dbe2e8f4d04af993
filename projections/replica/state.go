package replica

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
)

// Querier is what LoadState reads with: a *sql.DB, *sql.Tx or *sql.Conn.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Execer is what SaveProgress writes with.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// State is where a replica stands.
type State struct {
	// ReplicaVersion names the initial sync the replica was built from; ""
	// means there is no replica yet.
	ReplicaVersion string
	Publications   []string
	// Watermark is the commit watermark of the last transaction applied.
	Watermark   string
	WriteTimeMs int64
	// StreamSeq is the change stream sequence of the last message applied.
	StreamSeq uint64
	// ResetSeq is the stream sequence of the reset the replica was built
	// from.
	ResetSeq uint64
}

// LoadState reads the replica's state; a replica with no initial sync yet
// gives the zero State.
func LoadState(ctx context.Context, q Querier) (State, error) {
	var st State
	var pubs string
	err := q.QueryRowContext(ctx, `SELECT replicaVersion, publications FROM "_zero.replicationConfig"`).Scan(&st.ReplicaVersion, &pubs)
	if errors.Is(err, sql.ErrNoRows) {
		return State{}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("load replication config: %w", err)
	}
	if err := json.Unmarshal([]byte(pubs), &st.Publications); err != nil {
		return State{}, fmt.Errorf("load replication config: publications: %w", err)
	}
	var wt sql.NullInt64
	err = q.QueryRowContext(ctx, `SELECT stateVersion, writeTimeMs FROM "_zero.replicationState"`).Scan(&st.Watermark, &wt)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return State{}, fmt.Errorf("load replication state: %w", err)
	}
	st.WriteTimeMs = wt.Int64
	var seq, reset int64
	err = q.QueryRowContext(ctx, `SELECT streamSeq, resetSeq FROM "_jetsync.state"`).Scan(&seq, &reset)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return State{}, fmt.Errorf("load stream state: %w", err)
	}
	st.StreamSeq, st.ResetSeq = uint64(seq), uint64(reset)
	return st, nil
}

// SaveProgress records st's Watermark, WriteTimeMs, StreamSeq and ResetSeq,
// in the transaction that applied them. (ReplicaVersion and Publications are
// set by the reset that opens an initial sync.)
func SaveProgress(ctx context.Context, ex Execer, st State) error {
	if _, err := ex.ExecContext(ctx,
		`INSERT OR REPLACE INTO "_zero.replicationState" (stateVersion, writeTimeMs, lock) VALUES (?, ?, 1)`,
		st.Watermark, st.WriteTimeMs); err != nil {
		return fmt.Errorf("save replication state: %w", err)
	}
	if _, err := ex.ExecContext(ctx,
		`INSERT OR REPLACE INTO "_jetsync.state" (streamSeq, resetSeq, lock) VALUES (?, ?, 1)`,
		int64(st.StreamSeq), int64(st.ResetSeq)); err != nil {
		return fmt.Errorf("save stream state: %w", err)
	}
	return nil
}

// Wipe drops every user table and all replica state, leaving an empty
// replica that waits for a new initial sync.
func Wipe(ctx context.Context, tx *sql.Tx) error {
	if err := dropUserTables(ctx, tx); err != nil {
		return err
	}
	for _, t := range []string{ReplicationConfigTable, ReplicationStateTable, StateTable} {
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+quoteIdent(t)); err != nil {
			return fmt.Errorf("wipe %s: %w", t, err)
		}
	}
	return nil
}

// TableLister is what UserTables reads with: a *sql.DB, *sql.Tx or
// *sql.Conn.
type TableLister interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// UserTables lists the replica's replicated tables, leaving out SQLite's,
// zero's, jetsync's and litestream's own.
func UserTables(ctx context.Context, q TableLister) ([]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table'`)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("list tables: %w", err)
		}
		if !bookkeeping(n) {
			names = append(names, n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	return names, nil
}

// CountRows counts the rows of the replica's replicated tables.
func CountRows(ctx context.Context, db *sql.DB) (int64, error) {
	tables, err := UserTables(ctx, db)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, t := range tables {
		var n int64
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+quoteIdent(t)).Scan(&n); err != nil {
			return 0, fmt.Errorf("count rows of %s: %w", t, err)
		}
		total += n
	}
	return total, nil
}

func dropUserTables(ctx context.Context, tx *sql.Tx) error {
	names, err := UserTables(ctx, tx)
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := tx.ExecContext(ctx, "DROP TABLE "+quoteIdent(n)); err != nil {
			return fmt.Errorf("drop %s: %w", n, err)
		}
	}
	for _, t := range []string{ColumnMetadataTable, TableMetadataTable, TablesTable} {
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+quoteIdent(t)); err != nil {
			return fmt.Errorf("clear %s: %w", t, err)
		}
	}
	return nil
}
