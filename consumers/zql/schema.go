package zql

import (
	"fmt"
	"slices"
	"strings"
)

// Kind is a column's client-facing value type (docs/query-ast.md §6).
type Kind string

// Kinds.
const (
	KindNumber  Kind = "number"
	KindString  Kind = "string"
	KindBoolean Kind = "boolean"
	KindJSON    Kind = "json"
)

// Column is one synced column of a replica table.
type Column struct {
	Name string
	Kind Kind
}

// TableSchema describes one replica table: the columns to sync, in order,
// and the primary key that orderings are completed with and rows are
// deduplicated by.
type TableSchema struct {
	Columns    []Column
	PrimaryKey []string
}

// Schema maps each table name, as ASTs and the replica spell it ("issue",
// "myschema.tbl"), to its description.
type Schema struct {
	Tables map[string]TableSchema
}

// table is a TableSchema prepared for evaluation.
type table struct {
	name   string
	cols   []Column
	byName map[string]int
	pk     []int
	// selectSQL reads every column plus the row version.
	selectSQL string
	// objectOrder is the order a row's columns go out in: zero-cache's, the
	// replica's column order as a JavaScript object keeps it (see
	// objectOrder). pkNameOrder is the primary key's columns in name order,
	// as row keys list them.
	objectOrder, pkNameOrder []int
}

func (s Schema) table(name string) (*table, error) {
	ts, ok := s.Tables[name]
	if !ok {
		// zero-cache's words, listing the tables of the public schema.
		var names []string
		for n := range s.Tables {
			if !strings.Contains(n, ".") && !strings.HasPrefix(n, "_litestream_") {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		return nil, refuse("table '%s' is not one of: %s. Check the spelling and ensure that the table has a primary key.", name, strings.Join(names, ","))
	}
	t := &table{name: name, cols: ts.Columns, byName: make(map[string]int, len(ts.Columns))}
	var sel strings.Builder
	sel.WriteString("SELECT ")
	for i, c := range ts.Columns {
		switch c.Kind {
		case KindNumber, KindString, KindBoolean, KindJSON:
		default:
			return nil, fmt.Errorf("table %s: column %s has kind %q", name, c.Name, c.Kind)
		}
		if _, dup := t.byName[c.Name]; dup {
			return nil, fmt.Errorf("table %s: column %s listed twice", name, c.Name)
		}
		t.byName[c.Name] = i
		sel.WriteString(quoteIdent(c.Name) + ", ")
	}
	sel.WriteString(quoteIdent(VersionColumn) + " FROM " + quoteIdent(name))
	t.selectSQL = sel.String()
	if len(ts.PrimaryKey) == 0 {
		return nil, fmt.Errorf("table %s has no primary key", name)
	}
	for _, k := range ts.PrimaryKey {
		i, ok := t.byName[k]
		if !ok {
			return nil, fmt.Errorf("table %s: primary-key column %s is not a column", name, k)
		}
		t.pk = append(t.pk, i)
	}
	t.objectOrder, t.pkNameOrder = objectOrder(ts.Columns), sortedCols(t, t.pk)
	return t, nil
}

func (t *table) col(name string) (int, error) {
	i, ok := t.byName[name]
	if !ok {
		// SQLite's words, in which zero-cache reports most of these.
		return 0, refuse("no such column: %s", quoteIdent(name))
	}
	return i, nil
}

// VersionColumn is the replica's row-version column.
const VersionColumn = "_0_version"

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
