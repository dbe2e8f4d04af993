package pgrepl

import (
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

func TestDegraded_RelationDiff(t *testing.T) {
	reg := pgvalue.NewRegistry()
	typ := func(oid uint32) pgvalue.Type { return lookupType(reg, oid, "") }
	const (
		int4, text, varchar, int8 = 23, 25, 1043, 20
	)
	spec := &streams.TableSpec{Schema: "public", Name: "issue", PrimaryKey: []string{"a", "id"}, Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "int4", Kind: streams.KindNumber},
		{Name: "a", Pos: 2, DataType: "text", Kind: streams.KindString},
		{Name: "v", Pos: 3, DataType: "varchar", Kind: streams.KindString, CharacterMaximumLength: 40},
	}}
	type col struct {
		name  string
		oid   uint32
		mod   int32
		inKey bool
	}
	base := []col{{"id", int4, -1, true}, {"a", text, -1, true}, {"v", varchar, 44, false}}
	for _, tc := range []struct {
		name  string
		ident uint8
		cols  []col
		want  string
	}{
		{"Same", 'd', base, ""},
		{"ColumnAdded", 'd', append(base[:3:3], col{"extra", text, -1, false}),
			"columns (id, a, v) are now (id, a, v, extra)"},
		{"ColumnDropped", 'd', base[:2], "columns (id, a, v) are now (id, a)"},
		{"ColumnRenamed", 'd', []col{base[0], {"b", text, -1, true}, base[2]}, "columns (id, a, v) are now (id, b, v)"},
		{"TypeChanged", 'd', []col{{"id", int8, -1, true}, base[1], base[2]}, "column id changed type from int4 to int8"},
		{"LengthChanged", 'd', []col{base[0], base[1], {"v", varchar, 84, false}}, "column v changed type from varchar(40) to varchar(80)"},
		{"KeyChanged", 'd', []col{base[0], {"a", text, -1, false}, base[2]}, "primary key (a, id) is now (id)"},
		// FULL flags every column: the key can't be told from it.
		{"IdentityFull", 'f', []col{{"id", int4, -1, true}, {"a", text, -1, true}, {"v", varchar, 44, true}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &pglogrepl.RelationMessage{Namespace: "public", RelationName: "issue", ReplicaIdentity: tc.ident}
			var types []pgvalue.Type
			for _, c := range tc.cols {
				var flags uint8
				if c.inKey {
					flags = 1
				}
				m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{Flags: flags, Name: c.name, DataType: c.oid, TypeModifier: c.mod})
				types = append(types, typ(c.oid))
			}
			if got := relationDiff(spec, m, types); got != tc.want {
				t.Errorf("relationDiff = %q; want %q", got, tc.want)
			}
		})
	}
}
