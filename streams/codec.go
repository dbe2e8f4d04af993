package streams

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The change stream carries hundreds of thousands of rows a second through
// an initial sync, and encoding/json spent more CPU on them than SQLite did.
// This hand-written codec knows the message shape: it copies row values
// verbatim instead of compacting and re-validating them twice, and falls back
// to encoding/json only for the rare schema and reset payloads.

// appendMessage appends m's JSON to dst. Row values must be valid JSON, as
// every producer of them (pgvalue, Decode) guarantees.
func appendMessage(dst []byte, m *Message) ([]byte, error) {
	dst = append(dst, '{')
	if m.Schema != "" {
		dst = append(dst, `"schema":`...)
		dst = appendString(dst, m.Schema)
		dst = append(dst, ',')
	}
	if m.Table != "" {
		dst = append(dst, `"table":`...)
		dst = appendString(dst, m.Table)
		dst = append(dst, ',')
	}
	dst = append(dst, `"parts":[`...)
	var err error
	for i := range m.Parts {
		if i > 0 {
			dst = append(dst, ',')
		}
		if dst, err = appendPart(dst, &m.Parts[i]); err != nil {
			return nil, err
		}
	}
	return append(dst, "]}"...), nil
}

func appendPart(dst []byte, p *Part) ([]byte, error) {
	dst = append(dst, `{"wm":`...)
	dst = appendString(dst, p.Watermark)
	if p.Prev != "" {
		dst = append(dst, `,"prev":`...)
		dst = appendString(dst, p.Prev)
	}
	dst = append(dst, `,"part":`...)
	dst = strconv.AppendInt(dst, int64(p.Num), 10)
	if p.Last {
		dst = append(dst, `,"last":true`...)
	}
	if p.CommitTimeMs != 0 {
		if math.IsNaN(p.CommitTimeMs) || math.IsInf(p.CommitTimeMs, 0) {
			return nil, fmt.Errorf("%w: commitTimeMs %v", ErrMalformed, p.CommitTimeMs)
		}
		dst = append(dst, `,"commitTimeMs":`...)
		dst = strconv.AppendFloat(dst, p.CommitTimeMs, 'f', -1, 64)
	}
	dst = append(dst, `,"changes":[`...)
	var err error
	for i := range p.Changes {
		if i > 0 {
			dst = append(dst, ',')
		}
		if dst, err = appendChange(dst, &p.Changes[i]); err != nil {
			return nil, err
		}
	}
	return append(dst, "]}"...), nil
}

func appendChange(dst []byte, c *Change) ([]byte, error) {
	dst = append(dst, `{"op":`...)
	dst = appendString(dst, string(c.Op))
	if c.New != nil {
		dst = append(dst, `,"new":`...)
		dst = appendRow(dst, c.New)
	}
	if c.Old != nil {
		dst = append(dst, `,"old":`...)
		dst = appendRow(dst, c.Old)
	}
	for _, x := range []struct {
		key string
		v   any
		set bool
	}{{"reset", c.Reset, c.Reset != nil}, {"spec", c.Spec, c.Spec != nil}, {"index", c.Index, c.Index != nil}} {
		if !x.set {
			continue
		}
		b, err := json.Marshal(x.v)
		if err != nil {
			return nil, err
		}
		dst = append(dst, ',', '"')
		dst = append(dst, x.key...)
		dst = append(dst, '"', ':')
		dst = append(dst, b...)
	}
	if c.Columns != nil {
		dst = append(dst, `,"columns":[`...)
		for i, col := range c.Columns {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, col)
		}
		dst = append(dst, ']')
	}
	if c.Rows != nil {
		dst = append(dst, `,"rows":[`...)
		for i, r := range c.Rows {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '[')
			for j, v := range r {
				if j > 0 {
					dst = append(dst, ',')
				}
				dst = appendRaw(dst, v)
			}
			dst = append(dst, ']')
		}
		dst = append(dst, ']')
	}
	if c.Fragment != "" {
		dst = append(dst, `,"fragment":`...)
		dst = appendString(dst, c.Fragment)
	}
	if c.FragNum != 0 {
		dst = append(dst, `,"fragNum":`...)
		dst = strconv.AppendInt(dst, int64(c.FragNum), 10)
	}
	if c.FragCount != 0 {
		dst = append(dst, `,"fragCount":`...)
		dst = strconv.AppendInt(dst, int64(c.FragCount), 10)
	}
	return append(dst, '}'), nil
}

// appendRow writes a row with its keys sorted, so that a message's size,
// and so its chunking, is a pure function of its content.
func appendRow(dst []byte, r Row) []byte {
	var buf [32]string
	keys := buf[:0]
	for k := range r {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, k)
		dst = append(dst, ':')
		dst = appendRaw(dst, r[k])
	}
	return append(dst, '}')
}

func appendRaw(dst []byte, v json.RawMessage) []byte {
	if len(v) == 0 {
		return append(dst, "null"...)
	}
	return append(dst, v...)
}

const hexDigits = "0123456789abcdef"

// plainASCII marks the bytes a JSON string holds as they are.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func appendString(dst []byte, s string) []byte {
	return AppendJSONString(dst, s)
}

// AppendJSONString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as encoding/json does; "<", ">" and "&" stay as they are. Producers of
// change values (pgvalue) share it, so every string in the stream is escaped
// one way.
func AppendJSONString[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	dst = AppendJSONStringBody(dst, s)
	return append(dst, '"')
}

// AppendJSONStringBody is AppendJSONString without the quotes, for callers
// that build one string from pieces.
func AppendJSONStringBody[S ~string | ~[]byte](dst []byte, s S) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if plainASCII[c] {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := decodeRune(s[i:min(i+utf8.UTFMax, len(s))])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			start = i + size
		case r == '\u2028' || r == '\u2029':
			// Valid JSON, but they end lines in JavaScript source.
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			start = i + size
		}
		i += size
	}
	return append(dst, s[start:]...)
}

func decodeRune[S ~string | ~[]byte](s S) (rune, int) {
	var b [utf8.UTFMax]byte
	n := copy(b[:], s)
	return utf8.DecodeRune(b[:n])
}

// decoder parses one message. It is strict: any syntax error, or a value of
// the wrong type for a known key, fails the whole message.
type decoder struct {
	data []byte
	i    int
}

func (d *decoder) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrMalformed, d.i, fmt.Sprintf(format, args...))
}

func (d *decoder) ws() {
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (d *decoder) peek() byte {
	d.ws()
	if d.i >= len(d.data) {
		return 0
	}
	return d.data[d.i]
}

func (d *decoder) expect(c byte) error {
	if d.peek() != c {
		return d.errorf("want %q", c)
	}
	d.i++
	return nil
}

// object calls f for each key of an object, positioned at its value.
func (d *decoder) object(f func(key string) error) error {
	if err := d.expect('{'); err != nil {
		return err
	}
	if d.peek() == '}' {
		d.i++
		return nil
	}
	for {
		key, err := d.str()
		if err != nil {
			return err
		}
		if err := d.expect(':'); err != nil {
			return err
		}
		if err := f(key); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return d.errorf("want ',' or '}'")
		}
	}
}

// array calls f for each element, positioned at it.
func (d *decoder) array(f func() error) error {
	if err := d.expect('['); err != nil {
		return err
	}
	if d.peek() == ']' {
		d.i++
		return nil
	}
	for {
		if err := f(); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return d.errorf("want ',' or ']'")
		}
	}
}

// null consumes a null if there is one.
func (d *decoder) null() bool {
	if d.peek() == 'n' && d.i+4 <= len(d.data) && string(d.data[d.i:d.i+4]) == "null" {
		d.i += 4
		return true
	}
	return false
}

func (d *decoder) str() (string, error) {
	if d.peek() != '"' {
		return "", d.errorf("want a string")
	}
	start := d.i + 1
	// Fast path: no escapes and valid UTF-8.
	for j := start; j < len(d.data); j++ {
		c := d.data[j]
		if c == '"' {
			if s := d.data[start:j]; utf8.Valid(s) {
				d.i = j + 1
				return string(s), nil
			}
			break
		}
		if c == '\\' || c < 0x20 {
			break
		}
	}
	var out []byte
	j := start
	for {
		if j >= len(d.data) {
			d.i = j
			return "", d.errorf("unterminated string")
		}
		c := d.data[j]
		switch {
		case c == '"':
			d.i = j + 1
			return string(out), nil
		case c < 0x20:
			d.i = j
			return "", d.errorf("control character in string")
		case c == '\\':
			if j+1 >= len(d.data) {
				d.i = j
				return "", d.errorf("unterminated escape")
			}
			switch e := d.data[j+1]; e {
			case '"', '\\', '/':
				out = append(out, e)
				j += 2
			case 'b':
				out, j = append(out, '\b'), j+2
			case 'f':
				out, j = append(out, '\f'), j+2
			case 'n':
				out, j = append(out, '\n'), j+2
			case 'r':
				out, j = append(out, '\r'), j+2
			case 't':
				out, j = append(out, '\t'), j+2
			case 'u':
				r, ok := hex4(d.data, j+2)
				if !ok {
					d.i = j
					return "", d.errorf("bad \\u escape")
				}
				j += 6
				if utf16.IsSurrogate(r) {
					if r2, ok := hex4(d.data, j+2); ok && j+1 < len(d.data) && d.data[j] == '\\' && d.data[j+1] == 'u' {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							r = dec
							j += 6
						} else {
							r = utf8.RuneError
						}
					} else {
						r = utf8.RuneError
					}
				}
				out = utf8.AppendRune(out, r)
			default:
				d.i = j
				return "", d.errorf("bad escape")
			}
		case c < utf8.RuneSelf:
			out = append(out, c)
			j++
		default:
			r, size := utf8.DecodeRune(d.data[j:])
			if r == utf8.RuneError && size == 1 {
				out = append(out, "\uFFFD"...)
			} else {
				out = append(out, d.data[j:j+size]...)
			}
			j += size
		}
	}
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// raw validates one JSON value and returns its bytes, unchanged.
func (d *decoder) raw() (json.RawMessage, error) {
	d.ws()
	start := d.i
	if err := d.skip(0); err != nil {
		return nil, err
	}
	return json.RawMessage(d.data[start:d.i:d.i]), nil
}

// maxDepth bounds nesting so that a hostile message cannot exhaust the stack.
const maxDepth = 1000

func (d *decoder) skip(depth int) error {
	if depth > maxDepth {
		return d.errorf("nested too deeply")
	}
	switch c := d.peek(); {
	case c == '{':
		return d.object(func(string) error { return d.skip(depth + 1) })
	case c == '[':
		return d.array(func() error { return d.skip(depth + 1) })
	case c == '"':
		return d.skipString()
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	default:
		return d.errorf("want a value")
	}
}

func (d *decoder) skipString() error {
	j := d.i + 1
	for j < len(d.data) {
		c := d.data[j]
		switch {
		case c == '"':
			d.i = j + 1
			return nil
		case c == '\\':
			if j+1 >= len(d.data) {
				d.i = j
				return d.errorf("unterminated escape")
			}
			switch d.data[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if _, ok := hex4(d.data, j+2); !ok {
					d.i = j
					return d.errorf("bad \\u escape")
				}
				j += 6
			default:
				d.i = j
				return d.errorf("bad escape")
			}
		case c < 0x20:
			d.i = j
			return d.errorf("control character in string")
		default:
			j++
		}
	}
	d.i = j
	return d.errorf("unterminated string")
}

func (d *decoder) literal(lit string) error {
	if d.i+len(lit) > len(d.data) || string(d.data[d.i:d.i+len(lit)]) != lit {
		return d.errorf("want %s", lit)
	}
	d.i += len(lit)
	return nil
}

func (d *decoder) number() error {
	b, j := d.data, d.i
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case j < len(b) && b[j] >= '1' && b[j] <= '9':
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
	default:
		d.i = j
		return d.errorf("bad number")
	}
	if j < len(b) && b[j] == '.' {
		j++
		k := j
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		if j == k {
			d.i = j
			return d.errorf("bad number")
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		k := j
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		if j == k {
			d.i = j
			return d.errorf("bad number")
		}
	}
	d.i = j
	return nil
}

func (d *decoder) integer() (int, error) {
	d.ws()
	start := d.i
	if err := d.number(); err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(d.data[start:d.i]))
	if err != nil {
		return 0, d.errorf("want an integer")
	}
	return n, nil
}

func (d *decoder) float() (float64, error) {
	d.ws()
	start := d.i
	if err := d.number(); err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(string(d.data[start:d.i]), 64)
	if err != nil {
		return 0, d.errorf("bad number")
	}
	return f, nil
}

func (d *decoder) boolean() (bool, error) {
	switch d.peek() {
	case 't':
		return true, d.literal("true")
	case 'f':
		return false, d.literal("false")
	}
	return false, d.errorf("want a boolean")
}

func (d *decoder) message(m *Message) error {
	err := d.object(func(key string) error {
		var err error
		switch canonical(key, "schema", "table", "parts") {
		case "schema":
			m.Schema, err = d.str()
		case "table":
			m.Table, err = d.str()
		case "parts":
			m.Parts = m.Parts[:0]
			err = d.array(func() error {
				m.Parts = append(m.Parts, Part{})
				return d.part(&m.Parts[len(m.Parts)-1])
			})
		default:
			err = d.skip(0)
		}
		return err
	})
	if err != nil {
		return err
	}
	if d.peek() != 0 {
		return d.errorf("data after the message")
	}
	return nil
}

func (d *decoder) part(p *Part) error {
	return d.object(func(key string) error {
		var err error
		switch canonical(key, "wm", "prev", "part", "last", "commitTimeMs", "changes") {
		case "wm":
			p.Watermark, err = d.str()
		case "prev":
			p.Prev, err = d.str()
		case "part":
			p.Num, err = d.integer()
		case "last":
			p.Last, err = d.boolean()
		case "commitTimeMs":
			p.CommitTimeMs, err = d.float()
		case "changes":
			p.Changes = []Change{}
			err = d.array(func() error {
				p.Changes = append(p.Changes, Change{})
				return d.change(&p.Changes[len(p.Changes)-1])
			})
		default:
			err = d.skip(0)
		}
		return err
	})
}

func (d *decoder) change(c *Change) error {
	return d.object(func(key string) error {
		var err error
		switch canonical(key, "op", "new", "old", "reset", "spec", "index", "columns", "rows", "fragment", "fragNum", "fragCount") {
		case "op":
			var s string
			s, err = d.str()
			c.Op = Op(s)
		case "new":
			c.New, err = d.row()
		case "old":
			c.Old, err = d.row()
		case "reset":
			c.Reset = nil
			if !d.null() {
				c.Reset = new(Reset)
				err = d.embedded(c.Reset)
			}
		case "spec":
			c.Spec = nil
			if !d.null() {
				c.Spec = new(TableSpec)
				err = d.embedded(c.Spec)
			}
		case "index":
			c.Index = nil
			if !d.null() {
				c.Index = new(IndexSpec)
				err = d.embedded(c.Index)
			}
		case "columns":
			c.Columns = nil
			if !d.null() {
				c.Columns = []string{}
				err = d.array(func() error {
					s, err := d.str()
					c.Columns = append(c.Columns, s)
					return err
				})
			}
		case "rows":
			c.Rows = nil
			if !d.null() {
				c.Rows = [][]json.RawMessage{}
				err = d.array(func() error {
					row := make([]json.RawMessage, 0, len(c.Columns))
					err := d.array(func() error {
						v, err := d.raw()
						row = append(row, v)
						return err
					})
					c.Rows = append(c.Rows, row)
					return err
				})
			}
		case "fragment":
			c.Fragment, err = d.str()
		case "fragNum":
			c.FragNum, err = d.integer()
		case "fragCount":
			c.FragCount, err = d.integer()
		default:
			err = d.skip(0)
		}
		return err
	})
}

// canonical returns the known key that key names, matching case-insensitively
// as encoding/json does, so that both read any message alike.
func canonical(key string, known ...string) string {
	for _, k := range known {
		if key == k {
			return k
		}
	}
	for _, k := range known {
		if strings.EqualFold(key, k) {
			return k
		}
	}
	return key
}

func (d *decoder) row() (Row, error) {
	if d.null() {
		return nil, nil
	}
	r := Row{}
	err := d.object(func(key string) error {
		v, err := d.raw()
		r[key] = v
		return err
	})
	return r, err
}

// embedded decodes a rare sub-object with encoding/json.
func (d *decoder) embedded(v any) error {
	raw, err := d.raw()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}
