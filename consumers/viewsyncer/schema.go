package viewsyncer

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// tableSchema is what the view-syncer knows of one syncable replica table.
type tableSchema struct {
	columns []zql.Column
	pk      []string
}

// schema is the replica's syncable tables, as of one snapshot. It is
// immutable; a new one is built when the replica's table specs change.
type schema struct {
	zql    zql.Schema
	tables map[string]tableSchema
	// raw is the text it was built from, to tell whether it changed.
	raw string
}

// loadSchema reads the table specs the replica keeps in _jetsync.tables.
// Unsupported columns are left out and tables without a primary key are not
// syncable (docs/replica.md §6).
func loadSchema(ctx context.Context, tx *sql.Tx, prev *schema) (*schema, error) {
	rows, err := tx.QueryContext(ctx, `SELECT name, spec FROM "`+replica.TablesTable+`" ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("load table specs: %w", err)
	}
	defer rows.Close()
	var raw strings.Builder
	type entry struct{ name, spec string }
	var entries []entry
	for rows.Next() {
		var e entry
		if err := rows.Scan(&e.name, &e.spec); err != nil {
			return nil, fmt.Errorf("load table specs: %w", err)
		}
		raw.WriteString(e.name + "\x00" + e.spec + "\x00")
		entries = append(entries, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load table specs: %w", err)
	}
	if prev != nil && prev.raw == raw.String() {
		return prev, nil
	}
	s := &schema{zql: zql.Schema{Tables: map[string]zql.TableSchema{}}, tables: map[string]tableSchema{}, raw: raw.String()}
	for _, e := range entries {
		var spec streams.TableSpec
		if err := json.Unmarshal([]byte(e.spec), &spec); err != nil {
			return nil, fmt.Errorf("table %s: decode spec: %w", e.name, err)
		}
		if ts, ok := syncable(spec); ok {
			s.tables[e.name] = ts
			s.zql.Tables[e.name] = zql.TableSchema{Columns: ts.columns, PrimaryKey: ts.pk}
		}
	}
	return s, nil
}

func syncable(spec streams.TableSpec) (tableSchema, bool) {
	if len(spec.PrimaryKey) == 0 {
		return tableSchema{}, false
	}
	cols := append([]streams.ColumnSpec(nil), spec.Columns...)
	sort.SliceStable(cols, func(i, j int) bool { return cols[i].Pos < cols[j].Pos })
	ts := tableSchema{pk: spec.PrimaryKey}
	kinds := map[string]bool{}
	for _, c := range cols {
		switch c.Kind {
		case streams.KindNumber, streams.KindString, streams.KindBoolean, streams.KindJSON:
			ts.columns = append(ts.columns, zql.Column{Name: c.Name, Kind: zql.Kind(c.Kind)})
			kinds[c.Name] = true
		}
	}
	for _, k := range spec.PrimaryKey {
		if !kinds[k] {
			return tableSchema{}, false
		}
	}
	return ts, true
}

// clientSchema is the schema a client declares in initConnection.
type clientSchema struct {
	Tables map[string]struct {
		Columns map[string]struct {
			Type string `json:"type"`
		} `json:"columns"`
		PrimaryKey []string `json:"primaryKey"`
	} `json:"tables"`
}

// checkClientSchema reports every way the client's schema disagrees with
// the replica, as zero-cache's SchemaVersionNotSupported does
// (docs/protocol.md §4.1).
func checkClientSchema(raw json.RawMessage, s *schema) error {
	var cs clientSchema
	if err := json.Unmarshal(raw, &cs); err != nil {
		return newProtocolError(kindInvalidConnectionRequest, "invalid client schema: %v", err)
	}
	if len(s.tables) == 0 {
		return newProtocolError(kindInternal, "No tables have been synced from upstream. Please check that the ZERO_UPSTREAM_DB has been properly set.")
	}
	var problems []string
	names := make([]string, 0, len(cs.Tables))
	for n := range cs.Tables {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		ct := cs.Tables[name]
		ts, ok := s.tables[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("The %q table does not exist or is not one of the replicated tables.", name))
			continue
		}
		kinds := map[string]zql.Kind{}
		for _, c := range ts.columns {
			kinds[c.Name] = c.Kind
		}
		cols := make([]string, 0, len(ct.Columns))
		for n := range ct.Columns {
			cols = append(cols, n)
		}
		sort.Strings(cols)
		for _, col := range cols {
			k, ok := kinds[col]
			if !ok {
				problems = append(problems, fmt.Sprintf("The %q column of the %q table does not exist or is not one of the replicated columns.", col, name))
				continue
			}
			if t := ct.Columns[col].Type; t != "null" && t != string(k) {
				problems = append(problems, fmt.Sprintf("The %q column of the %q table has type %q on the client but %q on the server.", col, name, t, k))
			}
		}
		if len(ct.PrimaryKey) > 0 && !sameSet(ct.PrimaryKey, ts.pk) {
			problems = append(problems, fmt.Sprintf("The %q table's primaryKey <%s> is not the replicated key <%s>.", name, strings.Join(ct.PrimaryKey, ","), strings.Join(ts.pk, ",")))
		}
	}
	if len(problems) > 0 {
		return newProtocolError(kindSchemaVersionNotSupported, "%s", strings.Join(problems, "\n"))
	}
	return nil
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, x := range a {
		m[x] = true
	}
	for _, x := range b {
		if !m[x] {
			return false
		}
	}
	return true
}
