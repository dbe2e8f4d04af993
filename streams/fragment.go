package streams

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf8"
)

// A row can hold up to 1 GB per value, far past a message. Such a change
// travels as fragments: its own JSON encoding, cut into pieces that each fit
// a message as a JSON string. Cutting the encoding rather than the row keeps
// one scheme for every op, and a consumer needs nothing but the codec to
// join them.

// minFragmentBytes is the least budget Fragment accepts: one rune, escaped.
const minFragmentBytes = 6 * utf8.UTFMax

// Fragment cuts c's encoding into OpFragment changes whose Fragment, encoded
// as a JSON string, takes at most max bytes each. Pieces end on rune
// boundaries, so each is valid UTF-8 and travels unchanged. The cut is a
// pure function of c and max: a producer that sends a change again cuts it
// the same way. A change whose encoding fits comes back as one fragment.
func Fragment(c *Change, max int) ([]Change, error) {
	if max < minFragmentBytes {
		return nil, fmt.Errorf("fragment budget %d is under %d bytes", max, minFragmentBytes)
	}
	if c.Op == OpFragment {
		return nil, errors.New("fragment of a fragment")
	}
	enc, err := appendChange(nil, c)
	if err != nil {
		return nil, err
	}
	// Invalid UTF-8 can sit only inside strings of raw values, where the
	// rest of the stream would read it as U+FFFD anyway.
	if !utf8.Valid(enc) {
		enc = bytes.ToValidUTF8(enc, []byte("\uFFFD"))
	}
	var pieces []string
	start, size := 0, 0
	for i := 0; i < len(enc); {
		r, n := utf8.DecodeRune(enc[i:])
		e := escapedSize(enc[i], r, n)
		if size+e > max {
			pieces = append(pieces, string(enc[start:i]))
			start, size = i, 0
		}
		size += e
		i += n
	}
	pieces = append(pieces, string(enc[start:]))
	out := make([]Change, len(pieces))
	for i, p := range pieces {
		out[i] = Change{Op: OpFragment, Fragment: p, FragNum: i, FragCount: len(pieces)}
	}
	return out, nil
}

// escapedSize is what AppendJSONStringBody writes for the rune r of n bytes
// starting with byte b.
func escapedSize(b byte, r rune, n int) int {
	switch {
	case b < utf8.RuneSelf && plainASCII[b]:
		return 1
	case b == '"' || b == '\\' || b == '\n' || b == '\r' || b == '\t':
		return 2
	case b < utf8.RuneSelf:
		return 6
	case r == utf8.RuneError && n == 1, r == '\u2028', r == '\u2029':
		return 6
	default:
		return n
	}
}

// Assembler joins fragments back into the changes they were cut from. Feed
// it every part of a table or tx subject in stream order; its memory is
// bounded by the change being joined.
type Assembler struct {
	schema, table, wm string
	next, count       int
	buf               []byte
}

// Pending reports whether a change is partly joined.
func (a *Assembler) Pending() bool { return a.count > 0 }

// Reset drops a partly joined change, as when a consumer starts over.
func (a *Assembler) Reset() { *a = Assembler{} }

// Part returns p's changes with each fragmented change joined: a fragment
// that completes one yields the change, the others nothing. p is a part of
// the message on schema.table (both empty on the tx subject). Without
// fragments, it returns p.Changes itself. A fragment out of sequence, any
// other change or another table's part while a change is partly joined, or a
// transaction that ends mid-change is an ErrMalformed error; the Assembler is
// then reset.
func (a *Assembler) Part(schema, table string, p *Part) ([]Change, error) {
	if !a.Pending() && !hasFragment(p) {
		return p.Changes, nil
	}
	out, err := a.part(schema, table, p)
	if err != nil {
		a.Reset()
		return nil, fmt.Errorf("%w: %s:%d: %v", ErrMalformed, p.Watermark, p.Num, err)
	}
	return out, nil
}

func hasFragment(p *Part) bool {
	for i := range p.Changes {
		if p.Changes[i].Op == OpFragment {
			return true
		}
	}
	return false
}

func (a *Assembler) part(schema, table string, p *Part) ([]Change, error) {
	if a.Pending() && (schema != a.schema || table != a.table || p.Watermark != a.wm) {
		return nil, fmt.Errorf("part on %s.%s while fragment %d of %d on %s.%s (%s) is due",
			schema, table, a.next, a.count, a.schema, a.table, a.wm)
	}
	out := make([]Change, 0, len(p.Changes))
	for i := range p.Changes {
		c := &p.Changes[i]
		if c.Op != OpFragment {
			if a.Pending() {
				return nil, fmt.Errorf("%s change while fragment %d of %d is due", c.Op, a.next, a.count)
			}
			out = append(out, *c)
			continue
		}
		switch {
		case c.FragNum == 0 && a.Pending():
			return nil, fmt.Errorf("a new fragmented change while fragment %d of %d is due", a.next, a.count)
		case c.FragNum == 0:
			*a = Assembler{schema: schema, table: table, wm: p.Watermark, count: c.FragCount}
		case !a.Pending():
			return nil, fmt.Errorf("fragment %d of %d without the ones before it", c.FragNum, c.FragCount)
		case c.FragNum != a.next || c.FragCount != a.count:
			return nil, fmt.Errorf("fragment %d of %d where %d of %d is due", c.FragNum, c.FragCount, a.next, a.count)
		}
		a.buf = append(a.buf, c.Fragment...)
		a.next++
		if a.next < a.count {
			continue
		}
		joined, err := decodeJoined(a.buf, table != "")
		if err != nil {
			return nil, err
		}
		out = append(out, joined)
		// joined's values alias buf: it is not reused.
		a.Reset()
	}
	if p.Last && a.Pending() {
		return nil, fmt.Errorf("transaction ends at fragment %d of %d", a.next, a.count)
	}
	return out, nil
}

func decodeJoined(data []byte, onTable bool) (Change, error) {
	var c Change
	d := decoder{data: data}
	if err := d.change(&c); err != nil {
		return c, fmt.Errorf("joined fragments: %v", err)
	}
	if d.peek() != 0 {
		return c, errors.New("joined fragments: data after the change")
	}
	if c.Op == OpFragment || c.Op == OpReset {
		return c, fmt.Errorf("joined fragments hold a %s", c.Op)
	}
	if err := c.validate(onTable); err != nil {
		return c, fmt.Errorf("joined fragments: %v", err)
	}
	return c, nil
}
