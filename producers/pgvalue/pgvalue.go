// Package pgvalue converts Postgres values in text format, as pgoutput sends
// them during logical replication and as COPY ... TO STDOUT writes them, into
// the client's JSON form (docs/replica.md §4).
//
// The text forms of dates and times depend on the session's DateStyle: this
// package reads only ISO ("2024-01-02 03:04:05.678901+05:30"), which is
// Postgres's default and which the replication and copy sessions set
// explicitly (DateStyle=ISO), since a role or database default could differ.
//
// Where JSON has no form for a value, the value becomes a JSON string:
// float and numeric NaN and ±Infinity become "NaN", "Infinity" and
// "-Infinity", and infinite timestamps and dates become "Infinity" and
// "-Infinity". Numbers are copied exactly from the Postgres text: int8 keeps
// all its digits and numeric all its precision, so a consumer that needs a
// float64 rounds once, at the end.
//
// Converting is on the initial sync's hot path, so every function appends to
// a caller's buffer and allocates nothing for well-formed input.
package pgvalue

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jetsync/jetsync/streams"
)

// ErrSyntax reports a text value that is not the Postgres output form of its
// type.
var ErrSyntax = errors.New("invalid text value")

// conv is how a type's text converts.
type conv uint8

const (
	convNone        conv = iota // unset: derived from Type.Name
	convUnsupported             // the text, as a JSON string
	convString
	convBool
	convInt
	convFloat // float4, float8 and numeric
	convTimestamp
	convTimestamptz
	convDate
	convTime
	convTimetz
	convJSON
	convArray
)

// kind is the client-facing kind of values converted by c.
func (c conv) kind() streams.Kind {
	switch c {
	case convString:
		return streams.KindString
	case convBool:
		return streams.KindBoolean
	case convInt, convFloat, convTimestamp, convTimestamptz, convDate, convTime, convTimetz:
		return streams.KindNumber
	case convJSON, convArray:
		return streams.KindJSON
	default:
		return streams.KindUnsupported
	}
}

// Type is how one Postgres type converts.
type Type struct {
	OID uint32
	// Name is the upstream type name without modifiers ("int8", "varchar",
	// "timestamptz", "mood"); an array is its element's name plus "[]"
	// ("int4[]"), and a domain carries its base type's name.
	Name  string
	Kind  streams.Kind
	Enum  bool
	Array bool
	// Elem is an array's element type. It is shared: do not modify it.
	Elem *Type

	conv conv
	// delim separates elements in an array of this type; zero means ','.
	delim byte
}

// AppendJSON appends the client-form JSON of a non-NULL text value of type t
// to dst. On error, dst is returned unchanged.
//
// A Type built outside a Registry (a literal with only Name set) converts as
// the builtin type of that name, or as a string for a string Kind.
func AppendJSON(dst []byte, t Type, text []byte) ([]byte, error) {
	if t.conv == convArray || t.conv == convNone && t.Array {
		return appendArray(dst, t, text)
	}
	return appendScalar(dst, t, text)
}

func appendScalar(dst []byte, t Type, text []byte) ([]byte, error) {
	c := t.conv
	if c == convNone {
		c = deriveConv(t)
	}
	n := len(dst)
	var ok bool
	switch c {
	case convString, convUnsupported:
		return appendString(dst, text), nil
	case convBool:
		switch string(text) {
		case "t", "true":
			return append(dst, "true"...), nil
		case "f", "false":
			return append(dst, "false"...), nil
		}
	case convInt:
		if validInt(text) {
			return append(dst, text...), nil
		}
	case convFloat:
		dst, ok = appendFloat(dst, text)
	case convTimestamp:
		dst, ok = appendTimestamp(dst, text, false)
	case convTimestamptz:
		dst, ok = appendTimestamp(dst, text, true)
	case convDate:
		dst, ok = appendDate(dst, text)
	case convTime:
		dst, ok = appendTime(dst, text, false)
	case convTimetz:
		dst, ok = appendTime(dst, text, true)
	case convJSON:
		text = trimSpace(text)
		if json.Valid(text) {
			return append(dst, text...), nil
		}
	case convArray:
		// An array's element is never itself an array type.
	}
	if ok {
		return dst, nil
	}
	return dst[:n], syntaxError(t, text)
}

// deriveConv finds the conversion of a Type that was not built by this
// package.
func deriveConv(t Type) conv {
	if b, ok := builtinByName[t.Name]; ok {
		return b.conv
	}
	switch {
	case t.Array:
		return convArray
	case t.Enum || t.Kind == streams.KindString:
		return convString
	}
	return convUnsupported
}

func syntaxError(t Type, text []byte) error {
	const maxShown = 64
	s := string(text)
	if len(s) > maxShown {
		s = s[:maxShown] + "..."
	}
	name := t.Name
	if name == "" {
		name = fmt.Sprintf("oid %d", t.OID)
	}
	return fmt.Errorf("%w: %s %q", ErrSyntax, name, s)
}

// validInt reports whether s is an integer in JSON's grammar, as int2, int4
// and int8 print.
func validInt(s []byte) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if len(s) == 0 || s[0] == '0' && len(s) > 1 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// appendFloat appends a float4, float8 or numeric. The Postgres text of a
// finite value ("-1.5", "1e+20", "123.4500") is already a JSON number; the
// non-finite ones become strings. Negative zero becomes 0, as JSON.stringify
// prints it in zero-cache.
func appendFloat(dst []byte, s []byte) ([]byte, bool) {
	switch string(s) {
	case "NaN", "Infinity", "-Infinity":
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"'), true
	}
	zero, ok := scanNumber(s)
	if !ok {
		return dst, false
	}
	if zero && s[0] == '-' {
		s = s[1:]
	}
	return append(dst, s...), true
}

// scanNumber reports whether s is a JSON number, and whether its mantissa is
// zero.
func scanNumber(s []byte) (zero, ok bool) {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := func() int {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if s[i] != '0' {
				zero = false
			}
			i++
		}
		return i - j
	}
	zero = true
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case digits() == 0:
		return false, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false, false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		z := zero
		if digits() == 0 {
			return false, false
		}
		zero = z
	}
	return zero, i == len(s)
}

// appendString appends s as a JSON string: the stream escapes every string
// one way, so pgvalue uses the contract's escaper.
func appendString(dst []byte, s []byte) []byte { return streams.AppendJSONString(dst, s) }

func appendStringBody(dst []byte, s []byte) []byte { return streams.AppendJSONStringBody(dst, s) }

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func trimSpace(s []byte) []byte {
	for len(s) > 0 && isSpace(s[0]) {
		s = s[1:]
	}
	for len(s) > 0 && isSpace(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}
