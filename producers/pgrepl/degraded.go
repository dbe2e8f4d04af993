package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

// Degraded mode (README, "Bad conditions"). Without the privilege to create
// event triggers, schema changes reach us only as pgoutput Relation
// messages, which say too little to replicate them (no defaults, no
// nullability, no indexes, and only from the table's next row change). As
// zero-cache does, each Relation message is instead compared with the table
// the replica was built from, and the whole published schema, read again,
// with every table of that initial sync: any difference forces a new
// initial sync.

// initialSchema finds the table specs that the current replica version was
// built from. It reads them from the change stream rather than keeping a
// copy: the initial sync's create-table is the first message on each
// table's subject from the reset on, and in degraded mode no later message
// changes a spec. So the check survives restarts, and describes exactly
// what consumers built.
type initialSchema struct {
	stream         jetstream.Stream
	shard          streams.Shard
	resetSeq       uint64
	replicaVersion string
	pubs           []string
	// specs holds every table of the initial sync, read once a session.
	specs map[[2]string]*streams.TableSpec
}

func newInitialSchema(stream jetstream.Stream, shard streams.Shard, resetSeq uint64, replicaVersion string, pubs []string) *initialSchema {
	return &initialSchema{stream: stream, shard: shard, resetSeq: resetSeq, replicaVersion: replicaVersion, pubs: pubs}
}

// tables returns every table the initial sync copied, by schema and name.
// Rather than reading the whole initial sync, backfills and all, it lists
// the stream's subjects and reads each one's first message from the reset
// on: a subject with none holds only history before it.
func (is *initialSchema) tables(ctx context.Context) (map[[2]string]*streams.TableSpec, error) {
	if is.specs != nil {
		return is.specs, nil
	}
	info, err := is.stream.Info(ctx, jetstream.WithSubjectFilter(is.shard.ChangesFilter()))
	if err != nil {
		return nil, fmt.Errorf("read the initial schema: list subjects: %w", err)
	}
	subjects := slices.Sorted(maps.Keys(info.State.Subjects))
	specs := make(map[[2]string]*streams.TableSpec, len(subjects))
	for _, subj := range subjects {
		if subj == is.shard.TxSubject() {
			continue
		}
		raw, err := is.stream.GetMsg(ctx, max(is.resetSeq, 1), jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read the initial schema: %s: %w", subj, err)
		}
		m, err := streams.Decode(raw.Data)
		if err != nil {
			return nil, fmt.Errorf("read the initial schema: seq %d: %w", raw.Sequence, err)
		}
		if len(m.Parts) == 0 || m.Parts[0].Watermark != is.replicaVersion || len(m.Parts[0].Changes) == 0 ||
			m.Parts[0].Changes[0].Op != streams.OpCreateTable || m.Parts[0].Changes[0].Spec == nil {
			// History aged out of the stream, or a spec that DDL replication
			// wrote before the triggers went away: neither is certain to be
			// what the replica holds now.
			return nil, &ResyncError{fmt.Sprintf("degraded mode (no event triggers): the initial schema of %s.%s is no longer in the change stream (seq %d)",
				m.Schema, m.Table, raw.Sequence)}
		}
		spec := m.Parts[0].Changes[0].Spec
		specs[[2]string{spec.Schema, spec.Name}] = spec
	}
	is.specs = specs
	return specs, nil
}

// checkRelation returns a ResyncError when m differs from the table the
// replica was built from (types are m's column types), or when the
// published schema, read now through conn, differs from the initial sync's.
// The Relation message is checked too, for it may describe a schema that
// was changed and changed back since.
func (is *initialSchema) checkRelation(ctx context.Context, conn *pgx.Conn, reg *pgvalue.Registry,
	m *pglogrepl.RelationMessage, types []pgvalue.Type,
) error {
	specs, err := is.tables(ctx)
	if err != nil {
		return err
	}
	diff := "not in the initial sync"
	if spec := specs[[2]string{m.Namespace, m.RelationName}]; spec != nil {
		diff = relationDiff(spec, m, types)
	}
	if diff != "" {
		return changedError(m.Namespace, m.RelationName, diff)
	}
	now, err := readPublished(ctx, conn, reg, is.pubs)
	if err != nil {
		return err
	}
	if t, diff := schemaDiff(specs, now); diff != "" {
		return changedError(t[0], t[1], diff)
	}
	return nil
}

func changedError(schema, name, diff string) error {
	return &ResyncError{fmt.Sprintf("degraded mode (no event triggers): table %s.%s changed since the initial sync: %s",
		schema, name, diff)}
}

// readPublished reads the published schema as readSchema does for an
// initial sync, so that an unchanged schema compares equal, in one snapshot.
func readPublished(ctx context.Context, conn *pgx.Conn, reg *pgvalue.Registry, pubs []string) ([]*publishedTable, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("read the published schema: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	return readSchema(ctx, tx.Conn(), reg, pubs)
}

// schemaDiff returns the first table in which the published schema now
// differs from the initial sync's, and how, or "". As zero-cache's
// comparison of published schemas it covers the set of tables, their OIDs,
// primary keys (in key order), and columns (names, positions, types,
// nullability); unlike it, it names what changed.
func schemaDiff(initial map[[2]string]*streams.TableSpec, now []*publishedTable) ([2]string, string) {
	seen := make(map[[2]string]bool, len(now))
	for _, t := range now {
		k := [2]string{t.spec.Schema, t.spec.Name}
		seen[k] = true
		was := initial[k]
		if was == nil {
			for _, s := range initial {
				if s.OID != 0 && s.OID == t.oid {
					return [2]string{s.Schema, s.Name}, fmt.Sprintf("renamed to %s.%s", t.spec.Schema, t.spec.Name)
				}
			}
			return k, "published, but not in the initial sync"
		}
		if d := tableDiff(was, &t.spec); d != "" {
			return k, d
		}
	}
	var gone [][2]string
	for k := range initial {
		if !seen[k] {
			gone = append(gone, k)
		}
	}
	if len(gone) > 0 {
		slices.SortFunc(gone, func(a, b [2]string) int { return strings.Compare(a[0]+"."+a[1], b[0]+"."+b[1]) })
		return gone[0], "dropped, or no longer published"
	}
	return [2]string{}, ""
}

// tableDiff describes how now differs from was, or returns "". An OID of 0
// is a spec written before specs had one: it matches any.
func tableDiff(was, now *streams.TableSpec) string {
	if was.OID != 0 && was.OID != now.OID {
		return fmt.Sprintf("dropped and created again (oid %d, was %d)", now.OID, was.OID)
	}
	if d := columnsDiff(was.Columns, columnNames(now.Columns)); d != "" {
		return d
	}
	for i := range now.Columns {
		w, n := &was.Columns[i], &now.Columns[i]
		switch {
		case w.Pos != n.Pos:
			return fmt.Sprintf("column %s was dropped and added again (position %d, was %d)", n.Name, n.Pos, w.Pos)
		case w.DataType != n.DataType || w.CharacterMaximumLength != n.CharacterMaximumLength:
			return fmt.Sprintf("column %s changed type from %s to %s", n.Name,
				typeString(w.DataType, w.CharacterMaximumLength), typeString(n.DataType, n.CharacterMaximumLength))
		case !w.NotNull && n.NotNull:
			return fmt.Sprintf("column %s is now NOT NULL", n.Name)
		case w.NotNull && !n.NotNull:
			return fmt.Sprintf("column %s is now nullable", n.Name)
		}
	}
	if !slices.Equal(was.PrimaryKey, now.PrimaryKey) {
		return fmt.Sprintf("primary key (%s) is now (%s)", strings.Join(was.PrimaryKey, ", "), strings.Join(now.PrimaryKey, ", "))
	}
	return ""
}

func columnNames(cols []streams.ColumnSpec) []string {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.Name
	}
	return names
}

// columnsDiff describes a change in the names or order of was's columns.
func columnsDiff(was []streams.ColumnSpec, names []string) string {
	if w := columnNames(was); !slices.Equal(names, w) {
		return fmt.Sprintf("columns (%s) are now (%s)", strings.Join(w, ", "), strings.Join(names, ", "))
	}
	return ""
}

// relationDiff describes how a Relation message differs from spec, or
// returns "". Like zero-cache it compares the table's OID (unless spec
// predates OIDs), the published columns (names, order, types) and, under
// REPLICA IDENTITY DEFAULT, the key columns as a set: a Relation message
// lists key columns in column order, so the key's order is out of its
// reach. Nullability and defaults are not in the message.
func relationDiff(spec *streams.TableSpec, m *pglogrepl.RelationMessage, types []pgvalue.Type) string {
	if spec.OID != 0 && spec.OID != m.RelationID {
		return fmt.Sprintf("dropped and created again (oid %d, was %d)", m.RelationID, spec.OID)
	}
	names := make([]string, len(m.Columns))
	for i, c := range m.Columns {
		names[i] = c.Name
	}
	if d := columnsDiff(spec.Columns, names); d != "" {
		return d
	}
	for i, c := range m.Columns {
		sc, t := &spec.Columns[i], types[i]
		maxLen := 0
		if (t.Name == "varchar" || t.Name == "bpchar") && c.TypeModifier > 4 {
			maxLen = int(c.TypeModifier - 4)
		}
		if t.Name != sc.DataType || t.Kind != sc.Kind || t.Array != sc.Array || maxLen != sc.CharacterMaximumLength {
			return fmt.Sprintf("column %s changed type from %s to %s", c.Name,
				typeString(sc.DataType, sc.CharacterMaximumLength), typeString(t.Name, maxLen))
		}
	}
	if m.ReplicaIdentity == 'd' {
		var key []string
		for _, c := range m.Columns {
			if c.Flags&1 != 0 {
				key = append(key, c.Name)
			}
		}
		if !sameSet(key, spec.PrimaryKey) {
			return fmt.Sprintf("primary key (%s) is now (%s)", strings.Join(spec.PrimaryKey, ", "), strings.Join(key, ", "))
		}
	}
	return ""
}

func typeString(name string, maxLen int) string {
	if maxLen > 0 {
		return fmt.Sprintf("%s(%d)", name, maxLen)
	}
	return name
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
