package pgvalue

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jetsync/jetsync/streams"
)

// builtin describes one builtin type and its array type.
type builtin struct {
	oid, arrayOID uint32
	name          string
	conv          conv
}

// builtinTypes are the builtin types whose conversion matters, or that pgx
// names. Builtins not listed here are loaded like user types, by category.
var builtinTypes = []builtin{
	{pgtype.BoolOID, pgtype.BoolArrayOID, "bool", convBool},
	{pgtype.Int2OID, pgtype.Int2ArrayOID, "int2", convInt},
	{pgtype.Int4OID, pgtype.Int4ArrayOID, "int4", convInt},
	{pgtype.Int8OID, pgtype.Int8ArrayOID, "int8", convInt},
	{pgtype.Float4OID, pgtype.Float4ArrayOID, "float4", convFloat},
	{pgtype.Float8OID, pgtype.Float8ArrayOID, "float8", convFloat},
	{pgtype.NumericOID, pgtype.NumericArrayOID, "numeric", convFloat},

	{pgtype.TextOID, pgtype.TextArrayOID, "text", convString},
	{pgtype.VarcharOID, pgtype.VarcharArrayOID, "varchar", convString},
	{pgtype.BPCharOID, pgtype.BPCharArrayOID, "bpchar", convString},
	{pgtype.QCharOID, pgtype.QCharArrayOID, "char", convString},
	{pgtype.NameOID, pgtype.NameArrayOID, "name", convString},
	{pgtype.UnknownOID, 0, "unknown", convString},
	{pgtype.UUIDOID, pgtype.UUIDArrayOID, "uuid", convString},
	{pgtype.InetOID, pgtype.InetArrayOID, "inet", convString},
	{pgtype.CIDROID, pgtype.CIDRArrayOID, "cidr", convString},
	{pgtype.MacaddrOID, pgtype.MacaddrArrayOID, "macaddr", convString},
	{pgtype.Macaddr8OID, 775, "macaddr8", convString},
	{3220, 3221, "pg_lsn", convString},

	{pgtype.TimestampOID, pgtype.TimestampArrayOID, "timestamp", convTimestamp},
	{pgtype.TimestamptzOID, pgtype.TimestamptzArrayOID, "timestamptz", convTimestamptz},
	{pgtype.DateOID, pgtype.DateArrayOID, "date", convDate},
	{pgtype.TimeOID, pgtype.TimeArrayOID, "time", convTime},
	{pgtype.TimetzOID, pgtype.TimetzArrayOID, "timetz", convTimetz},

	{pgtype.JSONOID, pgtype.JSONArrayOID, "json", convJSON},
	{pgtype.JSONBOID, pgtype.JSONBArrayOID, "jsonb", convJSON},

	{pgtype.ByteaOID, pgtype.ByteaArrayOID, "bytea", convUnsupported},
	{pgtype.IntervalOID, pgtype.IntervalArrayOID, "interval", convUnsupported},
	{pgtype.OIDOID, pgtype.OIDArrayOID, "oid", convUnsupported},
	{pgtype.XIDOID, pgtype.XIDArrayOID, "xid", convUnsupported},
	{pgtype.XID8OID, pgtype.XID8ArrayOID, "xid8", convUnsupported},
	{pgtype.CIDOID, pgtype.CIDArrayOID, "cid", convUnsupported},
	{pgtype.TIDOID, pgtype.TIDArrayOID, "tid", convUnsupported},
	{pgtype.XMLOID, pgtype.XMLArrayOID, "xml", convUnsupported},
	{790, 791, "money", convUnsupported},
	{pgtype.BitOID, pgtype.BitArrayOID, "bit", convUnsupported},
	{pgtype.VarbitOID, pgtype.VarbitArrayOID, "varbit", convUnsupported},
	{pgtype.PointOID, pgtype.PointArrayOID, "point", convUnsupported},
	{pgtype.LsegOID, pgtype.LsegArrayOID, "lseg", convUnsupported},
	{pgtype.PathOID, pgtype.PathArrayOID, "path", convUnsupported},
	{pgtype.BoxOID, pgtype.BoxArrayOID, "box", convUnsupported},
	{pgtype.PolygonOID, pgtype.PolygonArrayOID, "polygon", convUnsupported},
	{pgtype.LineOID, pgtype.LineArrayOID, "line", convUnsupported},
	{pgtype.CircleOID, pgtype.CircleArrayOID, "circle", convUnsupported},
	{pgtype.TSVectorOID, pgtype.TSVectorArrayOID, "tsvector", convUnsupported},
	{3615, 3645, "tsquery", convUnsupported},
	{pgtype.JSONPathOID, pgtype.JSONPathArrayOID, "jsonpath", convUnsupported},
	{pgtype.ACLItemOID, pgtype.ACLItemArrayOID, "aclitem", convUnsupported},
	{pgtype.RecordOID, pgtype.RecordArrayOID, "record", convUnsupported},
	{pgtype.Int4rangeOID, pgtype.Int4rangeArrayOID, "int4range", convUnsupported},
	{pgtype.Int8rangeOID, pgtype.Int8rangeArrayOID, "int8range", convUnsupported},
	{pgtype.NumrangeOID, pgtype.NumrangeArrayOID, "numrange", convUnsupported},
	{pgtype.TsrangeOID, pgtype.TsrangeArrayOID, "tsrange", convUnsupported},
	{pgtype.TstzrangeOID, pgtype.TstzrangeArrayOID, "tstzrange", convUnsupported},
	{pgtype.DaterangeOID, pgtype.DaterangeArrayOID, "daterange", convUnsupported},
	{pgtype.Int4multirangeOID, pgtype.Int4multirangeArrayOID, "int4multirange", convUnsupported},
	{pgtype.Int8multirangeOID, pgtype.Int8multirangeArrayOID, "int8multirange", convUnsupported},
	{pgtype.NummultirangeOID, pgtype.NummultirangeArrayOID, "nummultirange", convUnsupported},
	{pgtype.TsmultirangeOID, pgtype.TsmultirangeArrayOID, "tsmultirange", convUnsupported},
	{pgtype.TstzmultirangeOID, pgtype.TstzmultirangeArrayOID, "tstzmultirange", convUnsupported},
	{pgtype.DatemultirangeOID, pgtype.DatemultirangeArrayOID, "datemultirange", convUnsupported},
}

// stringBaseTypes are extension base types that zero-cache syncs as strings
// although their category is not S (the isn extension's).
var stringBaseTypes = map[string]bool{
	"ean13": true, "isbn": true, "isbn13": true, "ismn": true, "ismn13": true,
	"issn": true, "issn13": true, "upc": true,
}

// builtinByOID and builtinByName hold the builtin types and their arrays.
// They are never written after package initialization.
var builtinByOID, builtinByName = func() (map[uint32]*Type, map[string]*Type) {
	byOID := make(map[uint32]*Type, 2*len(builtinTypes))
	byName := make(map[string]*Type, 2*len(builtinTypes))
	for _, b := range builtinTypes {
		t := &Type{OID: b.oid, Name: b.name, Kind: b.conv.kind(), conv: b.conv}
		if b.oid == pgtype.BoxOID {
			t.delim = ';' // box's text holds commas
		}
		byOID[t.OID], byName[t.Name] = t, t
		if b.arrayOID != 0 {
			a := arrayOf(b.arrayOID, t)
			byOID[a.OID], byName[a.Name] = a, a
		}
	}
	return byOID, byName
}()

func arrayOf(oid uint32, elem *Type) *Type {
	return &Type{
		OID:   oid,
		Name:  elem.Name + "[]",
		Kind:  convArray.kind(),
		Enum:  elem.Enum,
		Array: true,
		Elem:  elem,
		conv:  convArray,
	}
}

// TypeByName returns the builtin type of that name ("int8", "int4[]",
// "timestamptz"), for callers that know a column's data type but not its OID.
func TypeByName(name string) (Type, bool) {
	if t, ok := builtinByName[name]; ok {
		return *t, true
	}
	return Type{}, false
}

// Registry maps OIDs to Types: all builtin types preloaded; user types
// (enums, domains -> base type, arrays of those) loaded on demand. It is safe
// for concurrent use.
type Registry struct {
	mu   sync.RWMutex
	user map[uint32]*Type
}

// NewRegistry returns a Registry that knows the builtin types.
func NewRegistry() *Registry {
	return &Registry{user: make(map[uint32]*Type)}
}

// Lookup returns the Type of oid, if it is builtin or was loaded.
func (r *Registry) Lookup(oid uint32) (Type, bool) {
	if t, ok := builtinByOID[oid]; ok {
		return *t, true
	}
	r.mu.RLock()
	t, ok := r.user[oid]
	r.mu.RUnlock()
	if !ok {
		return Type{}, false
	}
	return *t, true
}

func (r *Registry) known(oid uint32) bool {
	_, ok := r.Lookup(oid)
	return ok
}

// typeRow is one pg_type row.
type typeRow struct {
	oid      uint32
	name     string
	typtype  byte
	category byte
	elem     uint32
	base     uint32
	delim    byte
	array    bool
}

// loadQuery reads what Load needs of pg_type. An array is a type whose
// subscripting is array_subscript_handler (Postgres 14+): the other types
// with a typelem, such as name or point, are fixed-length types that only
// subscript like arrays.
const loadQuery = `SELECT oid, typname::text, typtype, typcategory, typelem, typbasetype, typdelim,
	typsubscript = 'pg_catalog.array_subscript_handler'::regproc
FROM pg_catalog.pg_type WHERE oid = ANY($1::oid[])`

// maxLoadRounds bounds the chain of element and base types Load follows
// (an array of a domain over a domain over an enum takes four).
const maxLoadRounds = 16

// Load queries pg_type for the given OIDs not yet known, following array
// element and domain base types (typelem, typbasetype), and registers them.
// Use it with any *pgx.Conn (a regular, non-replication connection). Enum
// labels travel as text, so pg_enum is not needed.
//
// Enums convert as strings; domains as their base type, under its name;
// arrays as JSON arrays of their element type. Other base types (extension
// types) convert as strings when their category is string (citext) or they
// are the isn extension's, else they are unsupported, like composites,
// ranges and pseudo-types.
func (r *Registry) Load(ctx context.Context, conn *pgx.Conn, oids ...uint32) error {
	if conn == nil {
		return fmt.Errorf("load types %v: no connection", oids)
	}
	rows := make(map[uint32]*typeRow)
	var pending []uint32
	want := func(oid uint32) {
		if oid != 0 && rows[oid] == nil && !r.known(oid) && !containsOID(pending, oid) {
			pending = append(pending, oid)
		}
	}
	for _, oid := range oids {
		want(oid)
	}
	for round := 0; len(pending) > 0; round++ {
		if round == maxLoadRounds {
			return fmt.Errorf("load types %v: type chain longer than %d", oids, maxLoadRounds)
		}
		batch := pending
		pending = nil
		got, err := queryTypes(ctx, conn, batch)
		if err != nil {
			return fmt.Errorf("load types %v: %w", batch, err)
		}
		for _, oid := range batch {
			if got[oid] == nil {
				return fmt.Errorf("load type %d: no such type", oid)
			}
		}
		for oid, row := range got {
			rows[oid] = row
		}
		for _, row := range got {
			if row.array {
				want(row.elem)
			}
			if row.typtype == 'd' {
				want(row.base)
			}
		}
	}
	if len(rows) == 0 {
		return nil
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	for oid := range rows {
		if _, err := r.resolve(oid, rows, 0); err != nil {
			return err
		}
	}
	return nil
}

func containsOID(s []uint32, oid uint32) bool {
	for _, o := range s {
		if o == oid {
			return true
		}
	}
	return false
}

func queryTypes(ctx context.Context, conn *pgx.Conn, oids []uint32) (map[uint32]*typeRow, error) {
	rs, err := conn.Query(ctx, loadQuery, oids)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	got := make(map[uint32]*typeRow, len(oids))
	for rs.Next() {
		var row typeRow
		var array *bool
		if err := rs.Scan(&row.oid, &row.name, &row.typtype, &row.category, &row.elem, &row.base, &row.delim, &array); err != nil {
			return nil, err
		}
		row.array = array != nil && *array
		got[row.oid] = &row
	}
	return got, rs.Err()
}

// resolve builds and registers the Type of oid from its pg_type row and
// those of the types it refers to. r.mu is held.
func (r *Registry) resolve(oid uint32, rows map[uint32]*typeRow, depth int) (*Type, error) {
	if t, ok := builtinByOID[oid]; ok {
		return t, nil
	}
	if t, ok := r.user[oid]; ok {
		return t, nil
	}
	row := rows[oid]
	if row == nil || depth > maxLoadRounds {
		return nil, fmt.Errorf("load type %d: unresolved", oid)
	}
	var t *Type
	switch {
	case row.typtype == 'd':
		base, err := r.resolve(row.base, rows, depth+1)
		if err != nil {
			return nil, err
		}
		c := *base
		c.OID = oid
		t = &c
	case row.typtype == 'e':
		t = &Type{OID: oid, Name: row.name, Kind: streams.KindString, Enum: true, conv: convString}
	case row.typtype == 'b' && row.array && row.elem != 0:
		elem, err := r.resolve(row.elem, rows, depth+1)
		if err != nil {
			return nil, err
		}
		t = arrayOf(oid, elem)
	case row.typtype == 'b' && (row.category == 'S' || stringBaseTypes[row.name]):
		t = &Type{OID: oid, Name: row.name, Kind: streams.KindString, conv: convString}
	default:
		t = &Type{OID: oid, Name: row.name, Kind: streams.KindUnsupported, conv: convUnsupported}
	}
	if row.delim != ',' && t.conv != convArray {
		t.delim = row.delim
	}
	r.user[oid] = t
	return t, nil
}
