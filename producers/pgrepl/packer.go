package pgrepl

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"

	"github.com/jetsync/jetsync/streams"
)

// Size bounds, in bytes, for what the JSON encoding adds around changes.
const (
	msgOverhead    = 64  // {"schema":,"table":,"parts":[]}
	partOverhead   = 160 // {"wm":,"prev":,"part":,"last":true,"commitTimeMs":,"changes":[]}
	changeOverhead = 48  // {"op":"truncate","new":{},"old":{}},
)

// msgLimit is what the changes of one message may add up to.
const msgLimit = streams.MaxMessageBytes - msgOverhead - 2*maxNameBytes

// maxChangeBytes is the most one change may add to a message: a bigger one
// travels as fragments.
const maxChangeBytes = msgLimit - partOverhead

// fragmentBytes is the escaped size of one fragment's piece, leaving room
// for the rest of a fragment change:
// {"op":"fragment","fragment":"","fragNum":N,"fragCount":N},
const fragmentBytes = maxChangeBytes - changeOverhead - 64

// maxNameBytes bounds an encoded schema or table name (63 bytes, each
// escaped to at most 6).
const maxNameBytes = 63*6 + 2

// tableRef is a published table as the packer sees it.
type tableRef struct {
	Schema, Name string
	subject      string
}

// outMsg is a message ready to publish.
type outMsg struct {
	subject string
	msg     streams.Message
	// confirm, when set, is the end LSN that can be confirmed upstream
	// once this message and every one before it are acked. A nil msg
	// carries only a confirm: a transaction with nothing to publish.
	confirm pglogrepl.LSN
	txs     int // transactions completed by this message
	changes int
}

func (m *outMsg) first() *streams.Part { return &m.msg.Parts[0] }
func (m *outMsg) last() *streams.Part  { return &m.msg.Parts[len(m.msg.Parts)-1] }

// packer turns a sequence of transactions into change messages. It is pure:
// no I/O, no clock.
//
// Complete single-part transactions on one table share a message until
// flush is called (the publisher calls it when it has no backlog), the
// table changes, or the message is full. A transaction too big for one
// message, or one that touches several tables, is split into parts, and
// where it splits depends only on its own changes: a restarted producer
// replays it and must find the same parts. So the first part of a split
// transaction never shares a message with earlier transactions.
type packer struct {
	shard streams.Shard
	// out collects emitted messages until the caller takes them.
	out []*outMsg
	// prev is the commit watermark of the last transaction packed.
	prev string

	// done holds complete transactions not yet emitted, all on doneTable.
	done       []streams.Part
	doneTable  *tableRef
	doneSize   int
	doneCount  int
	doneLSN    pglogrepl.LSN
	doneTxs    int
	doneChange int

	tx txState
}

type txState struct {
	active   bool
	wm       string
	num      int          // number of the current part
	part     streams.Part // the current part, not yet emitted
	table    *tableRef    // table of the current part; nil before the first change
	size     int          // of the current part's changes
	first    *tableRef    // table of the first change
	multi    bool         // some change went to a table other than first
	changes  int          // in the whole transaction
	commitMs float64
}

// begin opens a transaction with commit watermark wm.
func (p *packer) begin(wm string) {
	p.tx = txState{active: true, wm: wm, part: streams.Part{Watermark: wm, Prev: p.prev}}
}

// add appends a change to table t to the open transaction. size is
// changeSize(c). A change bigger than a message goes as fragments, each in
// a part of its own (the last may share its part with later changes when
// they fit, which they don't, being at the limit); where they cut depends on
// the change alone, so a restart finds the same parts.
func (p *packer) add(t *tableRef, c streams.Change, size int) {
	if size <= maxChangeBytes {
		p.addChange(t, c, size)
		return
	}
	frags, err := streams.Fragment(&c, fragmentBytes)
	if err != nil || len(frags) == 1 {
		// Its encoding fits after all (size only bounds it). Or it has
		// none, which Encode reports at publish.
		p.addChange(t, c, maxChangeBytes)
		return
	}
	for i, f := range frags {
		p.addChange(t, f, maxChangeBytes)
		if i < len(frags)-1 {
			p.emitPart(0)
		}
	}
}

func (p *packer) addChange(t *tableRef, c streams.Change, size int) {
	tx := &p.tx
	if tx.table != nil && (tx.table != t || size+tx.size > msgLimit-partOverhead || len(tx.part.Changes) >= streams.MaxChangesPerMessage) {
		p.flush()
		p.emitPart(0)
	}
	if len(p.done) > 0 && (p.doneTable != t || p.doneSize+tx.size+size+partOverhead > msgLimit ||
		p.doneCount+len(tx.part.Changes)+1 > streams.MaxChangesPerMessage) {
		p.flush()
	}
	if tx.first == nil {
		tx.first = t
	} else if t != tx.first {
		tx.multi = true
	}
	tx.table = t
	tx.part.Changes = append(tx.part.Changes, c)
	tx.size += size
	tx.changes++
}

// emitPart emits the current part in a message of its own and starts the
// next one. end is set when the part completes the transaction.
func (p *packer) emitPart(end pglogrepl.LSN) {
	tx := &p.tx
	m := &outMsg{
		subject: tx.table.subject,
		msg:     streams.Message{Schema: tx.table.Schema, Table: tx.table.Name, Parts: []streams.Part{tx.part}},
		changes: len(tx.part.Changes),
		confirm: end,
	}
	if end != 0 {
		m.txs = 1
	}
	p.emit(m)
	tx.num++
	tx.part = streams.Part{Watermark: tx.wm, Num: tx.num}
	tx.table = nil
	tx.size = 0
}

// commit completes the open transaction, whose end LSN is end.
func (p *packer) commit(commitMs float64, end pglogrepl.LSN) {
	tx := &p.tx
	tx.active = false
	switch {
	case tx.changes == 0:
		// Nothing to publish; its end can be confirmed once what came
		// before is acked.
		if len(p.done) > 0 {
			p.doneLSN = end
		} else {
			p.emit(&outMsg{confirm: end})
		}
		return
	case tx.num == 0:
		tx.part.Last = true
		tx.part.CommitTimeMs = commitMs
		if len(p.done) == 0 {
			p.doneTable = tx.table
		}
		p.done = append(p.done, tx.part)
		p.doneSize += tx.size + partOverhead
		p.doneCount += len(tx.part.Changes)
		p.doneLSN = end
		p.doneTxs++
		p.doneChange += tx.changes
	case !tx.multi:
		tx.part.Last = true
		tx.part.CommitTimeMs = commitMs
		p.emitPart(end)
	default:
		p.emitPart(0)
		p.emit(&outMsg{
			subject: p.shard.TxSubject(),
			msg: streams.Message{Parts: []streams.Part{{
				Watermark: tx.wm, Num: tx.num, Last: true, CommitTimeMs: commitMs, Changes: []streams.Change{},
			}}},
			confirm: end,
			txs:     1,
		})
	}
	p.prev = tx.wm
}

func (p *packer) emit(m *outMsg) { p.out = append(p.out, m) }

// take returns the messages emitted since the last take.
func (p *packer) take() []*outMsg {
	out := p.out
	p.out = nil
	return out
}

// flush emits the complete transactions held back for packing.
func (p *packer) flush() {
	if len(p.done) == 0 {
		return
	}
	m := &outMsg{
		subject: p.doneTable.subject,
		msg:     streams.Message{Schema: p.doneTable.Schema, Table: p.doneTable.Name, Parts: p.done},
		confirm: p.doneLSN,
		txs:     p.doneTxs,
		changes: p.doneChange,
	}
	p.done, p.doneTable, p.doneSize, p.doneCount, p.doneLSN, p.doneTxs, p.doneChange = nil, nil, 0, 0, 0, 0, 0
	p.emit(m)
}

// changeSize bounds the encoded size of c.
func changeSize(c *streams.Change) int {
	return changeOverhead + rowSize(c.New) + rowSize(c.Old)
}

func rowSize(r streams.Row) int {
	n := 0
	for k, v := range r {
		n += jsonStringSize(k) + rawJSONSize(v) + 2
	}
	return n
}

// rawJSONSize bounds the encoded size of a JSON value: encoding/json keeps
// it as is, except that it escapes <, > and & (to \u003c: 6 bytes) and
// U+2028 and U+2029 (3 bytes to 6).
func rawJSONSize(v json.RawMessage) int {
	n := len(v)
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '<', '>', '&':
			n += 5
		case 0xE2:
			if i+2 < len(v) && v[i+1] == 0x80 && (v[i+2] == 0xA8 || v[i+2] == 0xA9) {
				n += 3
			}
		}
	}
	return n
}

// jsonStringSize is the length of s encoded by encoding/json.
func jsonStringSize(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f':
				n += 2
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			n += 6
		} else {
			n += size
		}
		i += size
	}
	return n
}

// rawSize is a json.RawMessage's share of a backfill row.
func rawSize(v json.RawMessage) int { return rawJSONSize(v) + 1 }
