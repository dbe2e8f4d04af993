package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

// Degraded mode (replication.md §1, §8.4). Without the privilege to create
// event triggers, schema changes reach us only as pgoutput Relation
// messages, which say too little to replicate them (no defaults, no
// nullability, no indexes, and only from the table's next row change). As
// zero-cache does, each Relation message is instead compared with the table
// the replica was built from, and any difference forces a new initial sync.

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
	// specs caches lookups for the session; a nil spec is a table the
	// initial sync did not copy.
	specs map[[2]string]*streams.TableSpec
}

func newInitialSchema(stream jetstream.Stream, shard streams.Shard, resetSeq uint64, replicaVersion string) *initialSchema {
	return &initialSchema{
		stream: stream, shard: shard, resetSeq: resetSeq, replicaVersion: replicaVersion,
		specs: map[[2]string]*streams.TableSpec{},
	}
}

// table returns schema.name's spec in the initial sync, or nil when the
// initial sync did not copy it.
func (is *initialSchema) table(ctx context.Context, schema, name string) (*streams.TableSpec, error) {
	k := [2]string{schema, name}
	if spec, ok := is.specs[k]; ok {
		return spec, nil
	}
	subj := is.shard.TableSubject(schema, name)
	raw, err := is.stream.GetMsg(ctx, max(is.resetSeq, 1), jetstream.WithGetMsgSubject(subj))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		is.specs[k] = nil
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the initial schema of %s.%s: %w", schema, name, err)
	}
	m, err := streams.Decode(raw.Data)
	if err != nil {
		return nil, fmt.Errorf("read the initial schema of %s.%s: seq %d: %w", schema, name, raw.Sequence, err)
	}
	if len(m.Parts) == 0 || m.Parts[0].Watermark != is.replicaVersion || len(m.Parts[0].Changes) == 0 ||
		m.Parts[0].Changes[0].Op != streams.OpCreateTable || m.Parts[0].Changes[0].Spec == nil {
		// History aged out of the stream, or a spec that DDL replication
		// wrote before the triggers went away: neither is certain to be
		// what the replica holds now.
		return nil, &ResyncError{fmt.Sprintf("degraded mode (no event triggers): the initial schema of %s.%s is no longer in the change stream (seq %d)",
			schema, name, raw.Sequence)}
	}
	spec := m.Parts[0].Changes[0].Spec
	is.specs[k] = spec
	return spec, nil
}

// checkRelation returns a ResyncError when m differs from the table the
// replica was built from; types are m's column types.
func (is *initialSchema) checkRelation(ctx context.Context, m *pglogrepl.RelationMessage, types []pgvalue.Type) error {
	spec, err := is.table(ctx, m.Namespace, m.RelationName)
	if err != nil {
		return err
	}
	var diff string
	if spec == nil {
		diff = "not in the initial sync"
	} else {
		diff = relationDiff(spec, m, types)
	}
	if diff == "" {
		return nil
	}
	return &ResyncError{fmt.Sprintf("degraded mode (no event triggers): table %s.%s changed since the initial sync: %s",
		m.Namespace, m.RelationName, diff)}
}

// relationDiff describes how a Relation message differs from spec, or
// returns "". Like zero-cache it compares the published columns (names,
// order, types) and, under REPLICA IDENTITY DEFAULT, the key columns as a
// set: a Relation message lists key columns in column order, so the key's
// order is out of its reach. Nullability and defaults are not in the
// message.
func relationDiff(spec *streams.TableSpec, m *pglogrepl.RelationMessage, types []pgvalue.Type) string {
	names := make([]string, len(m.Columns))
	for i, c := range m.Columns {
		names[i] = c.Name
	}
	was := make([]string, len(spec.Columns))
	for i, c := range spec.Columns {
		was[i] = c.Name
	}
	if !slices.Equal(names, was) {
		return fmt.Sprintf("columns (%s) are now (%s)", strings.Join(was, ", "), strings.Join(names, ", "))
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
