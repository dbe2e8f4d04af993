package replica

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/jetsync/jetsync/streams"
)

// Schema changes (docs/replica.md §7). Each one that changes what rows
// hold raises the table's minRowVersion to the change's watermark, so that
// clients are sent every row again, and tells the Collector that the whole
// table changed.

func (a *Applier) dropTable(ctx context.Context, tx *sql.Tx, schema, name string) error {
	tn := TableName(schema, name)
	delete(a.tables, tn)
	if _, err := tx.ExecContext(ctx, "DROP TABLE IF EXISTS "+quoteIdent(tn)); err != nil {
		return fmt.Errorf("drop table %s: %w", tn, err)
	}
	if err := forgetTable(ctx, tx, tn, schema, name); err != nil {
		return err
	}
	if a.Collector != nil {
		a.Collector.TableChanged(tn)
	}
	return nil
}

// forgetTable deletes the metadata of table tn.
func forgetTable(ctx context.Context, tx *sql.Tx, tn, schema, name string) error {
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`DELETE FROM "_zero.column_metadata" WHERE table_name = ?`, []any{tn}},
		{`DELETE FROM "_zero.tableMetadata" WHERE "schema" = ? AND "table" = ?`, []any{schemaName(schema), name}},
		{`DELETE FROM "_jetsync.tables" WHERE name = ?`, []any{tn}},
	} {
		if _, err := tx.ExecContext(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("forget table %s: %w", tn, err)
		}
	}
	return nil
}

func (a *Applier) renameTable(ctx context.Context, tx *sql.Tx, t *table, spec *streams.TableSpec, version string) error {
	nt, err := newTable(*spec, t.pkIndex)
	if err != nil {
		return err
	}
	if nt.name == t.name {
		return a.replaceTable(ctx, tx, t, nt, version)
	}
	if _, err := tx.ExecContext(ctx, "ALTER TABLE "+quoteIdent(t.name)+" RENAME TO "+quoteIdent(nt.name)); err != nil {
		return fmt.Errorf("rename table %s to %s: %w", t.name, nt.name, err)
	}
	if err := forgetTable(ctx, tx, t.name, t.spec.Schema, t.spec.Name); err != nil {
		return err
	}
	return a.replaceTable(ctx, tx, t, nt, version)
}

func (a *Applier) addColumn(ctx context.Context, tx *sql.Tx, t *table, c *streams.Change, version string) error {
	name := c.Columns[0]
	if _, ok := t.byName[name]; ok {
		return fmt.Errorf("add column: %s.%s exists", t.name, name)
	}
	nt, err := newTable(*c.Spec, t.pkIndex)
	if err != nil {
		return err
	}
	i := nt.byName[name]
	def := columnDef(nt.spec.Columns[i])
	if raw, ok := c.New[name]; ok {
		v, err := nt.cols[i].value(raw)
		if err != nil {
			return fmt.Errorf("add column %s.%s: default: %w", t.name, name, err)
		}
		if v != nil {
			// A default costs SQLite nothing per row, where an UPDATE
			// would rewrite the table.
			def += " DEFAULT " + sqlLiteral(v)
		}
	}
	if _, err := tx.ExecContext(ctx, "ALTER TABLE "+quoteIdent(t.name)+" ADD COLUMN "+def); err != nil {
		return fmt.Errorf("add column %s.%s: %w", t.name, name, err)
	}
	return a.replaceTable(ctx, tx, t, nt, version)
}

// sqlLiteral writes a value as column.value returns it.
func sqlLiteral(v any) string {
	switch v := v.(type) {
	case int64:
		return strconv.FormatInt(v, 10)
	case float64:
		switch {
		case math.IsInf(v, 1):
			return "9e999"
		case math.IsInf(v, -1):
			return "-9e999"
		}
		s := strconv.FormatFloat(v, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eE") {
			s += ".0"
		}
		return s
	case string:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	}
	return "NULL"
}

func (a *Applier) updateColumn(ctx context.Context, tx *sql.Tx, t *table, c *streams.Change, version string) error {
	oldName, newName := c.Columns[0], c.Columns[1]
	oi, ok := t.byName[oldName]
	if !ok {
		return fmt.Errorf("update column: %s.%s does not exist", t.name, oldName)
	}
	nt, err := newTable(*c.Spec, t.pkIndex)
	if err != nil {
		return err
	}
	oc, nc := t.spec.Columns[oi], nt.spec.Columns[nt.byName[newName]]
	changed := false
	if declaredType(oc) != declaredType(nc) {
		// SQLite cannot change a column's type in place.
		nc.Name = oldName
		if err := a.rebuild(ctx, tx, t, nc); err != nil {
			return err
		}
		changed = true
	}
	if oldName != newName {
		if _, err := tx.ExecContext(ctx, "ALTER TABLE "+quoteIdent(t.name)+" RENAME COLUMN "+quoteIdent(oldName)+" TO "+quoteIdent(newName)); err != nil {
			return fmt.Errorf("rename column %s.%s: %w", t.name, oldName, err)
		}
		changed = true
	}
	if !changed {
		// Metadata only: rows read the same.
		version = ""
	}
	return a.replaceTable(ctx, tx, t, nt, version)
}

// declaredType is a column's declared type in the replica.
func declaredType(c streams.ColumnSpec) string {
	c.Name = ""
	return columnDef(c)
}

// rebuild copies table t into a new table whose column col.Name is
// declared as col says, then puts the new table and t's indexes in its
// place. Values are copied as they are.
func (a *Applier) rebuild(ctx context.Context, tx *sql.Tx, t *table, col streams.ColumnSpec) error {
	rows, err := tx.QueryContext(ctx, `SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL`, t.name)
	if err != nil {
		return fmt.Errorf("rebuild %s: list indexes: %w", t.name, err)
	}
	var indexes []string
	for rows.Next() {
		var q string
		if err := rows.Scan(&q); err != nil {
			rows.Close()
			return fmt.Errorf("rebuild %s: list indexes: %w", t.name, err)
		}
		indexes = append(indexes, q)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("rebuild %s: list indexes: %w", t.name, err)
	}
	tmp := "_jetsync.rebuild." + t.name
	defs := make([]string, 0, len(t.spec.Columns)+1)
	names := make([]string, 0, len(t.spec.Columns)+1)
	for _, c := range t.spec.Columns {
		if c.Name == col.Name {
			c = col
		}
		defs = append(defs, columnDef(c))
		names = append(names, quoteIdent(c.Name))
	}
	defs = append(defs, quoteIdent(VersionColumn)+" TEXT")
	names = append(names, quoteIdent(VersionColumn))
	cols := strings.Join(names, ", ")
	stmts := []string{
		"CREATE TABLE " + quoteIdent(tmp) + " (" + strings.Join(defs, ", ") + ")",
		"INSERT INTO " + quoteIdent(tmp) + " (" + cols + ") SELECT " + cols + " FROM " + quoteIdent(t.name),
		"DROP TABLE " + quoteIdent(t.name),
		"ALTER TABLE " + quoteIdent(tmp) + " RENAME TO " + quoteIdent(t.name),
	}
	for _, q := range append(stmts, indexes...) {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("rebuild %s: %w", t.name, err)
		}
	}
	return nil
}

func (a *Applier) dropColumn(ctx context.Context, tx *sql.Tx, t *table, c *streams.Change, version string) error {
	name := c.Columns[0]
	if _, ok := t.byName[name]; !ok {
		return fmt.Errorf("drop column: %s.%s does not exist", t.name, name)
	}
	nt, err := newTable(*c.Spec, t.pkIndex)
	if err != nil {
		return err
	}
	// SQLite refuses to drop an indexed column; Postgres has dropped those
	// indexes with it.
	dropped, err := dropIndexesOn(ctx, tx, t.name, name)
	if err != nil {
		return err
	}
	if slices.Contains(dropped, nt.pkIndex) {
		nt.pkIndex = ""
	}
	if _, err := tx.ExecContext(ctx, "ALTER TABLE "+quoteIdent(t.name)+" DROP COLUMN "+quoteIdent(name)); err != nil {
		return fmt.Errorf("drop column %s.%s: %w", t.name, name, err)
	}
	return a.replaceTable(ctx, tx, t, nt, version)
}

func (a *Applier) dropIndex(ctx context.Context, tx *sql.Tx, t *table, idx *streams.IndexSpec) error {
	name := TableName(idx.Schema, idx.Name)
	if _, err := tx.ExecContext(ctx, "DROP INDEX IF EXISTS "+quoteIdent(name)); err != nil {
		return fmt.Errorf("drop index %s: %w", name, err)
	}
	if name != t.pkIndex {
		return nil
	}
	// The table's key is changing too (a create-table with its new spec
	// follows), or is kept by another index: ensurePK sees to it.
	t.pkIndex = ""
	if _, err := tx.ExecContext(ctx, `UPDATE "_jetsync.tables" SET pkIndex = NULL WHERE name = ?`, t.name); err != nil {
		return fmt.Errorf("drop index %s: %w", name, err)
	}
	return nil
}

// replaceTable records nt, the new shape of table old, and tells the
// Collector. A non-empty version is the change's: every row's version is
// raised to it.
func (a *Applier) replaceTable(ctx context.Context, tx *sql.Tx, old, nt *table, version string) error {
	if err := a.saveTable(ctx, tx, nt); err != nil {
		return err
	}
	if version != "" {
		if err := bumpVersions(ctx, tx, &nt.spec, version); err != nil {
			return err
		}
	}
	delete(a.tables, old.name)
	a.tables[nt.name] = nt
	if a.Collector != nil {
		a.Collector.TableChanged(old.name)
		if nt.name != old.name {
			a.Collector.TableChanged(nt.name)
		}
	}
	return nil
}
