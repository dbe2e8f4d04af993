package pgrepl

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/progress"
	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

// publishedTable is a table to copy in an initial sync.
type publishedTable struct {
	oid     uint32
	spec    streams.TableSpec
	types   []pgvalue.Type // per spec.Columns
	indexes []streams.IndexSpec
	// filter is the publications' row filter, "" for none.
	filter string
	// progress reports the table's copy, when one is under way.
	progress *progress.Table
}

// readSchema reads the tables the publications publish, with their columns,
// keys and indexes, as of the snapshot of conn's open transaction.
func readSchema(ctx context.Context, conn *pgx.Conn, reg *pgvalue.Registry, pubs []string) ([]*publishedTable, error) {
	rows, err := conn.Query(ctx, `
		SELECT c.oid, pt.schemaname::text, pt.tablename::text, pt.attnames::text[], pt.rowfilter
		FROM pg_publication_tables pt
		JOIN pg_namespace n ON n.nspname = pt.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pt.pubname = ANY($1)
		ORDER BY pt.schemaname, pt.tablename, pt.pubname`, pubs)
	if err != nil {
		return nil, fmt.Errorf("read published tables: %w", err)
	}
	type pubTable struct {
		t       *publishedTable
		cols    map[string]bool
		filters []string
		all     bool // some publication has no row filter
	}
	var order []uint32
	byOID := map[uint32]*pubTable{}
	for rows.Next() {
		var oid uint32
		var schema, name string
		var cols []string
		var filter *string
		if err := rows.Scan(&oid, &schema, &name, &cols, &filter); err != nil {
			return nil, fmt.Errorf("read published tables: %w", err)
		}
		pt, ok := byOID[oid]
		if !ok {
			pt = &pubTable{t: &publishedTable{oid: oid, spec: streams.TableSpec{OID: oid, Schema: schema, Name: name}}, cols: map[string]bool{}}
			byOID[oid] = pt
			order = append(order, oid)
		}
		for _, c := range cols {
			pt.cols[c] = true
		}
		if filter == nil {
			pt.all = true
		} else {
			pt.filters = append(pt.filters, "("+*filter+")")
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read published tables: %w", err)
	}
	if len(order) == 0 {
		return nil, nil
	}

	type column struct {
		rel     uint32
		attnum  int16
		name    string
		typ     uint32
		typName string
		typmod  int32
		notNull bool
	}
	rows, err = conn.Query(ctx, `
		SELECT a.attrelid, a.attnum, a.attname::text, a.atttypid, format_type(a.atttypid, NULL), a.atttypmod, a.attnotnull
		FROM pg_attribute a
		WHERE a.attrelid = ANY($1) AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attrelid, a.attnum`, order)
	if err != nil {
		return nil, fmt.Errorf("read columns: %w", err)
	}
	var cols []column
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.rel, &c.attnum, &c.name, &c.typ, &c.typName, &c.typmod, &c.notNull); err != nil {
			return nil, fmt.Errorf("read columns: %w", err)
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read columns: %w", err)
	}
	var unknown []uint32
	for _, c := range cols {
		if _, ok := reg.Lookup(c.typ); !ok {
			unknown = append(unknown, c.typ)
		}
	}
	if len(unknown) > 0 {
		if err := reg.Load(ctx, conn, unknown...); err != nil {
			return nil, fmt.Errorf("load column types: %w", err)
		}
	}
	for _, c := range cols {
		pt := byOID[c.rel]
		if !pt.cols[c.name] {
			continue
		}
		typ := lookupType(reg, c.typ, c.typName)
		spec := streams.ColumnSpec{
			Name: c.name, Pos: int(c.attnum), DataType: typ.Name, Kind: typ.Kind,
			NotNull: c.notNull, Enum: typ.Enum, Array: typ.Array,
		}
		if (typ.Name == "varchar" || typ.Name == "bpchar") && c.typmod > 4 {
			spec.CharacterMaximumLength = int(c.typmod - 4)
		}
		pt.t.spec.Columns = append(pt.t.spec.Columns, spec)
		pt.t.types = append(pt.t.types, typ)
	}

	rows, err = conn.Query(ctx, `
		SELECT i.indrelid, ic.relname::text, i.indisunique, i.indisprimary,
			i.indisreplident AND c.relreplident = 'i', i.indkey::int2[], i.indoption::int2[],
			i.indpred IS NOT NULL OR i.indexprs IS NOT NULL
		FROM pg_index i
		JOIN pg_class ic ON ic.oid = i.indexrelid
		JOIN pg_class c ON c.oid = i.indrelid
		WHERE i.indrelid = ANY($1) AND i.indisvalid
		ORDER BY i.indrelid, ic.relname`, order)
	if err != nil {
		return nil, fmt.Errorf("read indexes: %w", err)
	}
	type index struct {
		rel                   uint32
		name                  string
		unique, primary, repl bool
		keys, options         []int16
		partial               bool
	}
	var idxs []index
	for rows.Next() {
		var x index
		if err := rows.Scan(&x.rel, &x.name, &x.unique, &x.primary, &x.repl, &x.keys, &x.options, &x.partial); err != nil {
			return nil, fmt.Errorf("read indexes: %w", err)
		}
		idxs = append(idxs, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read indexes: %w", err)
	}
	replKey := map[uint32][]string{}
	for _, x := range idxs {
		t := byOID[x.rel].t
		names := make([]string, 0, len(x.keys))
		desc := make([]bool, 0, len(x.keys))
		anyDesc := false
		for i, k := range x.keys {
			j := slices.IndexFunc(t.spec.Columns, func(c streams.ColumnSpec) bool { return c.Pos == int(k) })
			if j < 0 {
				names = nil // an expression, or a column not published
				break
			}
			names = append(names, t.spec.Columns[j].Name)
			d := i < len(x.options) && x.options[i]&1 != 0
			desc = append(desc, d)
			anyDesc = anyDesc || d
		}
		if names == nil || x.partial {
			continue
		}
		switch {
		case x.primary:
			t.spec.PrimaryKey = names
		case x.repl:
			replKey[x.rel] = names
		}
		spec := streams.IndexSpec{Schema: t.spec.Schema, TableName: t.spec.Name, Name: x.name, Unique: x.unique, Columns: names}
		if anyDesc {
			spec.Desc = desc
		}
		t.indexes = append(t.indexes, spec)
	}

	out := make([]*publishedTable, 0, len(order))
	for _, oid := range order {
		pt := byOID[oid]
		if pt.t.spec.PrimaryKey == nil {
			pt.t.spec.PrimaryKey = replKey[oid]
		}
		if !pt.all && len(pt.filters) > 0 {
			pt.t.filter = strings.Join(pt.filters, " OR ")
		}
		if len(pt.t.spec.Columns) > 0 {
			out = append(out, pt.t)
		}
	}
	return out, nil
}

// copyQuery is the COPY of t's published columns and rows.
func (t *publishedTable) copyQuery() string {
	cols := make([]string, len(t.spec.Columns))
	for i, c := range t.spec.Columns {
		cols[i] = ident(c.Name)
	}
	q := fmt.Sprintf("COPY (SELECT %s FROM %s.%s", strings.Join(cols, ", "), ident(t.spec.Schema), ident(t.spec.Name))
	if t.filter != "" {
		q += " WHERE " + t.filter
	}
	return q + ") TO STDOUT"
}
