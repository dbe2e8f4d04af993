package cvrstore

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/jetsync/jetsync/streams"
)

// encodeUpdate is streams.EncodeCVRUpdate, byte for byte, faster where an
// update is large: a hydration writes one put-row event per row, and
// encoding/json's reflection over 100k of them, then decoding them back
// for the local projection, cost more than the rest of the publish. It
// writes put-row events whose strings need no escaping by hand, and
// returns each message also as the streams.CVRMessage a reader would
// decode from it, so that the writer applies what it published without
// decoding it: events written by hand are used as they are (their text
// round-trips exactly), and only the others are decoded from their bytes.
func encodeUpdate(hdr streams.CVRMessage, events []streams.CVREvent, maxBytes int) ([][]byte, []*streams.CVRMessage, error) {
	if maxBytes <= 0 {
		maxBytes = streams.CVRMaxMessageBytes
	}
	if !plain(hdr.Group) || !plain(hdr.Owner) || !plain(hdr.Version) {
		// Rare: let the contract encode it, and decode what it wrote.
		return encodeSlow(hdr, events, maxBytes)
	}
	if err := streams.CheckGroupID(hdr.Group); err != nil {
		return nil, nil, fmt.Errorf("%w: cvr message: %v", streams.ErrMalformed, err)
	}
	if hdr.Part < 0 {
		return nil, nil, fmt.Errorf("%w: cvr message: part %d", streams.ErrMalformed, hdr.Part)
	}
	// One buffer holds every event's encoding; ends[i] is where event i's
	// ends. decoded holds, by index, what decoding yields for the events
	// not written by hand: few (the instance and config records), so only
	// the parts holding them are copied to apply them.
	buf := make([]byte, 0, encodedSizeHint(events))
	ends := make([]int, len(events))
	var decoded map[int]streams.CVREvent
	for i := range events {
		e := &events[i]
		if e.Op == streams.CVROpSnapshot && i > 0 {
			return nil, nil, fmt.Errorf("%w: cvr event %d: snapshot must open an update", streams.ErrMalformed, i)
		}
		start := len(buf)
		var ok bool
		if e.Op == streams.CVROpPutRow || e.Op == streams.CVROpPutRows {
			if err := e.Validate(); err != nil {
				return nil, nil, fmt.Errorf("%w: cvr event %d: %v", streams.ErrMalformed, i, err)
			}
			if e.Op == streams.CVROpPutRow {
				buf, ok = appendRowEvent(buf, e.Row)
			} else {
				buf, ok = appendRowsEvent(buf, e.Rows)
			}
		}
		if !ok {
			buf = buf[:start]
			b, err := encodeEvent(hdr.Group, e)
			if err != nil {
				return nil, nil, fmt.Errorf("encode cvr event %d (%s): %w", i, e.Op, err)
			}
			buf = append(buf, b...)
			var dec streams.CVREvent
			if err := json.Unmarshal(b, &dec); err != nil {
				return nil, nil, fmt.Errorf("encode cvr event %d (%s): %w", i, e.Op, err)
			}
			if decoded == nil {
				decoded = map[int]streams.CVREvent{}
			}
			decoded[i] = dec
		}
		ends[i] = len(buf)
	}
	ev := func(i int) []byte {
		if i == 0 {
			return buf[:ends[0]]
		}
		return buf[ends[i-1]:ends[i]]
	}

	var out [][]byte
	var msgs []*streams.CVRMessage
	part := func(from, to int, last bool) {
		n := 0
		if to > from {
			n = ends[to-1] - ends[from] + len(ev(from)) + (to - from)
		}
		b := appendHeader(make([]byte, 0, 160+n), hdr, len(out), last)
		for i := from; i < to; i++ {
			if i > from {
				b = append(b, ',')
			}
			b = append(b, ev(i)...)
		}
		out = append(out, append(b, "]}"...))
		m := hdr
		m.Part, m.Last, m.Events = len(msgs), last, events[from:to:to]
		for i, dec := range decoded {
			if i >= from && i < to {
				if &m.Events[0] == &events[from] {
					m.Events = slices.Clone(m.Events)
				}
				m.Events[i-from] = dec
			}
		}
		msgs = append(msgs, &m)
	}
	// As the contract reckons it: a header with part 0 and its closing
	// "]}", plus the digits of the largest part number possible.
	overhead := len(appendHeader(nil, hdr, 0, false)) + len("]}") + len(strconv.Itoa(len(events)))
	start, size := 0, overhead
	for i := range events {
		n := len(ev(i))
		if overhead+n > maxBytes {
			return nil, nil, fmt.Errorf("%w: cvr event %d (%s) is %d bytes, over %d", streams.ErrMalformed, i, events[i].Op, n, maxBytes)
		}
		if i > start && size+1+n > maxBytes {
			part(start, i, false)
			start, size = i, overhead
		}
		size += 1 + n
	}
	part(start, len(events), true)
	return out, msgs, nil
}

// encodeSlow encodes with the contract and decodes what it wrote.
func encodeSlow(hdr streams.CVRMessage, events []streams.CVREvent, maxBytes int) ([][]byte, []*streams.CVRMessage, error) {
	out, err := streams.EncodeCVRUpdate(hdr, events, maxBytes)
	if err != nil {
		return nil, nil, err
	}
	msgs := make([]*streams.CVRMessage, len(out))
	for i, b := range out {
		if msgs[i], err = streams.DecodeCVR(b); err != nil {
			return nil, nil, err
		}
	}
	return out, msgs, nil
}

// encodeEvent encodes one event as the contract does, checking it as the
// contract does.
func encodeEvent(group string, e *streams.CVREvent) ([]byte, error) {
	if _, err := streams.EncodeCVR(&streams.CVRMessage{Group: group, Events: []streams.CVREvent{*e}}); err != nil {
		return nil, err
	}
	return json.Marshal(e)
}

// appendRowsEvent appends r's put-rows event as encoding/json writes it,
// or reports false if a string or a key would need escaping or compacting.
func appendRowsEvent(b []byte, r *streams.CVRRows) ([]byte, bool) {
	if !plain(r.Table) || !plain(r.PatchVersion) {
		return b, false
	}
	b = append(b, `{"op":"put-rows","rows":{"table":"`...)
	b = append(b, r.Table...)
	b = append(b, '"')
	b = appendOptString(b, "patchVersion", r.PatchVersion)
	b = append(b, `,"refs":`...)
	b, ok := appendRefs(b, r.Refs)
	if !ok {
		return b, false
	}
	b = append(b, `,"keys":[`...)
	for i, k := range r.Keys {
		if !plainJSON(k) {
			return b, false
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, k...)
	}
	b = append(b, `],"rowVersions":[`...)
	for i, v := range r.RowVersions {
		if !plain(v) {
			return b, false
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(append(append(b, '"'), v...), '"')
	}
	return append(b, "]}}"...), true
}

// appendRowEvent appends r's put-row event as encoding/json writes it, or
// reports false if a string or the key would need escaping or compacting.
func appendRowEvent(b []byte, r *streams.CVRRow) ([]byte, bool) {
	if !plain(r.Table) || !plain(r.RowVersion) || !plain(r.PatchVersion) || !plainJSON(r.Key) {
		return b, false
	}
	b = append(b, `{"op":"put-row","row":{"table":"`...)
	b = append(b, r.Table...)
	b = append(b, `","key":`...)
	b = append(b, r.Key...)
	b = appendOptString(b, "rowVersion", r.RowVersion)
	b = appendOptString(b, "patchVersion", r.PatchVersion)
	b = append(b, `,"refs":`...)
	b, ok := appendRefs(b, r.Refs)
	if !ok {
		return b, false
	}
	return append(b, "}}"...), true
}

// encodedSizeHint is about what events encode to, for the buffer's first
// size: a put-row is ~145 bytes, and a put-rows ~30 bytes a row beyond a
// put-row's (bench/cvr prints the bytes per row).
func encodedSizeHint(events []streams.CVREvent) int {
	n := 64
	for i := range events {
		n += 160
		if r := events[i].Rows; r != nil {
			n += 32 * len(r.Keys)
		}
	}
	return n
}

// appendOptString appends the plain string field name as encoding/json
// writes it with omitempty: nothing when v is empty.
func appendOptString(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	b = append(append(append(b, `,"`...), name...), `":"`...)
	return append(append(b, v...), '"')
}

// appendRefs appends a row's refs as encoding/json writes a map[string]int
// (keys sorted, nil as null), or reports false if a key needs escaping.
func appendRefs(b []byte, refs map[string]int) ([]byte, bool) {
	if refs == nil {
		return append(b, "null"...), true
	}
	b = append(b, '{')
	var one [1]string
	keys := one[:0]
	for k := range refs {
		if !plain(k) {
			return b, false
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, `":`...)
		b = strconv.AppendInt(b, int64(refs[k]), 10)
	}
	return append(b, '}'), true
}

// appendHeader appends the opening of a message up to its events' '[', as
// streams.EncodeCVRUpdate writes it.
func appendHeader(b []byte, h streams.CVRMessage, part int, last bool) []byte {
	b = append(b, `{"group":"`...)
	b = append(b, h.Group...)
	b = append(b, '"')
	if h.Owner != "" {
		b = append(b, `,"owner":"`...)
		b = append(b, h.Owner...)
		b = append(b, '"')
	}
	b = append(b, `,"version":"`...)
	b = append(b, h.Version...)
	b = append(b, `","prev":`...)
	b = strconv.AppendUint(b, h.Prev, 10)
	b = append(b, `,"part":`...)
	b = strconv.AppendInt(b, int64(part), 10)
	b = append(b, `,"last":`...)
	b = strconv.AppendBool(b, last)
	return append(b, `,"events":[`...)
}

// plain reports whether encoding/json writes s between quotes unchanged:
// printable ASCII other than the characters it escapes.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// plainJSON reports whether encoding/json writes the valid JSON b as a
// RawMessage unchanged: it is compact (no whitespace at all, so none
// outside strings) and holds nothing HTML-escaped or beyond ASCII.
func plainJSON(b []byte) bool {
	for _, c := range b {
		if c <= 0x20 || c >= 0x7f || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
