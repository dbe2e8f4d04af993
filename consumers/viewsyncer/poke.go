package viewsyncer

import (
	"encoding/json"
	"fmt"
	"iter"
	"sort"

	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/consumers/zql"
)

// partSize is how many patches go in one pokePart, as zero-cache flushes.
const partSize = 100

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
// stays live to the end. Update.Finish checks it.
type pokeStream struct {
	conns []*conn
	// ended marks the connections that got the pokeEnd.
	ended   map[*conn]bool
	pokeID  string
	started bool
	// pending is the part being filled; the update marks the rows
	// streamed (cvrstore.Update.Stream).
	pending []rowPatch
	size    int
}

// newPokeStream returns the stream for u's connections at its starting
// version, nil when there are none (they get catch-ups).
func (g *group) newPokeStream(u *update) *pokeStream {
	var conns []*conn
	for _, c := range g.sortedConns() {
		if c.ready && c.hasBase == (u.From != "") && c.base == u.From && !c.isClosing() {
			conns = append(conns, c)
		}
	}
	if len(conns) == 0 {
		return nil
	}
	return &pokeStream{conns: conns, ended: map[*conn]bool{}}
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

// streamRow queues rec's put if it is one the update will send; a full
// part goes out at once. Rows of the internal tables become other patches
// and go at the end.
func (g *group) streamRow(u *update, id string, rec *cvrstore.Row) error {
	ps := u.stream
	if ps == nil || rec.Table == g.s.clientsTable || rec.Table == g.s.mutationsTable {
		return nil
	}
	if u.Streamed(rec) || !u.Put(id, rec) {
		return nil
	}
	u.Stream(rec)
	ps.pending = append(ps.pending, rowPatch{Op: "put", TableName: rec.Table, Value: rec.Value})
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
		ps.pokeID = u.V()
		var base *string
		if u.From != "" {
			base = &u.From
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

// poke sends each ready connection one poke to the CVR's version: the
// update's patches to those at its starting version, a catch-up from their
// cookie to the others, and an empty poke to a connection not yet poked
// (docs/protocol.md §7.2).
//
// Connections that were streamed the update's first parts get the rest:
// its other patches, then the pokeEnd.
func (g *group) poke(u *update) {
	v := g.cvr.Version
	ps := u.stream
	var rest error
	if ps.begun() {
		rest = g.sendPart(u)
	}
	var delta, remainder *pokeContent
	for _, c := range g.sortedConns() {
		if !c.ready || c.hasBase && c.base > v || c.hasBase && c.base == v && c.everPoked {
			continue
		}
		var pc *pokeContent
		begun := ps.begun() && ps.has(c)
		switch {
		case begun && rest != nil:
			continue // abandoned below
		case begun:
			if remainder == nil {
				remainder = g.pokeContent(u.Unstreamed())
			}
			pc = remainder
		case c.hasBase == (u.From != "") && c.base == u.From:
			if delta == nil {
				delta = g.pokeContent(u.Delta(nil))
			}
			pc = delta
		default:
			pc = g.pokeContent(g.cvr.Catchup(c.base, c.hasBase))
		}
		g.s.metrics.pokes.Inc()
		if err := c.sendPoke(c.base, c.hasBase, v, pc, begun); err != nil {
			c.fail(newProtocolError(kindInternal, "%v", err))
			continue
		}
		if begun {
			ps.ended[c] = true
		}
		c.base, c.hasBase, c.everPoked = v, true, true
	}
	ps.abandon()
}

// pokeContent is what one poke carries.
type pokeContent struct {
	desired map[string][]queryPatch
	got     []queryPatch
	rows    []rowPatch
	lmids   map[string]float64
	// mutations are mutationsPatch entries, encoded.
	mutations []json.RawMessage
}

func (pc *pokeContent) empty() bool {
	return len(pc.desired) == 0 && len(pc.got) == 0 && len(pc.rows) == 0 && len(pc.lmids) == 0 && len(pc.mutations) == 0
}

// pokeContent turns the CVR's patches into what a poke carries.
func (g *group) pokeContent(patches iter.Seq[cvrstore.Patch]) *pokeContent {
	pc := &pokeContent{}
	for p := range patches {
		op := "put"
		if p.Del {
			op = "del"
		}
		switch p.Kind {
		case cvrstore.DesirePatch:
			if pc.desired == nil {
				pc.desired = map[string][]queryPatch{}
			}
			pc.desired[p.ClientID] = append(pc.desired[p.ClientID], queryPatch{Op: op, Hash: p.Hash})
		case cvrstore.GotPatch:
			pc.got = append(pc.got, queryPatch{Op: op, Hash: p.Hash})
		case cvrstore.RowPatch:
			g.addRow(pc, p.Row)
		}
	}
	return pc
}

// addRow adds a row's patch; rows of the internal clients table become
// lastMutationIDChanges (docs/protocol.md §8).
func (g *group) addRow(pc *pokeContent, rec *cvrstore.Row) {
	if rec.Table == g.s.clientsTable {
		if rec.Refs == nil {
			return
		}
		if rec.Value.IsZero() {
			return
		}
		cid, _ := rec.Value.Get("clientID").(string)
		lmid, ok := rec.Value.Get("lastMutationID").(float64)
		if cgid, _ := rec.Value.Get("clientGroupID").(string); cid == "" || !ok || cgid != g.id {
			return
		}
		if pc.lmids == nil {
			pc.lmids = map[string]float64{}
		}
		pc.lmids[cid] = lmid
		return
	}
	if rec.Table == g.s.mutationsTable {
		if p := g.mutationPatch(rec); p != nil {
			pc.mutations = append(pc.mutations, p)
		}
		return
	}
	if rec.Refs == nil {
		pc.rows = append(pc.rows, rowPatch{Op: "del", TableName: rec.Table, ID: json.RawMessage(rec.Key)})
		return
	}
	pc.rows = append(pc.rows, rowPatch{Op: "put", TableName: rec.Table, Value: rec.Value})
}

// sendPoke queues one poke from base to cookie; begun is set when its
// pokeStart and first parts were streamed already (pokeStream).
func (c *conn) sendPoke(base string, hasBase bool, cookie string, pc *pokeContent, begun bool) error {
	var bc *string
	if hasBase {
		bc = &base
	}
	var frames [][]byte
	add := func(tag string, body any) error {
		b, err := encodeFrame(tag, body)
		if err != nil {
			return err
		}
		frames = append(frames, b)
		return nil
	}
	if !begun {
		if err := add("pokeStart", pokeStartBody{PokeID: cookie, BaseCookie: bc}); err != nil {
			return err
		}
	}
	if !pc.empty() {
		size := 0
		for _, part := range pc.parts(cookie) {
			b, err := encodePokePart(part, size)
			if err != nil {
				return err
			}
			size = len(b)
			frames = append(frames, b)
		}
	}
	if err := add("pokeEnd", pokeEndBody{PokeID: cookie, Cookie: cookie}); err != nil {
		return err
	}
	c.enqueue(frames...)
	return nil
}

// parts splits a poke's patches into parts of at most partSize patches:
// query patches first, then rows, as zero-cache orders them.
func (pc *pokeContent) parts(pokeID string) []*pokePartBody {
	var out []*pokePartBody
	cur := &pokePartBody{PokeID: pokeID, LastMutationIDChanges: pc.lmids, MutationsPatch: pc.mutations}
	n := len(pc.lmids) + len(pc.mutations)
	next := func() {
		if n >= partSize {
			out = append(out, cur)
			cur, n = &pokePartBody{PokeID: pokeID}, 0
		}
	}
	for _, q := range pc.got {
		next()
		cur.GotQueriesPatch = append(cur.GotQueriesPatch, q)
		n++
	}
	clients := make([]string, 0, len(pc.desired))
	for id := range pc.desired {
		clients = append(clients, id)
	}
	sort.Strings(clients)
	for _, id := range clients {
		for _, q := range pc.desired[id] {
			next()
			if cur.DesiredQueriesPatches == nil {
				cur.DesiredQueriesPatches = map[string][]queryPatch{}
			}
			cur.DesiredQueriesPatches[id] = append(cur.DesiredQueriesPatches[id], q)
			n++
		}
	}
	for _, r := range pc.rows {
		next()
		cur.RowsPatch = append(cur.RowsPatch, r)
		n++
	}
	if n > 0 || len(out) == 0 {
		out = append(out, cur)
	}
	return out
}
