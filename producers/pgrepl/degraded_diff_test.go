package pgrepl

import (
	"slices"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

func issueSpec() *streams.TableSpec {
	return &streams.TableSpec{OID: 16400, Schema: "public", Name: "issue", PrimaryKey: []string{"a", "id"}, Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "int4", Kind: streams.KindNumber, NotNull: true},
		{Name: "a", Pos: 2, DataType: "text", Kind: streams.KindString, NotNull: true},
		{Name: "v", Pos: 3, DataType: "varchar", Kind: streams.KindString, CharacterMaximumLength: 40},
	}}
}

func TestDegraded_RelationDiff(t *testing.T) {
	reg := pgvalue.NewRegistry()
	typ := func(oid uint32) pgvalue.Type { return lookupType(reg, oid, "") }
	const (
		int4, text, varchar, int8 = 23, 25, 1043, 20
	)
	withoutOID := issueSpec()
	withoutOID.OID = 0
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
		rel   uint32             // the Relation's OID: 16400 when 0
		spec  *streams.TableSpec // issueSpec() when nil
		want  string
	}{
		{name: "Same", ident: 'd', cols: base},
		{name: "ColumnAdded", ident: 'd', cols: append(base[:3:3], col{"extra", text, -1, false}),
			want: "columns (id, a, v) are now (id, a, v, extra)"},
		{name: "ColumnDropped", ident: 'd', cols: base[:2], want: "columns (id, a, v) are now (id, a)"},
		{name: "ColumnRenamed", ident: 'd', cols: []col{base[0], {"b", text, -1, true}, base[2]}, want: "columns (id, a, v) are now (id, b, v)"},
		{name: "TypeChanged", ident: 'd', cols: []col{{"id", int8, -1, true}, base[1], base[2]}, want: "column id changed type from int4 to int8"},
		{name: "LengthChanged", ident: 'd', cols: []col{base[0], base[1], {"v", varchar, 84, false}}, want: "column v changed type from varchar(40) to varchar(80)"},
		{name: "KeyChanged", ident: 'd', cols: []col{base[0], {"a", text, -1, false}, base[2]}, want: "primary key (a, id) is now (id)"},
		// FULL flags every column: the key can't be told from it.
		{name: "IdentityFull", ident: 'f', cols: []col{{"id", int4, -1, true}, {"a", text, -1, true}, {"v", varchar, 44, true}}},
		{name: "Recreated", ident: 'd', cols: base, rel: 16500, want: "dropped and created again (oid 16500, was 16400)"},
		// A stream written before specs had OIDs can't tell.
		{name: "SpecWithoutOID", ident: 'd', cols: base, rel: 16500, spec: withoutOID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			if spec == nil {
				spec = issueSpec()
			}
			m := &pglogrepl.RelationMessage{RelationID: 16400, Namespace: "public", RelationName: "issue", ReplicaIdentity: tc.ident}
			if tc.rel != 0 {
				m.RelationID = tc.rel
			}
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

func TestDegraded_SchemaDiff(t *testing.T) {
	other := func() *streams.TableSpec {
		return &streams.TableSpec{OID: 16410, Schema: "app", Name: "label", PrimaryKey: []string{"id"}, Columns: []streams.ColumnSpec{
			{Name: "id", Pos: 1, DataType: "text", Kind: streams.KindString, NotNull: true},
		}}
	}
	initial := func(specs ...*streams.TableSpec) map[[2]string]*streams.TableSpec {
		m := map[[2]string]*streams.TableSpec{}
		for _, s := range specs {
			m[[2]string{s.Schema, s.Name}] = s
		}
		return m
	}
	published := func(specs ...*streams.TableSpec) []*publishedTable {
		var out []*publishedTable
		for _, s := range specs {
			out = append(out, &publishedTable{oid: s.OID, spec: *s})
		}
		return out
	}
	// change returns issueSpec() changed by f.
	change := func(f func(s *streams.TableSpec)) *streams.TableSpec {
		s := issueSpec()
		s.Columns = slices.Clone(s.Columns)
		f(s)
		return s
	}
	noOIDs := func(specs ...*streams.TableSpec) []*streams.TableSpec {
		for _, s := range specs {
			s.OID = 0
		}
		return specs
	}
	for _, tc := range []struct {
		name      string
		initial   []*streams.TableSpec
		now       []*streams.TableSpec
		wantTable string
		want      string
	}{
		{name: "Same", initial: []*streams.TableSpec{issueSpec(), other()}, now: []*streams.TableSpec{other(), issueSpec()}},
		{name: "Empty"},
		// Specs from a stream written before they had OIDs.
		{name: "InitialWithoutOIDs", initial: noOIDs(issueSpec(), other()), now: []*streams.TableSpec{other(), issueSpec()}},
		{name: "Recreated", initial: []*streams.TableSpec{issueSpec(), other()},
			now:       []*streams.TableSpec{other(), change(func(s *streams.TableSpec) { s.OID = 16500 })},
			wantTable: "public.issue", want: "dropped and created again (oid 16500, was 16400)"},
		{name: "Dropped", initial: []*streams.TableSpec{issueSpec(), other()}, now: []*streams.TableSpec{issueSpec()},
			wantTable: "app.label", want: "dropped, or no longer published"},
		{name: "Created", initial: []*streams.TableSpec{issueSpec()}, now: []*streams.TableSpec{other(), issueSpec()},
			wantTable: "app.label", want: "published, but not in the initial sync"},
		{name: "Renamed", initial: []*streams.TableSpec{issueSpec(), other()},
			now:       []*streams.TableSpec{other(), change(func(s *streams.TableSpec) { s.Name = "ticket" })},
			wantTable: "public.issue", want: "renamed to public.ticket"},
		{name: "SetNotNull", initial: []*streams.TableSpec{issueSpec()},
			now:       []*streams.TableSpec{change(func(s *streams.TableSpec) { s.Columns[2].NotNull = true })},
			wantTable: "public.issue", want: "column v is now NOT NULL"},
		{name: "DropNotNull", initial: []*streams.TableSpec{issueSpec()},
			now:       []*streams.TableSpec{change(func(s *streams.TableSpec) { s.Columns[1].NotNull = false })},
			wantTable: "public.issue", want: "column a is now nullable"},
		{name: "TypeChanged", initial: []*streams.TableSpec{issueSpec()},
			now:       []*streams.TableSpec{change(func(s *streams.TableSpec) { s.Columns[0].DataType = "int8" })},
			wantTable: "public.issue", want: "column id changed type from int4 to int8"},
		{name: "LengthChanged", initial: []*streams.TableSpec{issueSpec()},
			now:       []*streams.TableSpec{change(func(s *streams.TableSpec) { s.Columns[2].CharacterMaximumLength = 80 })},
			wantTable: "public.issue", want: "column v changed type from varchar(40) to varchar(80)"},
		{name: "DroppedAndAddedAgain", initial: []*streams.TableSpec{issueSpec()},
			now:       []*streams.TableSpec{change(func(s *streams.TableSpec) { s.Columns[2].Pos = 4 })},
			wantTable: "public.issue", want: "column v was dropped and added again (position 4, was 3)"},
		{name: "ColumnAdded", initial: []*streams.TableSpec{issueSpec()},
			now: []*streams.TableSpec{change(func(s *streams.TableSpec) {
				s.Columns = append(s.Columns, streams.ColumnSpec{Name: "extra", Pos: 4, DataType: "text", Kind: streams.KindString})
			})},
			wantTable: "public.issue", want: "columns (id, a, v) are now (id, a, v, extra)"},
		// A published schema has the key in its order, which a Relation
		// message can't tell.
		{name: "KeyOrderChanged", initial: []*streams.TableSpec{issueSpec()},
			now:       []*streams.TableSpec{change(func(s *streams.TableSpec) { s.PrimaryKey = []string{"id", "a"} })},
			wantTable: "public.issue", want: "primary key (a, id) is now (id, a)"},
		// Indexes and defaults are not compared; Kind follows the type.
		{name: "EnumFlagIgnored", initial: []*streams.TableSpec{issueSpec()},
			now: []*streams.TableSpec{change(func(s *streams.TableSpec) { s.Columns[1].Enum = true })}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, got := schemaDiff(initial(tc.initial...), published(tc.now...))
			gotTable := ""
			if got != "" {
				gotTable = table[0] + "." + table[1]
			}
			if got != tc.want || gotTable != tc.wantTable {
				t.Errorf("schemaDiff = %s, %q; want %s, %q", gotTable, got, tc.wantTable, tc.want)
			}
		})
	}
}
