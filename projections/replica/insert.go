package replica

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"

	"github.com/jetsync/jetsync/streams"
)

// batchSizes are the row counts of the multi-row inserts an insert run is
// cut into, largest first, so that few statements are prepared per table.
var batchSizes = []int{DefaultBackfillRows, 64, 16, 4, 1}

// pendingInsert is a row of an insert run, as its statement binds it (every
// column, then the version), with the row change to report once written.
type pendingInsert struct {
	args []any
	key  map[string]any
	new  map[string]any // nil when not collecting
}

// insertRun applies the inserts at the head of changes, all of one table,
// in multi-row statements, and returns how many it applied. On error it
// returns the index of the change that failed.
func (a *Applier) insertRun(ctx context.Context, tx *sql.Tx, schema, name, version string, changes []streams.Change) (int, error) {
	t, err := a.table(ctx, tx, TableName(schema, name))
	if err != nil {
		return 0, err
	}
	if err := a.ensurePK(ctx, tx, t); err != nil {
		return 0, err
	}
	collect := a.collecting(t)
	per := min(DefaultBackfillRows, maxVariables/(len(t.cols)+1))
	batch := a.batch[:0]
	first := 0 // index of batch[0]
	i := 0
	for ; i < len(changes) && changes[i].Op == streams.OpInsert; i++ {
		vals, present, err := t.rowValues(changes[i].New)
		if err != nil {
			return i, err
		}
		args := append(vals, version)
		if !collect {
			batch = append(batch, pendingInsert{args: args})
		} else if image := t.storedImage(vals, present); image != nil {
			// The row as the replica will hold it is known without
			// reading it back, so rows can go in many at a time.
			image[VersionColumn] = version
			_, kv, err := t.keyOf(vals, present)
			if err != nil {
				return i, err
			}
			batch = append(batch, pendingInsert{args: args, key: t.keyMap(t.pk, kv), new: image})
		} else {
			if err := a.flushInserts(ctx, t, batch, per, collect); err != nil {
				return first, err
			}
			batch = batch[:0]
			if _, err := a.upsert(ctx, t, vals, present, version); err != nil {
				return i, err
			}
			first = i + 1
			continue
		}
		if len(batch) == per {
			if err := a.flushInserts(ctx, t, batch, per, collect); err != nil {
				return first, err
			}
			batch = batch[:0]
			first = i + 1
		}
	}
	if err := a.flushInserts(ctx, t, batch, per, collect); err != nil {
		return first, err
	}
	clear(batch)
	a.batch = batch[:0]
	return i, nil
}

// flushInserts writes rows in order. Without a collector each later row
// replaces any earlier one with its key, as one at a time would. With one,
// rows go in only where their key is free; a statement that meets a taken
// key is undone and its rows applied one at a time, reading what they
// replace.
func (a *Applier) flushInserts(ctx context.Context, t *table, rows []pendingInsert, per int, collect bool) error {
	for len(rows) > 0 {
		n := 1
		for _, s := range batchSizes {
			if s <= per && s <= len(rows) {
				n = s
				break
			}
		}
		if err := a.insertBatch(ctx, t, rows[:n], collect); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

func (a *Applier) insertBatch(ctx context.Context, t *table, rows []pendingInsert, collect bool) error {
	n := len(rows)
	st, err := a.insertStmt(ctx, t, n, collect)
	if err != nil {
		return err
	}
	args := a.args[:0]
	for _, r := range rows {
		args = append(args, r.args...)
	}
	defer func() {
		clear(args)
		a.args = args[:0]
	}()
	if !collect {
		if _, err := st.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("insert into %s: %w", t.name, err)
		}
		return nil
	}
	if n > 1 {
		if _, err := a.Exec(ctx, a.tx, "SAVEPOINT replica_insert_batch"); err != nil {
			return fmt.Errorf("insert into %s: %w", t.name, err)
		}
	}
	res, err := st.ExecContext(ctx, args...)
	var written int64
	if err == nil {
		written, err = res.RowsAffected()
	}
	if err != nil {
		if n > 1 {
			// The caller rolls the transaction back; this only tidies.
			if _, rerr := a.Exec(ctx, a.tx, "ROLLBACK TO replica_insert_batch"); rerr == nil {
				a.Exec(ctx, a.tx, "RELEASE replica_insert_batch")
			}
		}
		return fmt.Errorf("insert into %s: %w", t.name, err)
	}
	if written == int64(n) {
		if n > 1 {
			if _, err := a.Exec(ctx, a.tx, "RELEASE replica_insert_batch"); err != nil {
				return fmt.Errorf("insert into %s: %w", t.name, err)
			}
		}
		for _, r := range rows {
			a.Collector.RowChanged(RowChange{Table: t.name, Key: r.key, New: r.new})
		}
		return nil
	}
	if n > 1 {
		// A key was taken: undo, and go one row at a time.
		if _, err := a.Exec(ctx, a.tx, "ROLLBACK TO replica_insert_batch"); err != nil {
			return fmt.Errorf("insert into %s: %w", t.name, err)
		}
		if _, err := a.Exec(ctx, a.tx, "RELEASE replica_insert_batch"); err != nil {
			return fmt.Errorf("insert into %s: %w", t.name, err)
		}
		for i := range rows {
			if err := a.insertBatch(ctx, t, rows[i:i+1], true); err != nil {
				return err
			}
		}
		return nil
	}
	// The key was taken: replace the row, reporting the one it replaces.
	kv := make([]any, len(t.pk))
	for j, c := range t.pk {
		kv[j] = rows[0].args[c]
	}
	_, err = a.replaceRow(ctx, t, t.pk, kv, rows[0].args, rows[0].key)
	return err
}

// insertStmt returns the statement that inserts n whole rows: replacing
// rows with the same key, or with ignore leaving them be.
func (a *Applier) insertStmt(ctx context.Context, t *table, n int, ignore bool) (*sql.Stmt, error) {
	op := "I"
	if ignore {
		op = "N"
	}
	return a.stmt(ctx, t, op+strconv.Itoa(n), func() string {
		tuple := "(" + strings.Repeat("?, ", len(t.cols)) + "?)"
		verb := "INSERT OR REPLACE INTO "
		if ignore {
			verb = "INSERT INTO "
		}
		q := verb + quoteIdent(t.name) + " (" + t.allColumns() + ") VALUES " + strings.Repeat(tuple+", ", n-1) + tuple
		if ignore {
			q += " ON CONFLICT DO NOTHING"
		}
		return q
	})
}
