package viewsyncer

import (
	"encoding/json"
	"fmt"

	"github.com/jetsync/jetsync/consumers/zql"
)

// rowPatch is one entry of a pokePart's rowsPatch: a put carries the row's
// value, a del its key (canonical JSON).
type rowPatch struct {
	Op        string
	TableName string
	Value     zql.RowValue
	ID        json.RawMessage
}

// pokePartHead is a pokePart's fields other than its rows.
type pokePartHead struct {
	PokeID                string                  `json:"pokeID"`
	LastMutationIDChanges map[string]float64      `json:"lastMutationIDChanges,omitempty"`
	DesiredQueriesPatches map[string][]queryPatch `json:"desiredQueriesPatches,omitempty"`
	GotQueriesPatch       []queryPatch            `json:"gotQueriesPatch,omitempty"`
	MutationsPatch        []json.RawMessage       `json:"mutationsPatch,omitempty"`
}

// encodePokePart encodes a pokePart frame as encodeFrame would, but writes
// the rows by hand: a whole-table hydration pokes 100k of them, and
// reflection over each row's map dominated its encoding.
func encodePokePart(p *pokePartBody, size int) ([]byte, error) {
	head, err := json.Marshal(pokePartHead{p.PokeID, p.LastMutationIDChanges, p.DesiredQueriesPatches, p.GotQueriesPatch, p.MutationsPatch})
	if err != nil {
		return nil, fmt.Errorf("encode pokePart: %w", err)
	}
	b := make([]byte, 0, len(head)+size+32)
	b = append(b, `["pokePart",`...)
	if len(p.RowsPatch) == 0 {
		b = append(b, head...)
		return append(b, ']'), nil
	}
	b = append(b, head[:len(head)-1]...)
	b = append(b, `,"rowsPatch":[`...)
	for i := range p.RowsPatch {
		r := &p.RowsPatch[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"op":"`...)
		b = append(b, r.Op...)
		b = append(b, `","tableName":`...)
		if b, err = appendString(b, r.TableName); err != nil {
			return nil, err
		}
		switch {
		case !r.Value.IsZero():
			b = append(b, `,"value":`...)
			if b, err = r.Value.AppendJSON(b); err != nil {
				return nil, fmt.Errorf("encode pokePart: %w", err)
			}
		case r.ID != nil:
			b = append(b, `,"id":`...)
			b = append(b, r.ID...)
		}
		b = append(b, '}')
	}
	return append(b, "]}]"...), nil
}

// appendString appends s as encoding/json quotes it.
func appendString(b []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			j, err := json.Marshal(s)
			return append(b, j...), err
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), nil
}

// pokeStream sends an update's row puts to the connections at its starting
// version while the update is still being built (a hydration yields rows
// as it reads them), as zero-cache streams poke parts: a client parses
// them while the server works. The pokeEnd, which carries the cookie, goes
// only after the update is durable (group.flush), and a client applies a
// poke only at its pokeEnd; a poke that cannot end closes its connections
// (abandon), and a client discards a poke cut off by a disconnect. So no
// client holds a cookie the store cannot reproduce.
//
// Only puts are streamed, and only once they are final: within one update
// each pipeline moves its own references once, so a row that one put in
// stays live to the end. finishRows checks it.
type pokeStream struct {
	conns []*conn
	// ended marks the connections that got the pokeEnd.
	ended   map[*conn]bool
	pokeID  string
	started bool
	// pending is the part being filled; sent holds the IDs of the rows
	// in parts sent.
	pending []rowPatch
	sent    map[string]struct{}
	size    int
}

// newPokeStream returns the stream for u's connections at its starting
// version, nil when there are none (they get catch-ups).
func (g *group) newPokeStream(u *update) *pokeStream {
	var conns []*conn
	for _, c := range g.sortedConns() {
		if c.ready && c.hasBase == (u.from != "") && c.base == u.from && !c.isClosing() {
			conns = append(conns, c)
		}
	}
	if len(conns) == 0 {
		return nil
	}
	return &pokeStream{conns: conns, ended: map[*conn]bool{}, sent: map[string]struct{}{}}
}

func (ps *pokeStream) begun() bool { return ps != nil && ps.started }

func (ps *pokeStream) has(c *conn) bool {
	for _, x := range ps.conns {
		if x == c {
			return true
		}
	}
	return false
}

// sentRows is the IDs of the rows streamed, or about to be.
func (ps *pokeStream) sentRows() map[string]struct{} {
	if ps == nil {
		return nil
	}
	return ps.sent
}

// streamRow queues rec's put if it is one the update will send; a full
// part goes out at once. Rows of the internal tables become other patches
// and go at the end.
func (g *group) streamRow(u *update, id string, rec *rowRecord) error {
	ps := u.stream
	if ps == nil || rec.table == g.s.clientsTable || rec.table == g.s.mutationsTable {
		return nil
	}
	if _, ok := ps.sent[id]; ok || !putNeeded(u.rowStart[id], rec, u.compare) {
		return nil
	}
	ps.sent[id] = struct{}{}
	ps.pending = append(ps.pending, rowPatch{Op: "put", TableName: rec.table, Value: rec.value})
	if len(ps.pending) < partSize {
		return nil
	}
	return g.sendPart(u)
}

// sendPart sends the pending rows as one pokePart, after the pokeStart if
// none went yet. The update's version is then fixed: a put bumps it
// anyway.
func (g *group) sendPart(u *update) error {
	ps := u.stream
	if len(ps.pending) == 0 {
		return nil
	}
	if !ps.started {
		ps.pokeID = u.v()
		var base *string
		if u.from != "" {
			base = &u.from
		}
		b, err := encodeFrame("pokeStart", pokeStartBody{PokeID: ps.pokeID, BaseCookie: base})
		if err != nil {
			return err
		}
		ps.started = true
		for _, c := range ps.conns {
			c.enqueue(b)
		}
	}
	b, err := encodePokePart(&pokePartBody{PokeID: ps.pokeID, RowsPatch: ps.pending}, ps.size)
	if err != nil {
		return err
	}
	ps.size = len(b)
	for _, c := range ps.conns {
		c.enqueue(b)
	}
	ps.pending = ps.pending[:0]
	return nil
}

// abandon closes, with Rehome, the connections that were sent the start
// of a poke they will not get the end of.
func (ps *pokeStream) abandon() {
	if !ps.begun() {
		return
	}
	for _, c := range ps.conns {
		if !ps.ended[c] {
			c.ready = false
			c.fail(newProtocolError(kindRehome, "Reconnect required"))
		}
	}
	ps.conns = nil
}
