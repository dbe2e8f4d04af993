package replicator

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/jetsync/jetsync/projections/replica"
)

// sqliteHeader opens every SQLite database file.
var sqliteHeader = []byte("SQLite format 3\x00")

// testOpenHook, when set by a test, sees the writer's database as Run
// opens it.
var testOpenHook func(*sql.DB)

// open opens the replica file for Run and loads its state. A missing file
// starts an empty replica. A corrupt one is moved aside, kept for
// inspection, and replaced by an empty replica, which Run rebuilds as it
// builds any new one: from the reset the state bucket records when the
// stream still holds it, else from a new initial sync it asks the producer
// for. A full disk is waited out. db is nil when ctx ends first.
func (c *Consumer) open(ctx context.Context) (*sql.DB, replica.State, error) {
	var db *sql.DB
	var st replica.State
	err := c.whileFull(ctx, func() error {
		var err error
		db, st, err = c.openChecked(ctx)
		return err
	})
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, st, nil // while waiting for space
		}
		return nil, st, err
	}
	if testOpenHook != nil {
		testOpenHook(db)
	}
	return db, st, nil
}

func (c *Consumer) openChecked(ctx context.Context) (*sql.DB, replica.State, error) {
	file := c.cfg.File
	started := time.Now()
	db, st, why, err := checkReplica(ctx, file)
	if err != nil {
		return nil, st, err
	}
	if why == "" {
		c.log.Debug("replica file checked", "file", file, "took", time.Since(started).Round(time.Millisecond))
		return db, st, nil
	}
	moved, err := moveAside(file, time.Now())
	if err != nil {
		return nil, st, fmt.Errorf("replica %s is corrupt (%s), and moving it aside failed: %w", file, why, err)
	}
	c.log.Error("replica file is corrupt: moved it aside; starting an empty replica, rebuilt from the change stream",
		"file", file, "reason", why, "moved_to", moved)
	db, err = OpenDB(file)
	if err != nil {
		return nil, st, err
	}
	return db, replica.State{}, nil
}

// checkReplica opens file and checks it: the SQLite header, PRAGMA
// quick_check, and jetsync's state, which must say where in the stream a
// replica with an initial sync stands. why, when set, says what is wrong;
// db is then nil. err is for failures that say nothing about the file
// (permissions, a full disk).
func checkReplica(ctx context.Context, file string) (db *sql.DB, st replica.State, why string, err error) {
	fi, err := os.Stat(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		db, err := OpenDB(file)
		return db, st, "", err
	case err != nil:
		return nil, st, "", fmt.Errorf("replica %s: %w", file, err)
	}
	// An empty file is an empty database to SQLite: nothing to keep.
	if fi.Size() > 0 {
		if why, err := checkHeader(file); why != "" || err != nil {
			return nil, st, why, err
		}
	}
	db, err = OpenDB(file)
	if err != nil {
		if isCorrupt(err) {
			return nil, st, err.Error(), nil
		}
		return nil, st, "", err
	}
	why, err = check(ctx, db)
	if err == nil && why == "" {
		st, err = replica.LoadState(ctx, db)
		switch {
		case err != nil && isCorrupt(err):
			why, err = err.Error(), nil
		case err == nil:
			why = consistent(st)
		}
	}
	if why != "" || err != nil {
		db.Close()
		return nil, replica.State{}, why, err
	}
	return db, st, "", nil
}

func checkHeader(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("replica %s: %w", file, err)
	}
	defer f.Close()
	// The header is 100 bytes; a file shorter than that was cut short.
	var h [100]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return "truncated: shorter than the 100-byte SQLite header", nil
		}
		return "", fmt.Errorf("replica %s: %w", file, err)
	}
	if !bytes.Equal(h[:len(sqliteHeader)], sqliteHeader) {
		return fmt.Sprintf("not a SQLite database: header starts %q", h[:len(sqliteHeader)]), nil
	}
	return "", nil
}

// check runs PRAGMA quick_check, which reads every page: O(size), about a
// second per GB, where integrity_check would also cross-check every index.
func check(ctx context.Context, db *sql.DB) (string, error) {
	rows, err := db.QueryContext(ctx, "PRAGMA quick_check(5)")
	if err != nil {
		if isCorrupt(err) {
			return err.Error(), nil
		}
		return "", fmt.Errorf("quick_check: %w", err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return "", fmt.Errorf("quick_check: %w", err)
		}
		if s != "ok" {
			problems = append(problems, s)
		}
	}
	if err := rows.Err(); err != nil {
		if isCorrupt(err) {
			return err.Error(), nil
		}
		return "", fmt.Errorf("quick_check: %w", err)
	}
	if len(problems) > 0 {
		return "quick_check: " + strings.Join(problems, "; "), nil
	}
	return "", nil
}

// consistent says what is wrong with st, if anything. A replica with an
// initial sync always commits its stream position with it.
func consistent(st replica.State) string {
	switch {
	case st.ReplicaVersion == "":
		return ""
	case st.ResetSeq == 0:
		return fmt.Sprintf("replica version %s but no stream position in %q", st.ReplicaVersion, replica.StateTable)
	case st.StreamSeq < st.ResetSeq:
		return fmt.Sprintf("stream position %d before the reset it was built from (%d)", st.StreamSeq, st.ResetSeq)
	case st.Watermark < st.ReplicaVersion:
		return fmt.Sprintf("watermark %q before the replica version %s", st.Watermark, st.ReplicaVersion)
	}
	return ""
}

// isCorrupt reports whether err says the file is not a sound database.
func isCorrupt(err error) bool {
	switch sqliteCode(err) {
	case sqliteCorrupt, sqliteNotADB:
		return true
	case 0:
		s := err.Error()
		return strings.Contains(s, "database disk image is malformed") || strings.Contains(s, "file is not a database")
	}
	return false
}

// moveAside renames file, and its WAL, to <file>.corrupt-<time> (and
// -wal), so that they can still be opened together; the -shm index is
// rebuilt from the WAL and goes.
func moveAside(file string, now time.Time) (string, error) {
	to := file + ".corrupt-" + now.UTC().Format("20060102T150405.000Z")
	if err := os.Rename(file, to); err != nil {
		return "", err
	}
	if err := os.Rename(file+"-wal", to+"-wal"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return to, err
	}
	if err := os.Remove(file + "-shm"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return to, err
	}
	return to, nil
}
