package pgrepl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/progress"
	"github.com/jetsync/jetsync/streams"
)

// Schema changes (streams/README.md, "Schema changes"). The shard's event triggers emit the
// published schema before and after each DDL command (setup.go, ddlSQL);
// the decoder diffs the two, in zero-cache's order, into schema changes on
// the touched tables' subjects.

// ResyncError ends a session so that the next one starts a new initial
// sync: the change stream cannot carry what upstream did.
type ResyncError struct{ Reason string }

func (e *ResyncError) Error() string { return "resync required: " + e.Reason }

// ddlEvent is a message of the shard's event triggers.
type ddlEvent struct {
	Type  string `json:"type"`
	Event struct {
		Tag string `json:"tag"`
	} `json:"event"`
	Context struct {
		Query string `json:"query"`
	} `json:"context"`
	PreviousSchema *pubSchema `json:"previousSchema"`
	Schema         *pubSchema `json:"schema"`
}

// pubSchema is the trigger's schema_specs().
type pubSchema struct {
	Tables  []pubTable `json:"tables"`
	Indexes []pubIndex `json:"indexes"`
}

type pubTable struct {
	OID             oid                  `json:"oid"`
	Schema          string               `json:"schema"`
	Name            string               `json:"name"`
	ReplicaIdentity string               `json:"replicaIdentity"`
	Columns         map[string]pubColumn `json:"columns"`
}

type pubColumn struct {
	Pos      int     `json:"pos"`
	DataType string  `json:"dataType"`
	TypeOID  oid     `json:"typeOID"`
	Typmod   int     `json:"typmod"`
	NotNull  bool    `json:"notNull"`
	Dflt     *string `json:"dflt"`
}

type pubIndex struct {
	Schema          string   `json:"schema"`
	TableName       string   `json:"tableName"`
	Name            string   `json:"name"`
	Unique          bool     `json:"unique"`
	Primary         bool     `json:"primary"`
	ReplicaIdentity bool     `json:"replicaIdentity"`
	Partial         bool     `json:"partial"`
	Columns         []string `json:"columns"`
	Desc            []bool   `json:"desc"`
}

// oid is an OID, which json_build_object writes as a string.
type oid uint32

func (o *oid) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseUint(strings.Trim(string(b), `"`), 10, 32)
	if err != nil {
		return fmt.Errorf("bad oid %s", b)
	}
	*o = oid(n)
	return nil
}

// ddlTable is a published table as a schema snapshot describes it.
type ddlTable struct {
	pub      *pubTable
	t        *publishedTable
	typeOIDs []uint32             // per t.spec.Columns
	attrs    map[string]pubColumn // published columns by name
}

// ddlIndex is an index the replica can hold.
type ddlIndex struct {
	spec  streams.IndexSpec
	table uint32 // OID
	attrs []int  // column positions
}

// ddlSnapshot is one side of a diff.
type ddlSnapshot struct {
	tables  map[uint32]*ddlTable
	order   []uint32 // table OIDs in the snapshot's order
	indexes map[string]*ddlIndex
	iorder  []string
}

// snapshot converts s as readSchema would read the same tables, so that
// specs from DDL and from an initial sync agree.
func (d *decoder) snapshot(ctx context.Context, s *pubSchema) (*ddlSnapshot, error) {
	snap := &ddlSnapshot{tables: map[uint32]*ddlTable{}, indexes: map[string]*ddlIndex{}}
	var unknown []uint32
	for _, t := range s.Tables {
		for _, c := range t.Columns {
			if _, ok := d.reg.Lookup(uint32(c.TypeOID)); !ok && !slices.Contains(unknown, uint32(c.TypeOID)) {
				unknown = append(unknown, uint32(c.TypeOID))
			}
		}
	}
	if len(unknown) > 0 && d.conn != nil {
		// A type dropped since travels as unsupported, as lookupType
		// falls back for any type it cannot find.
		if err := d.reg.Load(ctx, d.conn, unknown...); err != nil {
			d.log.Warn("load types of a schema change", "err", err)
		}
	}
	byName := map[[2]string]*ddlTable{}
	for i := range s.Tables {
		pt := &s.Tables[i]
		t := &ddlTable{pub: pt, attrs: pt.Columns, t: &publishedTable{oid: uint32(pt.OID), spec: streams.TableSpec{OID: uint32(pt.OID), Schema: pt.Schema, Name: pt.Name}}}
		names := make([]string, 0, len(pt.Columns))
		for n := range pt.Columns {
			names = append(names, n)
		}
		sort.Slice(names, func(i, j int) bool { return pt.Columns[names[i]].Pos < pt.Columns[names[j]].Pos })
		for _, n := range names {
			c := pt.Columns[n]
			typ := lookupType(d.reg, uint32(c.TypeOID), c.DataType)
			spec := streams.ColumnSpec{Name: n, Pos: c.Pos, DataType: typ.Name, Kind: typ.Kind, NotNull: c.NotNull, Enum: typ.Enum, Array: typ.Array}
			if (typ.Name == "varchar" || typ.Name == "bpchar") && c.Typmod > 4 {
				spec.CharacterMaximumLength = c.Typmod - 4
			}
			t.t.spec.Columns = append(t.t.spec.Columns, spec)
			t.t.types = append(t.t.types, typ)
			t.typeOIDs = append(t.typeOIDs, uint32(c.TypeOID))
		}
		snap.tables[uint32(pt.OID)] = t
		snap.order = append(snap.order, uint32(pt.OID))
		byName[[2]string{pt.Schema, pt.Name}] = t
	}
	replKey := map[uint32][]string{}
	for i := range s.Indexes {
		x := &s.Indexes[i]
		t := byName[[2]string{x.Schema, x.TableName}]
		if t == nil || x.Partial || len(x.Columns) == 0 {
			continue
		}
		idx := &ddlIndex{table: uint32(t.pub.OID), spec: streams.IndexSpec{Schema: x.Schema, TableName: x.TableName, Name: x.Name, Unique: x.Unique, Columns: x.Columns}}
		ok := true
		for _, c := range x.Columns {
			a, pub := t.attrs[c]
			if !pub {
				ok = false // a column not published
				break
			}
			idx.attrs = append(idx.attrs, a.Pos)
		}
		if !ok {
			continue
		}
		desc := make([]bool, len(x.Columns))
		copy(desc, x.Desc) // INCLUDE columns have no direction
		if slices.Contains(desc, true) {
			idx.spec.Desc = desc
		}
		switch {
		case x.Primary:
			t.t.spec.PrimaryKey = x.Columns
		case x.ReplicaIdentity && t.pub.ReplicaIdentity == "i":
			replKey[uint32(t.pub.OID)] = x.Columns
		}
		t.t.indexes = append(t.t.indexes, idx.spec)
		key := x.Schema + "." + x.Name
		snap.indexes[key] = idx
		snap.iorder = append(snap.iorder, key)
	}
	for oid, k := range replKey {
		if t := snap.tables[oid]; t.t.spec.PrimaryKey == nil {
			t.t.spec.PrimaryKey = k
		}
	}
	return snap, nil
}

// ddlChange is a schema change and the table whose subject carries it.
type ddlChange struct {
	schema, name string
	change       streams.Change
}

// ddl handles a message of the shard's event triggers.
func (d *decoder) ddl(ctx context.Context, content []byte, emit func(event) error) error {
	var ev ddlEvent
	if err := json.Unmarshal(content, &ev); err != nil {
		// zero-cache halts on a message it cannot parse.
		return &ResyncError{fmt.Sprintf("malformed ddl message: %v", err)}
	}
	if ev.Schema == nil || ev.PreviousSchema == nil {
		// ddlStart: the schema before the command, with nothing to diff.
		return nil
	}
	log := d.log.With("tag", ev.Event.Tag, "type", ev.Type)
	if d.skipping {
		return nil
	}
	prev, err := d.snapshot(ctx, ev.PreviousSchema)
	if err != nil {
		return err
	}
	next, err := d.snapshot(ctx, ev.Schema)
	if err != nil {
		return err
	}
	changes, backfills, err := diffSchemas(prev, next, ev.Event.Tag)
	if err != nil {
		return &ResyncError{fmt.Sprintf("%s (%s): %v", ev.Event.Tag, ev.Context.Query, err)}
	}
	if len(changes) == 0 {
		return nil
	}
	log.Info("schema change", "changes", len(changes), "backfills", len(backfills), "statement", ev.Context.Query)
	for _, c := range changes {
		b, err := json.Marshal(&c.change)
		if err != nil {
			return err
		}
		if err := emit(event{kind: evChange, table: d.table(c.schema, c.name), change: c.change, size: changeOverhead + len(b)}); err != nil {
			return err
		}
	}
	for _, bt := range backfills {
		t := bt.t
		if d.resumePartial && d.wm == d.resumeWM {
			// Part of this transaction is in the stream already, and a
			// backfill read now need not cut into the same parts.
			return &ResyncError{fmt.Sprintf("a restart fell inside transaction %s, whose %s backfills %s.%s", d.wm, ev.Event.Tag, t.spec.Schema, t.spec.Name)}
		}
		if err := d.backfill(ctx, bt, emit); err != nil {
			return err
		}
	}
	return nil
}

var (
	validTableName  = regexp.MustCompile(`^[A-Za-z_]+[A-Za-z0-9_-]*$`)
	validColumnName = regexp.MustCompile(`^[A-Za-z_]+[.A-Za-z0-9_-]*$`)
)

// validate rejects the tables zero-cache rejects in a schema change
// (change-source/pg/schema/validation.ts).
func validate(t *ddlTable) error {
	name := t.pub.Name
	if _, ok := t.pub.Columns["_0_version"]; ok {
		return fmt.Errorf("table %q uses reserved column name \"_0_version\"", name)
	}
	switch t.pub.ReplicaIdentity {
	case "n":
		return fmt.Errorf("table %q with REPLICA IDENTITY NOTHING cannot be replicated", name)
	case "i":
		if len(t.t.spec.PrimaryKey) == 0 {
			return fmt.Errorf("table %q is missing its REPLICA IDENTITY INDEX", name)
		}
	}
	if !validTableName.MatchString(name) {
		return fmt.Errorf("table %q has invalid characters", name)
	}
	for _, c := range t.t.spec.Columns {
		if !validColumnName.MatchString(c.Name) {
			return fmt.Errorf("column %q in table %q has invalid characters", c.Name, name)
		}
	}
	return nil
}

// diffSchemas returns the schema changes from prev to next in zero-cache's
// order (docs/replica.md §7): drop indexes, drop tables, alter kept tables
// (rename, drop, update and add columns), create tables, create indexes.
// SQLite refuses to drop an indexed column, hence indexes first. It also
// returns the tables whose rows must be copied again.
func diffSchemas(prev, next *ddlSnapshot, tag string) ([]ddlChange, []*ddlTable, error) {
	for _, oid := range next.order {
		t := next.tables[oid]
		if p, ok := prev.tables[oid]; ok && tableEqual(p.t, t.t) && p.pub.ReplicaIdentity == t.pub.ReplicaIdentity {
			continue
		}
		if err := validate(t); err != nil {
			return nil, nil, err
		}
	}
	var out []ddlChange
	var backfills []*ddlTable

	var created []string
	for _, k := range prev.iorder {
		p := prev.indexes[k]
		n, ok := next.indexes[k]
		if ok && !indexChanged(p, n) {
			continue
		}
		out = append(out, ddlChange{p.spec.Schema, p.spec.TableName, streams.Change{Op: streams.OpDropIndex, Index: &p.spec}})
		if ok {
			created = append(created, k)
		}
	}
	for _, k := range next.iorder {
		if _, ok := prev.indexes[k]; !ok {
			created = append(created, k)
		}
	}

	for _, oid := range prev.order {
		if _, ok := next.tables[oid]; !ok {
			p := prev.tables[oid].t.spec
			out = append(out, ddlChange{p.Schema, p.Name, streams.Change{Op: streams.OpDropTable}})
		}
	}
	for _, oid := range prev.order {
		n, ok := next.tables[oid]
		if !ok {
			continue
		}
		changes, backfill := alterTable(prev.tables[oid], n, tag)
		out = append(out, changes...)
		if backfill {
			backfills = append(backfills, n)
		}
	}
	for _, oid := range next.order {
		if _, ok := prev.tables[oid]; ok {
			continue
		}
		t := next.tables[oid]
		spec := t.t.spec
		out = append(out, ddlChange{spec.Schema, spec.Name, streams.Change{Op: streams.OpCreateTable, Spec: &spec}})
		// A created table is empty; one that joined a publication is not.
		if !strings.HasPrefix(tag, "CREATE") {
			backfills = append(backfills, t)
		}
	}
	for _, k := range created {
		n := next.indexes[k]
		out = append(out, ddlChange{n.spec.Schema, n.spec.TableName, streams.Change{Op: streams.OpCreateIndex, Index: &n.spec}})
	}
	for _, t := range backfills {
		if len(t.t.spec.PrimaryKey) == 0 {
			return nil, nil, fmt.Errorf("table %q has no primary key, so its rows cannot be copied again", t.t.spec.Name)
		}
	}
	return out, backfills, nil
}

func tableEqual(a, b *publishedTable) bool {
	return a.spec.Schema == b.spec.Schema && a.spec.Name == b.spec.Name &&
		slices.Equal(a.spec.PrimaryKey, b.spec.PrimaryKey) && slices.Equal(a.spec.Columns, b.spec.Columns)
}

// indexChanged reports a structural change to an index: not one that
// follows from renaming its table or columns, which SQLite follows too.
func indexChanged(p, n *ddlIndex) bool {
	return p.table != n.table || p.spec.Unique != n.spec.Unique || !slices.Equal(p.attrs, n.attrs) ||
		!slices.Equal(p.spec.Desc, n.spec.Desc)
}

// alterTable returns the changes that take kept table p to n, and whether
// its rows must be copied again.
func alterTable(p, n *ddlTable, tag string) ([]ddlChange, bool) {
	var out []ddlChange
	cur := p.t.spec
	cur.Columns = slices.Clone(cur.Columns)
	cur.PrimaryKey = slices.Clone(cur.PrimaryKey)
	subject := [2]string{cur.Schema, cur.Name}
	add := func(c streams.Change) {
		spec := cur
		spec.Columns = slices.Clone(cur.Columns)
		spec.PrimaryKey = slices.Clone(cur.PrimaryKey)
		c.Spec = &spec
		out = append(out, ddlChange{subject[0], subject[1], c})
	}
	if cur.Schema != n.t.spec.Schema || cur.Name != n.t.spec.Name {
		cur.Schema, cur.Name = n.t.spec.Schema, n.t.spec.Name
		add(streams.Change{Op: streams.OpRenameTable})
		subject = [2]string{cur.Schema, cur.Name}
	}
	byPos := func(cols []streams.ColumnSpec, pos int) int {
		return slices.IndexFunc(cols, func(c streams.ColumnSpec) bool { return c.Pos == pos })
	}
	for _, c := range p.t.spec.Columns {
		if byPos(n.t.spec.Columns, c.Pos) >= 0 {
			continue
		}
		cur.Columns = slices.DeleteFunc(cur.Columns, func(x streams.ColumnSpec) bool { return x.Name == c.Name })
		if slices.Contains(cur.PrimaryKey, c.Name) {
			cur.PrimaryKey = nil // n's key comes with the create-table below
		}
		add(streams.Change{Op: streams.OpDropColumn, Columns: []string{c.Name}})
	}
	for _, nc := range n.t.spec.Columns {
		i := byPos(cur.Columns, nc.Pos)
		if i < 0 || cur.Columns[i] == nc {
			continue
		}
		old := cur.Columns[i].Name
		cur.Columns[i] = nc
		if j := slices.Index(cur.PrimaryKey, old); j >= 0 {
			cur.PrimaryKey[j] = nc.Name
		}
		add(streams.Change{Op: streams.OpUpdateColumn, Columns: []string{old, nc.Name}})
	}
	backfill := false
	for _, nc := range n.t.spec.Columns {
		if byPos(p.t.spec.Columns, nc.Pos) >= 0 {
			continue
		}
		cur.Columns = append(cur.Columns, nc)
		sort.SliceStable(cur.Columns, func(i, j int) bool { return cur.Columns[i].Pos < cur.Columns[j].Pos })
		c := streams.Change{Op: streams.OpAddColumn, Columns: []string{nc.Name}}
		switch v, ok := columnDefault(nc, n.attrs[nc.Name].Dflt); {
		case tag != "ALTER TABLE":
			// A column newly published (ALTER PUBLICATION) has values.
			backfill = true
		case ok:
			if v != nil {
				c.New = streams.Row{nc.Name: v}
			}
		default:
			backfill = true
		}
		add(c)
	}
	if !tableEqual(&publishedTable{spec: cur}, n.t) {
		// The key changed: bring the table to n's spec.
		spec := n.t.spec
		out = append(out, ddlChange{subject[0], subject[1], streams.Change{Op: streams.OpCreateTable, Spec: &spec}})
	}
	return out, backfill
}

var (
	numericLiteral = regexp.MustCompile(`^-?\d+(\.\d+)?$`)
	quotedLiteral  = regexp.MustCompile(`^'((?:[^']|'')*)'::[\w ]+$`)
	emptyArray     = regexp.MustCompile(`^(ARRAY\s*\[\s*\]|'\{\}')::[\w ]+\[\]$`)
)

// columnDefault is the value existing rows hold in a column just added with
// default dflt, when it can be told without Postgres computing it: nil for
// no default. Like zero-cache (pg-to-lite.ts) it takes numeric, boolean,
// quoted and empty-array literals, but only where the column's kind holds
// the literal as written; any other default is backfilled.
func columnDefault(c streams.ColumnSpec, dflt *string) (json.RawMessage, bool) {
	if dflt == nil {
		return nil, true
	}
	s := *dflt
	switch {
	case c.Array:
		if emptyArray.MatchString(s) {
			return json.RawMessage("[]"), true
		}
	case c.Kind == streams.KindNumber:
		// Postgres shows a negative constant quoted ('-5'::integer).
		if m := quotedLiteral.FindStringSubmatch(s); m != nil {
			s = m[1]
		}
		// float4 values travel as float4 text, which a literal need not be.
		if numericLiteral.MatchString(s) && c.DataType != "float4" {
			return json.RawMessage(s), true
		}
	case c.Kind == streams.KindBoolean:
		if s == "true" || s == "false" {
			return json.RawMessage(s), true
		}
	case c.Kind == streams.KindString:
		if m := quotedLiteral.FindStringSubmatch(s); m != nil && (c.Enum || c.DataType == "text" || c.DataType == "varchar") {
			v := strings.ReplaceAll(m[1], "''", "'")
			return json.RawMessage(streams.AppendJSONString(nil, v)), true
		}
	}
	return nil, false
}

// backfillChunk bounds the rows of one backfill change after a schema
// change. The events queue holds these, so they stay small; the packer
// fills messages with several.
const backfillChunk = 32 << 10

// backfill copies t's rows from a fresh snapshot and emits them. The
// snapshot is newer than the schema change; the changes after it in the
// replication stream bring every row to its final value.
func (d *decoder) backfill(ctx context.Context, bt *ddlTable, emit func(event) error) error {
	t := bt.t
	if d.conn == nil {
		return errors.New("backfill without a connection")
	}
	name := t.spec.Schema + "." + t.spec.Name
	prog := progress.NewCopy(d.log, d.progress, "backfill", d.progressEvery)
	est := readEstimates(ctx, d.conn, d.log, t)[t.oid]
	pt := prog.Add(name, est.rows, est.bytes)
	tx, err := d.backfillSnapshot(ctx, bt)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	ref := d.table(t.spec.Schema, t.spec.Name)
	cols := make([]string, len(t.spec.Columns))
	colSize := 0
	for i, c := range t.spec.Columns {
		cols[i] = c.Name
		colSize += jsonStringSize(c.Name) + 1
	}
	prog.Start()
	defer prog.End()
	pt.Begin()
	w := &backfillWriter{
		table: t, cols: cols, limit: backfillChunk, progress: pt,
		flush: func(rows [][]json.RawMessage) error {
			size := changeOverhead + colSize
			for _, r := range rows {
				size += 2
				for _, v := range r {
					size += rawSize(v)
				}
			}
			return emit(event{kind: evChange, table: ref, change: streams.Change{Op: streams.OpBackfill, Columns: cols, Rows: rows}, size: size})
		},
	}
	if _, err := tx.Conn().PgConn().CopyTo(ctx, w, t.copyQuery()); err != nil {
		if w.err != nil {
			err = w.err
		}
		return fmt.Errorf("backfill %s.%s: %w", t.spec.Schema, t.spec.Name, err)
	}
	if err := w.close(); err != nil {
		return err
	}
	pt.Done("backfilled")
	return nil
}

// backfillSnapshotWait bounds how long backfillSnapshot waits for the
// schema change to become visible.
const backfillSnapshotWait = 5 * time.Second

// backfillSnapshot opens the snapshot a backfill copies from. Logical
// decoding can hand over a commit before new snapshots see it (the commit
// is in the WAL before the transaction leaves the proc array), so a
// snapshot that still shows the old schema is retried for a while; only a
// table that stays different is stale for good.
func (d *decoder) backfillSnapshot(ctx context.Context, bt *ddlTable) (pgx.Tx, error) {
	t := bt.t
	deadline := time.Now().Add(backfillSnapshotWait)
	for wait := 2 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		tx, err := d.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return nil, fmt.Errorf("backfill %s.%s: %w", t.spec.Schema, t.spec.Name, err)
		}
		reason, err := backfillStale(ctx, tx, bt)
		if err == nil && reason == "" {
			return tx, nil
		}
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if err != nil {
			return nil, fmt.Errorf("backfill %s.%s: %w", t.spec.Schema, t.spec.Name, err)
		}
		if time.Now().After(deadline) {
			return nil, &ResyncError{fmt.Sprintf("cannot backfill %s.%s: %s", t.spec.Schema, t.spec.Name, reason)}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// backfillStale says why t, as the schema change left it, is no longer
// what upstream has, or "".
func backfillStale(ctx context.Context, tx pgx.Tx, bt *ddlTable) (string, error) {
	t := bt.t
	rows, err := tx.Query(ctx, `SELECT n.nspname::text, c.relname::text, a.attname::text, a.attnum, a.atttypid
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE c.oid = $1`, t.oid)
	if err != nil {
		return "", err
	}
	type attr struct {
		pos int16
		typ uint32
	}
	have := map[string]attr{}
	var schema, name string
	for rows.Next() {
		var col string
		var a attr
		if err := rows.Scan(&schema, &name, &col, &a.pos, &a.typ); err != nil {
			return "", err
		}
		have[col] = a
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if schema != t.spec.Schema || name != t.spec.Name {
		return "the table was dropped or renamed since", nil
	}
	for i, c := range t.spec.Columns {
		if a, ok := have[c.Name]; !ok || int(a.pos) != c.Pos || a.typ != bt.typeOIDs[i] {
			return fmt.Sprintf("column %s changed since", c.Name), nil
		}
	}
	return "", nil
}
