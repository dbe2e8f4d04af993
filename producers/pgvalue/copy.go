package pgvalue

import (
	"bytes"
	"errors"
)

// ErrCopyLine reports a COPY text line that ends inside a backslash escape.
var ErrCopyLine = errors.New("malformed copy line")

// emptyField is an empty non-NULL field: distinct from nil, which is NULL.
var emptyField = []byte{}

// CopyFields splits one line of COPY text format (without the trailing
// newline) into fields, un-escaping backslash sequences; a NULL (\N) field
// is returned as nil. It may reuse buf/fields storage.
//
// A field without escapes is a subslice of line; one with escapes is decoded
// into buf. Both stay valid until line, or buf as returned, is reused. An
// empty line is one empty field: a caller copying zero columns ignores it.
func CopyFields(line []byte, fields [][]byte, buf []byte) ([][]byte, []byte, error) {
	fields = fields[:0]
	buf = buf[:0]
	for {
		end := 0
		escaped := false
		for end < len(line) && line[end] != '\t' {
			if line[end] == '\\' {
				escaped = true
				end++ // the escaped byte, which may be a tab
				if end == len(line) {
					return fields, buf, ErrCopyLine
				}
			}
			end++
		}
		f := line[:end]
		switch {
		case len(f) == 2 && f[0] == '\\' && f[1] == 'N':
			f = nil
		case len(f) == 0:
			f = emptyField
		case escaped:
			start := len(buf)
			buf = unescapeCopy(buf, f)
			f = buf[start:len(buf):len(buf)]
		default:
			f = f[:len(f):len(f)]
		}
		fields = append(fields, f)
		if end == len(line) {
			return fields, buf, nil
		}
		line = line[end+1:]
	}
}

// unescapeCopy appends f with COPY's backslash sequences decoded: \b \f \n
// \r \t \v, octal \ooo, hex \xhh, and a backslash before any other byte
// standing for that byte.
func unescapeCopy(dst, f []byte) []byte {
	for len(f) > 0 {
		i := bytes.IndexByte(f, '\\')
		if i < 0 {
			return append(dst, f...)
		}
		dst = append(dst, f[:i]...)
		c := f[i+1] // CopyFields checked that no field ends in a backslash
		f = f[i+2:]
		switch c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'v':
			dst = append(dst, '\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := c - '0'
			for n := 1; n < 3 && len(f) > 0 && f[0] >= '0' && f[0] <= '7'; n++ {
				v = v<<3 | (f[0] - '0') // Postgres, too, keeps the low 8 bits
				f = f[1:]
			}
			dst = append(dst, v)
		case 'x':
			v, n := byte(0), 0
			for ; n < 2 && len(f) > 0 && hexVal(f[0]) >= 0; n++ {
				v = v<<4 | byte(hexVal(f[0]))
				f = f[1:]
			}
			if n == 0 {
				v = 'x'
			}
			dst = append(dst, v)
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
