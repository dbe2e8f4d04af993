package pgvalue

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// fuzzOIDs are the types FuzzAppendJSON picks from, one per conversion.
var fuzzOIDs = []uint32{
	pgtype.TextOID, pgtype.BoolOID, pgtype.Int8OID, pgtype.Float8OID, pgtype.NumericOID,
	pgtype.TimestampOID, pgtype.TimestamptzOID, pgtype.DateOID, pgtype.TimeOID, pgtype.TimetzOID,
	pgtype.JSONBOID, pgtype.ByteaOID,
	pgtype.TextArrayOID, pgtype.Int4ArrayOID, pgtype.Float8ArrayOID, pgtype.TimestamptzArrayOID,
	pgtype.JSONBArrayOID, pgtype.BoxArrayOID, pgtype.BoolArrayOID,
}

func FuzzAppendJSON(f *testing.F) {
	seeds := []struct {
		oid  uint32
		text string
	}{
		{pgtype.TextOID, "héllo\n\"world\"\x00\xff"},
		{pgtype.Int8OID, "-9223372036854775808"},
		{pgtype.Float8OID, "-1.5e-07"},
		{pgtype.NumericOID, "1234567890123456789012345678901234567890.5"},
		{pgtype.TimestamptzOID, "0044-03-15 12:00:00.123456-04:56:02 BC"},
		{pgtype.TimestampOID, "294276-12-31 23:59:59.999999"},
		{pgtype.DateOID, "5874897-12-31"},
		{pgtype.TimetzOID, "24:00:00-15:59:59"},
		{pgtype.JSONBOID, `{"a": [1, {"b": null}]}`},
		{pgtype.TextArrayOID, `[0:1]={"a\"b",NULL,"\é"}`},
		{pgtype.Int4ArrayOID, "{{1,2},{3,NULL}}"},
		{pgtype.JSONBArrayOID, `{"{\"a\": 1}",null}`},
		{pgtype.BoxArrayOID, `{(1,1),(0,0);(2,2),(1,1)}`},
	}
	for _, s := range seeds {
		for i, oid := range fuzzOIDs {
			if oid == s.oid {
				f.Add(uint8(i), []byte(s.text))
			}
		}
	}
	r := NewRegistry()
	f.Fuzz(func(t *testing.T, pick uint8, text []byte) {
		typ, _ := r.Lookup(fuzzOIDs[int(pick)%len(fuzzOIDs)])
		in := bytes.Clone(text)
		prefix := []byte("[")
		out, err := AppendJSON(prefix, typ, text)
		if !bytes.Equal(in, text) {
			t.Fatalf("AppendJSON(%s) modified its input", typ.Name)
		}
		if err != nil {
			if !bytes.Equal(out, prefix) {
				t.Fatalf("AppendJSON(%s, %q) = %q on error", typ.Name, text, out)
			}
			return
		}
		if !json.Valid(out[1:]) {
			t.Fatalf("AppendJSON(%s, %q) = %s: not valid JSON", typ.Name, text, out[1:])
		}
	})
}

func FuzzCopyFields(f *testing.F) {
	for _, s := range []string{
		"", "a\tb", `\N` + "\t\t" + `x\ty\\z`, `\101\x4g\777\`, "é\\\t\\é", `{"a\\"b"}`,
	} {
		f.Add([]byte(s))
	}
	var fields [][]byte
	var buf []byte
	f.Fuzz(func(t *testing.T, line []byte) {
		var err error
		fields, buf, err = CopyFields(line, fields, buf)
		if err != nil {
			return
		}
		// Fields are separated by unescaped tabs, so there is one more
		// field than unescaped tabs, and a field grows no longer when
		// decoded.
		tabs, n := 0, 0
		for i := 0; i < len(line); i++ {
			switch line[i] {
			case '\\':
				i++
			case '\t':
				tabs++
			}
		}
		for _, fl := range fields {
			n += len(fl)
		}
		if len(fields) != tabs+1 || n > len(line) {
			t.Fatalf("CopyFields(%q) = %q: %d fields for %d tabs", line, fields, len(fields), tabs)
		}
	})
}

func BenchmarkAppendJSON(b *testing.B) {
	r := NewRegistry()
	cases := []struct {
		name string
		oid  uint32
		text string
	}{
		{"int8", pgtype.Int8OID, "9223372036854775807"},
		{"numeric", pgtype.NumericOID, "12345.6789"},
		{"text", pgtype.TextOID, "The quick brown fox jumps over the lazy dog, \"twice\"."},
		{"timestamptz", pgtype.TimestamptzOID, "2024-01-01 05:30:00.123456+05:30"},
		{"jsonb", pgtype.JSONBOID, `{"a": [1, 2, 3], "b": {"c": "d"}}`},
		{"int4[]", pgtype.Int4ArrayOID, "{1,2,3,4,5,6,7,8,NULL,10}"},
		{"text[]", pgtype.TextArrayOID, `{abc,"d e f","g\"h",NULL}`},
	}
	for _, c := range cases {
		typ, _ := r.Lookup(c.oid)
		text := []byte(c.text)
		dst := make([]byte, 0, 256)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				var err error
				if dst, err = AppendJSON(dst[:0], typ, text); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkCopyFields(b *testing.B) {
	line := []byte("42\tAlice\t2024-01-01 00:00:00.123456+00\t\\N\t{\"a\": \"line\\nbreak\"}\t{1,2,3}\tt\t12345.6789")
	var fields [][]byte
	var buf []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		var err error
		if fields, buf, err = CopyFields(line, fields, buf); err != nil {
			b.Fatal(err)
		}
	}
}
