package streams

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// Headers carried by every change message, so that a consumer can route and
// check order without decoding the body.
const (
	// HeaderMsgID is JetStream's dedup key: "<watermark>:<part>" of the
	// message's first part.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderWatermark is the commit watermark of the message's last part.
	HeaderWatermark = "Jetsync-Watermark"
	// HeaderPart is the part number of the message's last part.
	HeaderPart = "Jetsync-Part"
	// HeaderCommit is set, to the watermark, when the message's last part
	// completes its transaction.
	HeaderCommit = "Jetsync-Commit"
	// HeaderReplicaVersion names the initial sync the message builds on.
	// It changes only with a reset.
	HeaderReplicaVersion = "Jetsync-Replica-Version"
)

// MaxMessageBytes bounds an encoded change message; the producer starts a new
// part before a message would grow past it, and a change bigger than that on
// its own travels as fragments (OpFragment). It sits well under NATS's default
// 1 MiB max payload. Chunking must be a pure function of the change sequence
// (a restarted producer skips the parts already in the stream), so this is a
// constant, not a setting.
const MaxMessageBytes = 512 << 10

// MaxChangesPerMessage bounds the changes in one message, for the same
// reason.
const MaxChangesPerMessage = 4096

// Op names a change.
type Op string

// Row changes.
const (
	OpInsert   Op = "insert"
	OpUpdate   Op = "update"
	OpDelete   Op = "delete"
	OpTruncate Op = "truncate"
)

// Initial sync and schema.
const (
	// OpReset opens an initial sync: a consumer drops everything it built
	// and starts over at Reset.ReplicaVersion.
	OpReset Op = "reset"
	// OpCreateTable creates a table (initial sync, or DDL).
	OpCreateTable Op = "create-table"
	// OpCreateIndex creates an index.
	OpCreateIndex Op = "create-index"
	// OpBackfill carries many rows of the initial copy, column-wise. A
	// schema change can be followed by one too, in its transaction: then it
	// re-sends whole rows of a table that joined the publications or gained
	// a column whose existing values only Postgres can compute.
	OpBackfill Op = "backfill"
)

// Schema changes (DDL), on the subject of the table they change. Each
// carries the table's spec as it is after the change, except drop-table and
// drop-index. A create-table of a table the consumer already has brings it
// to the spec (the producer sends one when a primary key changes).
const (
	// OpDropTable drops the table, or removes it from the publications.
	OpDropTable Op = "drop-table"
	// OpRenameTable renames the table (or moves it to another schema) to
	// Spec's schema and name. It travels on the old name's subject.
	OpRenameTable Op = "rename-table"
	// OpAddColumn adds column Columns[0]. New, when set, holds the value
	// every existing row has in it (a constant default); otherwise existing
	// rows hold null, or a backfill follows.
	OpAddColumn Op = "add-column"
	// OpUpdateColumn renames column Columns[0] to Columns[1] and/or
	// changes its type; existing values keep what they were.
	OpUpdateColumn Op = "update-column"
	// OpDropColumn drops column Columns[0].
	OpDropColumn Op = "drop-column"
	// OpDropIndex drops the index named by Index.
	OpDropIndex Op = "drop-index"
)

// OpFragment carries a piece of a change too big for one message: Fragment
// holds bytes of the change's JSON encoding, fragment FragNum of FragCount.
// The fragments of a change are consecutive changes of one transaction on
// one table, each in a part of its own; joined in order they decode as the
// change itself (see Assembler).
const OpFragment Op = "fragment"

// Message is the body of one change message. All of it belongs to one table
// (Schema, Table), or to none when it is on the tx subject. It holds either
// one part of a transaction, or several complete transactions in commit
// order: the producer packs small transactions on one table together while
// the server is busy, so a small transaction costs at most one message.
type Message struct {
	Schema string `json:"schema,omitempty"`
	Table  string `json:"table,omitempty"`
	Parts  []Part `json:"parts"`
}

// Part is a transaction, or a part of one. Parts of a transaction are
// numbered from 0 and all carry its commit watermark; the one with Last set
// completes it. A transaction that spans subjects ends with an empty Last part
// on the tx subject.
type Part struct {
	Watermark string `json:"wm"`
	// Prev is the commit watermark of the transaction before this one, set
	// on part 0. A consumer whose own watermark differs has missed history.
	Prev         string   `json:"prev,omitempty"`
	Num          int      `json:"part"`
	Last         bool     `json:"last,omitempty"`
	CommitTimeMs float64  `json:"commitTimeMs,omitempty"`
	Changes      []Change `json:"changes"`
}

// Row maps column names to values in the client's JSON form
// (docs/replica.md §4): numbers, strings, booleans, null, and
// parsed JSON for json, jsonb and array columns.
type Row map[string]json.RawMessage

// Change is one entry of a Part.
type Change struct {
	Op Op `json:"op"`
	// New is the inserted or updated row. Unchanged TOASTed columns are left
	// out of an update, so a consumer must keep their old values.
	New Row `json:"new,omitempty"`
	// Old is the key of a deleted row; on an update, the old key when the key
	// changed, or the whole old row under REPLICA IDENTITY FULL.
	Old Row `json:"old,omitempty"`

	Reset *Reset     `json:"reset,omitempty"`
	Spec  *TableSpec `json:"spec,omitempty"`
	Index *IndexSpec `json:"index,omitempty"`

	// Columns and Rows carry a backfill: each row holds Columns' values in
	// order.
	Columns []string            `json:"columns,omitempty"`
	Rows    [][]json.RawMessage `json:"rows,omitempty"`

	// Fragment, FragNum and FragCount carry a fragment (OpFragment):
	// a piece of the encoded change, numbered from 0 of FragCount.
	Fragment  string `json:"fragment,omitempty"`
	FragNum   int    `json:"fragNum,omitempty"`
	FragCount int    `json:"fragCount,omitempty"`
}

// Reset describes the initial sync that follows it.
type Reset struct {
	ReplicaVersion string   `json:"replicaVersion"`
	Publications   []string `json:"publications"`
	// SystemID is the upstream cluster's system identifier and Slot the
	// replication slot; a producer that finds either changed resyncs.
	SystemID string `json:"systemID"`
	Slot     string `json:"slot"`
	Reason   string `json:"reason,omitempty"`
}

// TableSpec describes a published table.
type TableSpec struct {
	// OID is the table's upstream pg_class OID: a table dropped and created
	// again under the same name has a new one. 0 when unknown (messages
	// written before the field existed).
	OID        uint32       `json:"oid,omitempty"`
	Schema     string       `json:"schema"`
	Name       string       `json:"name"`
	Columns    []ColumnSpec `json:"columns"`
	PrimaryKey []string     `json:"primaryKey,omitempty"`
}

// ColumnSpec describes a published column.
type ColumnSpec struct {
	Name string `json:"name"`
	Pos  int    `json:"pos"`
	// DataType is the upstream type name without modifiers ("int8",
	// "varchar", "mood", "int4[]").
	DataType string `json:"dataType"`
	// Kind is how the value travels: one of the Kind* constants.
	Kind                   Kind `json:"kind"`
	NotNull                bool `json:"notNull,omitempty"`
	Enum                   bool `json:"enum,omitempty"`
	Array                  bool `json:"array,omitempty"`
	CharacterMaximumLength int  `json:"characterMaximumLength,omitempty"`
}

// Kind is the client-facing type of a column (docs/replica.md §4).
type Kind string

// Kinds.
const (
	KindNumber  Kind = "number"
	KindString  Kind = "string"
	KindBoolean Kind = "boolean"
	KindJSON    Kind = "json"
	// KindUnsupported columns (bytea, interval, ...) carry the Postgres text
	// form as a string and are never synced to clients.
	KindUnsupported Kind = "unsupported"
)

// IndexSpec describes an index on a published table.
type IndexSpec struct {
	Schema    string   `json:"schema"`
	TableName string   `json:"tableName"`
	Name      string   `json:"name"`
	Unique    bool     `json:"unique"`
	Columns   []string `json:"columns"`
	Desc      []bool   `json:"desc,omitempty"`
}

// ErrMalformed reports a change message that does not follow this contract.
var ErrMalformed = errors.New("malformed change message")

// Encode returns the wire form of m.
func Encode(m *Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return appendMessage(make([]byte, 0, 512), m)
}

// AppendEncode is Encode appending to dst, for callers that reuse buffers.
func AppendEncode(dst []byte, m *Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return appendMessage(dst, m)
}

// Decode parses and validates a change message body. Row values in the
// result alias data.
func Decode(data []byte) (*Message, error) {
	var m Message
	d := decoder{data: data}
	if err := d.message(&m); err != nil {
		return nil, err
	}
	if m.Parts == nil {
		return nil, fmt.Errorf("%w: no parts", ErrMalformed)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate checks m's internal order: parts continue one another, and every
// change is well formed.
func (m *Message) Validate() error {
	if len(m.Parts) == 0 {
		return fmt.Errorf("%w: no parts", ErrMalformed)
	}
	for i := range m.Parts {
		p := &m.Parts[i]
		if _, err := ParseLexi(p.Watermark); err != nil {
			return fmt.Errorf("%w: part %d: %v", ErrMalformed, i, err)
		}
		if p.Num < 0 {
			return fmt.Errorf("%w: part %d: negative number", ErrMalformed, i)
		}
		// Several parts in one message are complete transactions; a
		// transaction that spans messages has one part in each.
		if len(m.Parts) > 1 && (p.Num != 0 || !p.Last) {
			return fmt.Errorf("%w: part %d (%s:%d) is not a complete transaction in a packed message", ErrMalformed, i, p.Watermark, p.Num)
		}
		if i > 0 && p.Watermark <= m.Parts[i-1].Watermark {
			return fmt.Errorf("%w: part %d (%s) does not follow %s", ErrMalformed, i, p.Watermark, m.Parts[i-1].Watermark)
		}
		for j := range p.Changes {
			if err := p.Changes[j].validate(m.Table != ""); err != nil {
				return fmt.Errorf("%w: part %d change %d: %v", ErrMalformed, i, j, err)
			}
		}
	}
	return nil
}

func (c *Change) validate(onTable bool) error {
	needTable := func() error {
		if !onTable {
			return fmt.Errorf("%s outside a table message", c.Op)
		}
		return nil
	}
	if c.Op != OpFragment && (c.Fragment != "" || c.FragNum != 0 || c.FragCount != 0) {
		return fmt.Errorf("%s with fragment fields", c.Op)
	}
	switch c.Op {
	case OpFragment:
		if c.Fragment == "" {
			return errors.New("empty fragment")
		}
		if c.FragNum < 0 || c.FragNum >= c.FragCount {
			return fmt.Errorf("fragment %d of %d", c.FragNum, c.FragCount)
		}
		return needTable()
	case OpInsert:
		if c.New == nil {
			return errors.New("insert without new")
		}
		return needTable()
	case OpUpdate:
		if c.New == nil {
			return errors.New("update without new")
		}
		return needTable()
	case OpDelete:
		if c.Old == nil {
			return errors.New("delete without old")
		}
		return needTable()
	case OpTruncate:
		return needTable()
	case OpReset:
		if c.Reset == nil {
			return errors.New("reset without reset")
		}
		if _, err := ParseLexi(c.Reset.ReplicaVersion); err != nil {
			return err
		}
		return nil
	case OpCreateTable:
		if c.Spec == nil || c.Spec.Name == "" || len(c.Spec.Columns) == 0 {
			return errors.New("create-table without a spec")
		}
		return needTable()
	case OpCreateIndex:
		if c.Index == nil || c.Index.Name == "" || len(c.Index.Columns) == 0 {
			return errors.New("create-index without a spec")
		}
		return needTable()
	case OpDropTable:
		return needTable()
	case OpRenameTable:
		if err := c.validSpec(); err != nil {
			return err
		}
		return needTable()
	case OpAddColumn, OpDropColumn, OpUpdateColumn:
		if err := c.validSpec(); err != nil {
			return err
		}
		want := 1
		if c.Op == OpUpdateColumn {
			want = 2
		}
		if len(c.Columns) != want {
			return fmt.Errorf("%s with %d columns, want %d", c.Op, len(c.Columns), want)
		}
		has := c.Spec.HasColumn(c.Columns[want-1])
		if has == (c.Op == OpDropColumn) {
			return fmt.Errorf("%s of %q: spec disagrees", c.Op, c.Columns[want-1])
		}
		if c.New != nil {
			if _, ok := c.New[c.Columns[0]]; c.Op != OpAddColumn || len(c.New) != 1 || !ok {
				return fmt.Errorf("%s: new must hold the added column alone", c.Op)
			}
		}
		return needTable()
	case OpDropIndex:
		if c.Index == nil || c.Index.Name == "" {
			return errors.New("drop-index without an index")
		}
		return needTable()
	case OpBackfill:
		for i, r := range c.Rows {
			if len(r) != len(c.Columns) {
				return fmt.Errorf("backfill row %d has %d values for %d columns", i, len(r), len(c.Columns))
			}
		}
		return needTable()
	default:
		return fmt.Errorf("unknown op %q", c.Op)
	}
}

func (c *Change) validSpec() error {
	if c.Spec == nil || c.Spec.Name == "" || len(c.Spec.Columns) == 0 {
		return fmt.Errorf("%s without a spec", c.Op)
	}
	return nil
}

// HasColumn reports whether s has a column named name.
func (s *TableSpec) HasColumn(name string) bool {
	for i := range s.Columns {
		if s.Columns[i].Name == name {
			return true
		}
	}
	return false
}

// MsgID is the Nats-Msg-Id of a message whose first part is (wm, part).
func MsgID(wm string, part int) string { return wm + ":" + strconv.Itoa(part) }

// Value converts a client-form JSON value into what a SQLite replica stores:
// nil, int64, float64, string, or, for a JSON object or array, its text.
// Booleans become 0 or 1. Values of json and array columns (Kind json) are
// stored as their raw JSON text instead, so that a JSON string stays quoted.
func Value(raw json.RawMessage) (any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	switch c := raw[0]; {
	case c == 'n':
		return nil, nil
	case c == 't':
		return int64(1), nil
	case c == 'f':
		return int64(0), nil
	case c == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		return s, nil
	case c == '{' || c == '[':
		return string(raw), nil
	default:
		// A fraction or exponent is no integer: spare the failed ParseInt,
		// whose error allocates.
		if bytes.IndexAny(raw, ".eE") < 0 {
			if i, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
				return i, nil
			}
		}
		f, err := strconv.ParseFloat(string(raw), 64)
		// Like zero-cache's Number(text), a numeric beyond float64 becomes ±Inf.
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, fmt.Errorf("%w: bad number %q", ErrMalformed, raw)
		}
		return f, nil
	}
}

// Header returns the headers of a change message holding parts, which every
// publisher must set: the dedup ID, the watermark and part of the last part,
// the commit mark, and the replica version.
func Header(parts []Part, replicaVersion string) nats.Header {
	h := nats.Header{}
	if len(parts) == 0 {
		return h
	}
	first, last := parts[0], parts[len(parts)-1]
	h.Set(HeaderMsgID, MsgID(first.Watermark, first.Num))
	h.Set(HeaderWatermark, last.Watermark)
	h.Set(HeaderPart, strconv.Itoa(last.Num))
	if last.Last {
		h.Set(HeaderCommit, last.Watermark)
	}
	if replicaVersion != "" {
		h.Set(HeaderReplicaVersion, replicaVersion)
	}
	return h
}

// NewMsg encodes m as a message of shard s, on its table's subject (or the
// tx subject) with its headers.
func NewMsg(s Shard, m *Message, replicaVersion string) (*nats.Msg, error) {
	data, err := Encode(m)
	if err != nil {
		return nil, err
	}
	subj := s.TxSubject()
	if m.Table != "" {
		subj = s.TableSubject(m.Schema, m.Table)
	}
	return &nats.Msg{Subject: subj, Data: data, Header: Header(m.Parts, replicaVersion)}, nil
}
