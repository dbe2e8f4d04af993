package pgvalue

import (
	"bytes"
	"unicode/utf8"
)

// maxArrayDepth bounds nesting; Postgres allows 6 dimensions (MAXDIM).
const maxArrayDepth = 6

// appendArray appends a Postgres array literal ("{1,2,NULL}",
// `{"a b","c\"d"}`, "{{1,2},{3,4}}", "[0:1]={7,8}", "{}") as a JSON array,
// nested for each dimension, converting each element by the element type.
func appendArray(dst []byte, t Type, text []byte) ([]byte, error) {
	elem := arrayElem(t)
	n := len(dst)
	p := arrayParser{elem: elem, delim: elem.delim, s: text}
	if p.delim == 0 {
		p.delim = ','
	}
	if len(p.s) > 0 && p.s[0] == '[' {
		// Dimension decoration of an array not based at 1: the bounds
		// carry nothing for JSON.
		i := bytes.IndexByte(p.s, '=')
		if i < 0 {
			return dst[:n], syntaxError(t, text)
		}
		p.s = p.s[i+1:]
	}
	p.skipSpace()
	dst, ok := p.array(dst, 0)
	p.skipSpace()
	if p.err != nil {
		return dst[:n], p.err
	}
	if !ok || len(p.s) != 0 {
		return dst[:n], syntaxError(t, text)
	}
	return dst, nil
}

// arrayElem is t's element type, also for a Type built outside a Registry.
func arrayElem(t Type) Type {
	if t.Elem != nil {
		return *t.Elem
	}
	if n := len(t.Name); n > 2 && t.Name[n-2:] == "[]" {
		if b, ok := builtinByName[t.Name[:n-2]]; ok {
			return *b
		}
		if t.Enum {
			return Type{Name: t.Name[:n-2], Kind: "string", Enum: true, conv: convString}
		}
	}
	return Type{Name: "text", conv: convUnsupported}
}

type arrayParser struct {
	elem  Type
	delim byte
	s     []byte
	err   error // an element's conversion error
}

func (p *arrayParser) skipSpace() {
	for len(p.s) > 0 && isSpace(p.s[0]) {
		p.s = p.s[1:]
	}
}

// array reads "{...}" at the start of p.s.
func (p *arrayParser) array(dst []byte, depth int) ([]byte, bool) {
	if depth == maxArrayDepth || len(p.s) == 0 || p.s[0] != '{' {
		return dst, false
	}
	p.s = p.s[1:]
	dst = append(dst, '[')
	p.skipSpace()
	if len(p.s) > 0 && p.s[0] == '}' {
		p.s = p.s[1:]
		return append(dst, ']'), true
	}
	for first := true; ; first = false {
		if !first {
			dst = append(dst, ',')
		}
		p.skipSpace()
		var ok bool
		if len(p.s) > 0 && p.s[0] == '{' {
			dst, ok = p.array(dst, depth+1)
		} else {
			dst, ok = p.element(dst)
		}
		if !ok {
			return dst, false
		}
		p.skipSpace()
		if len(p.s) == 0 {
			return dst, false
		}
		c := p.s[0]
		p.s = p.s[1:]
		if c == '}' {
			return append(dst, ']'), true
		}
		if c != p.delim {
			return dst, false
		}
	}
}

// element reads one quoted or unquoted element at the start of p.s.
func (p *arrayParser) element(dst []byte) ([]byte, bool) {
	var raw []byte
	escaped := false
	if len(p.s) > 0 && p.s[0] == '"' {
		i := 1
		for ; i < len(p.s) && p.s[i] != '"'; i++ {
			if p.s[i] == '\\' {
				escaped = true
				i++
			}
		}
		if i >= len(p.s) {
			return dst, false
		}
		raw = p.s[1:i]
		p.s = p.s[i+1:]
	} else {
		i := 0
		for ; i < len(p.s); i++ {
			c := p.s[i]
			if c == '\\' {
				escaped = true
				i++
				continue
			}
			if c == p.delim || c == '}' || c == '{' || c == '"' {
				break
			}
		}
		if i > len(p.s) {
			return dst, false
		}
		raw = p.s[:i]
		p.s = p.s[i:]
		// Spaces around an unquoted element are not part of it, unless
		// escaped; Postgres never prints either.
		for len(raw) > 0 && isSpace(raw[len(raw)-1]) && !(len(raw) > 1 && raw[len(raw)-2] == '\\') {
			raw = raw[:len(raw)-1]
		}
		if len(raw) == 0 {
			return dst, false
		}
		if !escaped && len(raw) == 4 && bytes.EqualFold(raw, []byte("NULL")) {
			return append(dst, "null"...), true
		}
	}
	if escaped {
		c := p.elem.conv
		if c == convNone {
			c = deriveConv(p.elem)
		}
		if c == convString || c == convUnsupported {
			return appendUnescapedString(dst, raw), true
		}
		raw = unescape(raw)
	}
	d, err := appendScalar(dst, p.elem, raw)
	if err != nil {
		p.err = err
		return dst, false
	}
	return d, true
}

// unescape removes an element's backslashes. Only elements of non-string
// types get here, and those rarely hold a backslash, so it may allocate.
func unescape(s []byte) []byte {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		out = append(out, s[i])
	}
	return out
}

// appendUnescapedString appends an element holding backslash escapes as a
// JSON string without a scratch copy.
func appendUnescapedString(dst []byte, s []byte) []byte {
	dst = append(dst, '"')
	for len(s) > 0 {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			dst = appendStringBody(dst, s)
			break
		}
		dst = appendStringBody(dst, s[:i])
		s = s[i+1:]
		if len(s) == 0 {
			break
		}
		// The escaped character, whole even when it is multi-byte.
		_, size := utf8.DecodeRune(s)
		dst = appendStringBody(dst, s[:size])
		s = s[size:]
	}
	return append(dst, '"')
}
