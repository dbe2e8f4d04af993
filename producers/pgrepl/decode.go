package pgrepl

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/progress"
	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

var jsonNull = json.RawMessage("null")

// arena hands out JSON values from shared chunks, so a row costs a few
// allocations rather than one per value. Values stay valid after later
// appends: a full chunk is replaced, never reused.
type arena struct{ buf []byte }

const arenaChunk = 64 << 10

func (a *arena) appendJSON(t pgvalue.Type, text []byte) (json.RawMessage, error) {
	if need := 2*len(text) + 64; cap(a.buf)-len(a.buf) < need {
		a.buf = make([]byte, 0, max(arenaChunk, need))
	}
	start := len(a.buf)
	var err error
	a.buf, err = pgvalue.AppendJSON(a.buf, t, text)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(a.buf[start:len(a.buf):len(a.buf)]), nil
}

// relation is a table as pgoutput described it last.
type relation struct {
	ref  *tableRef
	cols []relColumn
}

type relColumn struct {
	name string
	typ  pgvalue.Type
	key  bool
}

// event is what the replication reader hands the publisher.
type event struct {
	kind   eventKind
	wm     string        // begin, commit
	end    pglogrepl.LSN // commit: the transaction's end LSN; keepalive: server WAL end
	ms     float64       // commit time
	table  *tableRef
	change streams.Change
	size   int
}

type eventKind uint8

const (
	evBegin eventKind = iota + 1
	evChange
	evCommit
	evKeepalive
)

// decoder turns pgoutput messages into events.
type decoder struct {
	shard  streams.Shard
	names  names
	reg    *pgvalue.Registry
	conn   *pgx.Conn // regular connection, to load unknown types
	rels   map[uint32]*relation
	tables map[[2]string]*tableRef
	arena  arena
	log    *slog.Logger

	// resumeWM and resumePartial are the position's: transactions before
	// resumeWM are in the stream already, and so is resumeWM unless
	// resumePartial. A schema change in them needs no backfill.
	resumeWM      string
	resumePartial bool
	wm            string // of the transaction being decoded
	skipping      bool   // it is in the stream already

	// initial is set in degraded mode: Relation messages are checked
	// against it.
	initial *initialSchema

	// progress and progressEvery report a backfill's progress.
	progress      *progress.Metrics
	progressEvery time.Duration
}

func newDecoder(shard streams.Shard, reg *pgvalue.Registry, conn *pgx.Conn, log *slog.Logger) *decoder {
	return &decoder{
		shard: shard, names: newNames(shard), reg: reg, conn: conn, log: log,
		rels: make(map[uint32]*relation), tables: make(map[[2]string]*tableRef),
	}
}

// table returns the one tableRef of schema.name: the packer tells tables
// apart by pointer.
func (d *decoder) table(schema, name string) *tableRef {
	k := [2]string{schema, name}
	t, ok := d.tables[k]
	if !ok {
		t = &tableRef{Schema: schema, Name: name, subject: d.shard.TableSubject(schema, name)}
		d.tables[k] = t
	}
	return t
}

// parsePgoutput parses one pgoutput message. pglogrepl indexes its input
// without bounds checks, so a malformed message would panic inside it: that
// becomes an error here.
func parsePgoutput(data []byte) (m pglogrepl.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("malformed pgoutput message (%d bytes): %v", len(data), r)
		}
	}()
	return pglogrepl.Parse(data)
}

// decode handles one pgoutput message, calling emit for each event.
func (d *decoder) decode(ctx context.Context, m pglogrepl.Message, emit func(event) error) error {
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		d.wm = streams.Lexi(uint64(m.FinalLSN))
		d.skipping = inStream(d.wm, d.resumeWM, d.resumePartial)
		return emit(event{kind: evBegin, wm: d.wm})
	case *pglogrepl.CommitMessage:
		return emit(event{
			kind: evCommit, wm: streams.Lexi(uint64(m.CommitLSN)), end: m.TransactionEndLSN,
			ms: float64(m.CommitTime.UnixMicro()) / 1000,
		})
	case *pglogrepl.RelationMessage:
		return d.relation(ctx, m)
	case *pglogrepl.InsertMessage:
		rel, err := d.rel(m.RelationID)
		if err != nil {
			return err
		}
		row, err := d.row(rel, m.Tuple, false, nil)
		if err != nil {
			return err
		}
		return d.emitChange(emit, rel, streams.Change{Op: streams.OpInsert, New: row})
	case *pglogrepl.UpdateMessage:
		rel, err := d.rel(m.RelationID)
		if err != nil {
			return err
		}
		var old streams.Row
		if m.OldTuple != nil {
			// 'K': the key changed, and only key columns are set; 'O': the
			// whole old row, under REPLICA IDENTITY FULL.
			if old, err = d.row(rel, m.OldTuple, m.OldTupleType == pglogrepl.UpdateMessageTupleTypeKey, nil); err != nil {
				return err
			}
		}
		var fill streams.Row
		if m.OldTupleType == pglogrepl.UpdateMessageTupleTypeOld {
			fill = old
		}
		row, err := d.row(rel, m.NewTuple, false, fill)
		if err != nil {
			return err
		}
		return d.emitChange(emit, rel, streams.Change{Op: streams.OpUpdate, New: row, Old: old})
	case *pglogrepl.DeleteMessage:
		rel, err := d.rel(m.RelationID)
		if err != nil {
			return err
		}
		if m.OldTuple == nil {
			return fmt.Errorf("delete on %s.%s without old tuple", rel.ref.Schema, rel.ref.Name)
		}
		old, err := d.row(rel, m.OldTuple, m.OldTupleType == pglogrepl.DeleteMessageTupleTypeKey, nil)
		if err != nil {
			return err
		}
		return d.emitChange(emit, rel, streams.Change{Op: streams.OpDelete, Old: old})
	case *pglogrepl.TruncateMessage:
		for _, id := range m.RelationIDs {
			rel, err := d.rel(id)
			if err != nil {
				return err
			}
			if err := d.emitChange(emit, rel, streams.Change{Op: streams.OpTruncate}); err != nil {
				return err
			}
		}
		return nil
	case *pglogrepl.LogicalDecodingMessage:
		if m.Transactional && m.Prefix == d.names.ddlPrefix() {
			return d.ddl(ctx, m.Content, emit)
		}
		return nil
	default:
		// Origin and Type messages carry nothing we use.
		return nil
	}
}

func (d *decoder) emitChange(emit func(event) error, rel *relation, c streams.Change) error {
	return emit(event{kind: evChange, table: rel.ref, change: c, size: changeSize(&c)})
}

func (d *decoder) rel(id uint32) (*relation, error) {
	r, ok := d.rels[id]
	if !ok {
		return nil, fmt.Errorf("change to relation %d before its Relation message", id)
	}
	return r, nil
}

func (d *decoder) relation(ctx context.Context, m *pglogrepl.RelationMessage) error {
	var unknown []uint32
	for _, c := range m.Columns {
		if _, ok := d.reg.Lookup(c.DataType); !ok {
			unknown = append(unknown, c.DataType)
		}
	}
	if len(unknown) > 0 {
		if err := d.reg.Load(ctx, d.conn, unknown...); err != nil {
			return fmt.Errorf("load types of %s.%s: %w", m.Namespace, m.RelationName, err)
		}
	}
	r := &relation{ref: d.table(m.Namespace, m.RelationName), cols: make([]relColumn, len(m.Columns))}
	for i, c := range m.Columns {
		r.cols[i] = relColumn{name: c.Name, typ: lookupType(d.reg, c.DataType, ""), key: c.Flags&1 != 0}
	}
	if d.initial != nil {
		types := make([]pgvalue.Type, len(r.cols))
		for i := range r.cols {
			types[i] = r.cols[i].typ
		}
		if err := d.initial.checkRelation(ctx, d.conn, d.reg, m, types); err != nil {
			return err
		}
	}
	d.rels[m.RelationID] = r
	return nil
}

// lookupType finds oid's Type; one the registry can't describe travels as
// an unsupported string.
func lookupType(reg *pgvalue.Registry, oid uint32, name string) pgvalue.Type {
	if t, ok := reg.Lookup(oid); ok {
		return t
	}
	return pgvalue.Type{OID: oid, Name: name, Kind: streams.KindUnsupported}
}

// row converts a tuple. keyOnly keeps the key columns only; fill supplies
// the values of unchanged TOASTed columns, which are otherwise left out.
func (d *decoder) row(rel *relation, tup *pglogrepl.TupleData, keyOnly bool, fill streams.Row) (streams.Row, error) {
	if tup == nil {
		return nil, nil
	}
	if len(tup.Columns) != len(rel.cols) {
		return nil, fmt.Errorf("%s.%s: tuple has %d columns, relation %d", rel.ref.Schema, rel.ref.Name, len(tup.Columns), len(rel.cols))
	}
	row := make(streams.Row, len(rel.cols))
	for i, c := range tup.Columns {
		col := &rel.cols[i]
		if keyOnly && !col.key {
			continue
		}
		switch c.DataType {
		case pglogrepl.TupleDataTypeNull:
			row[col.name] = jsonNull
		case pglogrepl.TupleDataTypeToast:
			if v, ok := fill[col.name]; ok {
				row[col.name] = v
			}
		case pglogrepl.TupleDataTypeText:
			v, err := d.arena.appendJSON(col.typ, c.Data)
			if err != nil {
				return nil, fmt.Errorf("%s.%s.%s: %w", rel.ref.Schema, rel.ref.Name, col.name, err)
			}
			row[col.name] = v
		default:
			return nil, fmt.Errorf("%s.%s.%s: unexpected tuple data type %q", rel.ref.Schema, rel.ref.Name, col.name, c.DataType)
		}
	}
	return row, nil
}
