package pgvalue

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jetsync/jetsync/streams"
)

func mustType(t testing.TB, oid uint32) Type {
	t.Helper()
	typ, ok := NewRegistry().Lookup(oid)
	if !ok {
		t.Fatalf("Lookup(%d) not found", oid)
	}
	return typ
}

type convCase struct {
	name string
	oid  uint32
	in   string
	want string // "" means an error is expected
}

func runConvCases(t *testing.T, cases []convCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			typ := mustType(t, tc.oid)
			prefix := []byte(`[0,`)
			got, err := AppendJSON(prefix, typ, []byte(tc.in))
			if tc.want == "" {
				if err == nil {
					t.Fatalf("AppendJSON(%s, %q) = %s; want an error", typ.Name, tc.in, got)
				}
				if !errors.Is(err, ErrSyntax) {
					t.Errorf("AppendJSON(%s, %q) error %v is not ErrSyntax", typ.Name, tc.in, err)
				}
				if string(got) != string(prefix) {
					t.Errorf("AppendJSON(%s, %q) left %q in dst on error", typ.Name, tc.in, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("AppendJSON(%s, %q) = %v", typ.Name, tc.in, err)
			}
			if s := string(got[len(prefix):]); s != tc.want {
				t.Errorf("AppendJSON(%s, %q) = %s; want %s", typ.Name, tc.in, s, tc.want)
			}
			if !json.Valid(got[len(prefix):]) {
				t.Errorf("AppendJSON(%s, %q) = %s: not valid JSON", typ.Name, tc.in, got[len(prefix):])
			}
		})
	}
}

func TestAppendJSON_Numbers(t *testing.T) {
	runConvCases(t, []convCase{
		{"Int2", pgtype.Int2OID, "-32768", "-32768"},
		{"Int4Zero", pgtype.Int4OID, "0", "0"},
		{"Int8Max", pgtype.Int8OID, "9223372036854775807", "9223372036854775807"},
		{"Int8Min", pgtype.Int8OID, "-9223372036854775808", "-9223372036854775808"},
		{"IntEmpty", pgtype.Int4OID, "", ""},
		{"IntPlus", pgtype.Int4OID, "+1", ""},
		{"IntLeadingZero", pgtype.Int4OID, "01", ""},
		{"IntFraction", pgtype.Int8OID, "1.5", ""},
		{"IntMinusOnly", pgtype.Int8OID, "-", ""},
		{"Float8", pgtype.Float8OID, "-1.5", "-1.5"},
		{"Float8Exp", pgtype.Float8OID, "1e+20", "1e+20"},
		{"Float8SmallExp", pgtype.Float8OID, "1.2345e-07", "1.2345e-07"},
		{"Float8Shortest", pgtype.Float8OID, "0.1", "0.1"},
		{"Float8NegZero", pgtype.Float8OID, "-0", "0"},
		{"Float4NegZeroExp", pgtype.Float4OID, "-0e+00", "0e+00"},
		{"Float8NaN", pgtype.Float8OID, "NaN", `"NaN"`},
		{"Float8Inf", pgtype.Float8OID, "Infinity", `"Infinity"`},
		{"Float4NegInf", pgtype.Float4OID, "-Infinity", `"-Infinity"`},
		{"Float8Bad", pgtype.Float8OID, "1.", ""},
		{"Float8Hex", pgtype.Float8OID, "0x10", ""},
		{"Float8Inf2", pgtype.Float8OID, "inf", ""},
		{"Numeric40", pgtype.NumericOID, "1234567890123456789012345678901234567890", "1234567890123456789012345678901234567890"},
		{"NumericFraction", pgtype.NumericOID, "-0.000000000000000000000000000000000000001", "-0.000000000000000000000000000000000000001"},
		{"NumericScale", pgtype.NumericOID, "1.50", "1.50"},
		{"NumericZeroScale", pgtype.NumericOID, "0.00", "0.00"},
		{"NumericNaN", pgtype.NumericOID, "NaN", `"NaN"`},
		{"NumericNegInf", pgtype.NumericOID, "-Infinity", `"-Infinity"`},
		{"NumericDotFirst", pgtype.NumericOID, ".5", ""},
	})
}

func TestAppendJSON_Bool(t *testing.T) {
	runConvCases(t, []convCase{
		{"T", pgtype.BoolOID, "t", "true"},
		{"F", pgtype.BoolOID, "f", "false"},
		{"True", pgtype.BoolOID, "true", "true"},
		{"Bad", pgtype.BoolOID, "yes", ""},
		{"Empty", pgtype.BoolOID, "", ""},
	})
}

func TestAppendJSON_Strings(t *testing.T) {
	runConvCases(t, []convCase{
		{"Text", pgtype.TextOID, "hello", `"hello"`},
		{"Empty", pgtype.TextOID, "", `""`},
		{"Quotes", pgtype.VarcharOID, `say "hi" \ bye`, `"say \"hi\" \\ bye"`},
		{"Control", pgtype.TextOID, "a\nb\tc\rd\x01e\x1f\x7f", `"a\nb\tc\rd\u0001e\u001f` + "\x7f" + `"`},
		{"Unicode", pgtype.TextOID, "héllo 世界 🎉 \u2028", `"héllo 世界 🎉 \u2028"`},
		{"InvalidUTF8", pgtype.TextOID, "a\xffb\xc3", `"a\ufffdb\ufffd"`},
		{"HTMLIsLiteral", pgtype.TextOID, "<a&b>", `"<a&b>"`},
		{"Bpchar", pgtype.BPCharOID, "ab  ", `"ab  "`},
		{"Name", pgtype.NameOID, "pg_class", `"pg_class"`},
		{"UUID", pgtype.UUIDOID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`},
		{"Inet", pgtype.InetOID, "192.168.0.1/24", `"192.168.0.1/24"`},
		{"Cidr", pgtype.CIDROID, "::1/128", `"::1/128"`},
		{"Macaddr", pgtype.MacaddrOID, "08:00:2b:01:02:03", `"08:00:2b:01:02:03"`},
		{"Macaddr8", pgtype.Macaddr8OID, "08:00:2b:01:02:03:04:05", `"08:00:2b:01:02:03:04:05"`},
		{"PgLSN", 3220, "16/B374D848", `"16/B374D848"`},
		{"Bytea", pgtype.ByteaOID, `\x00ff`, `"\\x00ff"`},
		{"Interval", pgtype.IntervalOID, "1 day 02:00:00", `"1 day 02:00:00"`},
		{"Point", pgtype.PointOID, "(1,2)", `"(1,2)"`},
		{"Int4range", pgtype.Int4rangeOID, "[1,3)", `"[1,3)"`},
	})
}

func TestAppendJSON_JSON(t *testing.T) {
	runConvCases(t, []convCase{
		{"Object", pgtype.JSONBOID, `{"a": [1, 2.5, "x"], "b": null}`, `{"a": [1, 2.5, "x"], "b": null}`},
		{"String", pgtype.JSONBOID, `"hi"`, `"hi"`},
		{"Null", pgtype.JSONOID, `null`, `null`},
		{"BigNumber", pgtype.JSONBOID, `123456789012345678901234567890`, `123456789012345678901234567890`},
		{"Spaces", pgtype.JSONOID, " \n{\"a\" : 1}\n ", `{"a" : 1}`},
		{"Invalid", pgtype.JSONOID, `{"a":`, ""},
		{"Empty", pgtype.JSONOID, ``, ""},
	})
}

func TestAppendJSON_Timestamps(t *testing.T) {
	runConvCases(t, []convCase{
		{"Epoch", pgtype.TimestampOID, "1970-01-01 00:00:00", "0"},
		{"Plain", pgtype.TimestampOID, "2024-01-01 00:00:00", "1704067200000"},
		{"Micros", pgtype.TimestampOID, "2024-01-01 00:00:00.123456", "1704067200123.456"},
		{"Millis", pgtype.TimestampOID, "2024-01-01 00:00:00.123", "1704067200123"},
		{"TenthMilli", pgtype.TimestampOID, "2024-01-01 00:00:00.1234", "1704067200123.4"},
		{"OneDigit", pgtype.TimestampOID, "2024-01-01 00:00:00.5", "1704067200500"},
		{"TSeparator", pgtype.TimestampOID, "2024-01-01T00:00:00", "1704067200000"},
		{"LeapDay", pgtype.TimestampOID, "2000-02-29 00:00:00", "951782400000"},
		{"NotLeapDay", pgtype.TimestampOID, "1900-02-29 00:00:00", ""},
		{"BeforeEpochMicro", pgtype.TimestampOID, "1969-12-31 23:59:59.999999", "-0.001"},
		{"BeforeEpochHalf", pgtype.TimestampOID, "1969-12-31 23:59:59.9995", "-0.5"},
		{"BC", pgtype.TimestampOID, "0044-03-15 12:00:00 BC", "-63517780800000"},
		{"OneBC", pgtype.TimestampOID, "0001-01-01 00:00:00 BC", "-62167219200000"},
		{"Latest", pgtype.TimestampOID, "294276-12-31 23:59:59.999999", "9224318015999999.999"},
		{"Infinity", pgtype.TimestampOID, "infinity", `"Infinity"`},
		{"NegInfinity", pgtype.TimestamptzOID, "-infinity", `"-Infinity"`},
		{"PlainWithOffset", pgtype.TimestampOID, "2024-01-01 00:00:00+00", ""},
		{"TzUTC", pgtype.TimestamptzOID, "2024-01-01 00:00:00+00", "1704067200000"},
		{"TzHalfHour", pgtype.TimestamptzOID, "2024-01-01 05:30:00.123456+05:30", "1704067200123.456"},
		{"TzNegative", pgtype.TimestamptzOID, "2023-12-31 16:00:00-08", "1704067200000"},
		{"TzLMTSeconds", pgtype.TimestamptzOID, "1883-11-18 11:59:59-04:56:02", "-2717651039000"},
		{"TzBC", pgtype.TimestamptzOID, "0044-03-15 12:00:00+00 BC", "-63517780800000"},
		{"TzMissingOffset", pgtype.TimestamptzOID, "2024-01-01 00:00:00", ""},
		{"TzBadOffset", pgtype.TimestamptzOID, "2024-01-01 00:00:00+5", ""},
		{"BadMonth", pgtype.TimestampOID, "2024-13-01 00:00:00", ""},
		{"BadClock", pgtype.TimestampOID, "2024-01-01 00:60:00", ""},
		{"NoClock", pgtype.TimestampOID, "2024-01-01", ""},
		{"ShortYear", pgtype.TimestampOID, "24-01-01 00:00:00", ""},
		{"Garbage", pgtype.TimestampOID, "Mon Jan 01 00:00:00 2024", ""},
		{"DanglingDot", pgtype.TimestampOID, "2024-01-01 00:00:00.", ""},
	})
}

func TestAppendJSON_DatesAndTimes(t *testing.T) {
	runConvCases(t, []convCase{
		{"Date", pgtype.DateOID, "2024-01-01", "1704067200000"},
		{"DateBC", pgtype.DateOID, "4713-11-24 BC", "-210835180800000"},
		{"DateLatest", pgtype.DateOID, "5874897-12-31", "185331706992000000"},
		{"DateInfinity", pgtype.DateOID, "infinity", `"Infinity"`},
		{"DateZeroYear", pgtype.DateOID, "0000-01-01 BC", ""},
		{"DateWithTime", pgtype.DateOID, "2024-01-01 00:00:00", ""},
		{"Time", pgtype.TimeOID, "12:34:56", "45296000"},
		{"TimeTruncates", pgtype.TimeOID, "00:00:01.999999", "1999"},
		{"TimeMidnight", pgtype.TimeOID, "00:00:00", "0"},
		{"TimeEndOfDay", pgtype.TimeOID, "24:00:00", "0"},
		{"TimeBad", pgtype.TimeOID, "25:00:00", ""},
		{"TimeWithOffset", pgtype.TimeOID, "12:00:00+01", ""},
		{"Timetz", pgtype.TimetzOID, "12:00:00+00", "43200000"},
		{"TimetzEast", pgtype.TimetzOID, "01:00:00.5+05:30", "70200500"},
		{"TimetzWest", pgtype.TimetzOID, "23:00:00-02", "3600000"},
		{"TimetzSeconds", pgtype.TimetzOID, "00:00:00+00:00:30", "86370000"},
		{"TimetzNoOffset", pgtype.TimetzOID, "12:00:00", ""},
	})
}

func TestAppendJSON_Arrays(t *testing.T) {
	runConvCases(t, []convCase{
		{"Empty", pgtype.Int4ArrayOID, "{}", "[]"},
		{"Ints", pgtype.Int4ArrayOID, "{1,2,NULL,-3}", "[1,2,null,-3]"},
		{"NullLowerCase", pgtype.Int8ArrayOID, "{null,9223372036854775807}", "[null,9223372036854775807]"},
		{"Nested", pgtype.Int4ArrayOID, "{{1,2},{3,4}}", "[[1,2],[3,4]]"},
		{"Deep", pgtype.Int4ArrayOID, "{{{1}},{{2}}}", "[[[1]],[[2]]]"},
		{"TooDeep", pgtype.Int4ArrayOID, "{{{{{{{1}}}}}}}", ""},
		{"Bounds", pgtype.Int4ArrayOID, "[0:1]={7,8}", "[7,8]"},
		{"Bounds2D", pgtype.Int4ArrayOID, "[0:0][2:3]={{7,8}}", "[[7,8]]"},
		{"Spaces", pgtype.Int4ArrayOID, "{ 1 , 2 }", "[1,2]"},
		{"Quoted", pgtype.TextArrayOID, `{"a b","c\"d","e\\f",plain,"NULL",NULL,""}`, `["a b","c\"d","e\\f","plain","NULL",null,""]`},
		{"QuotedUnicode", pgtype.TextArrayOID, `{"é\"","\é"}`, `["é\"","é"]`},
		{"QuotedNumbers", pgtype.Float8ArrayOID, `{"1.5",NaN,-Infinity}`, `[1.5,"NaN","-Infinity"]`},
		{"Bools", pgtype.BoolArrayOID, "{t,f}", "[true,false]"},
		{"Timestamps", pgtype.TimestamptzArrayOID, `{"2024-01-01 05:30:00+05:30",infinity}`, `[1704067200000,"Infinity"]`},
		{"Dates", pgtype.DateArrayOID, `{2024-01-01,"0044-03-15 BC"}`, `[1704067200000,-63517824000000]`},
		{"JSONB", pgtype.JSONBArrayOID, `{"{\"a\": 1}","[1, 2]",null}`, `[{"a": 1},[1, 2],null]`},
		{"Numeric", pgtype.NumericArrayOID, `{1.50,NaN}`, `[1.50,"NaN"]`},
		{"Bytea", pgtype.ByteaArrayOID, `{"\\x00ff"}`, `["\\x00ff"]`},
		{"Box", pgtype.BoxArrayOID, `{(1,1),(0,0);(2,2),(1,1)}`, `["(1,1),(0,0)","(2,2),(1,1)"]`},
		{"UnquotedEscape", pgtype.TextArrayOID, `{a\,b}`, `["a,b"]`},
		{"Unterminated", pgtype.Int4ArrayOID, "{1,2", ""},
		{"UnterminatedQuote", pgtype.TextArrayOID, `{"a}`, ""},
		{"EmptyElement", pgtype.Int4ArrayOID, "{1,,2}", ""},
		{"TrailingComma", pgtype.Int4ArrayOID, "{1,}", ""},
		{"Trailing", pgtype.Int4ArrayOID, "{1}x", ""},
		{"NoBraces", pgtype.Int4ArrayOID, "1,2", ""},
		{"BadElement", pgtype.Int4ArrayOID, "{1,x}", ""},
		{"BoundsNoEquals", pgtype.Int4ArrayOID, "[0:1]{1}", ""},
	})
}

func TestRegistry_Lookup(t *testing.T) {
	r := NewRegistry()
	tests := []struct {
		oid   uint32
		name  string
		kind  streams.Kind
		array bool
	}{
		{pgtype.Int8OID, "int8", streams.KindNumber, false},
		{pgtype.VarcharOID, "varchar", streams.KindString, false},
		{pgtype.TimestamptzOID, "timestamptz", streams.KindNumber, false},
		{pgtype.BoolOID, "bool", streams.KindBoolean, false},
		{pgtype.JSONBOID, "jsonb", streams.KindJSON, false},
		{pgtype.ByteaOID, "bytea", streams.KindUnsupported, false},
		{pgtype.Int4ArrayOID, "int4[]", streams.KindJSON, true},
		{pgtype.ByteaArrayOID, "bytea[]", streams.KindJSON, true},
	}
	for _, tc := range tests {
		typ, ok := r.Lookup(tc.oid)
		if !ok || typ.OID != tc.oid || typ.Name != tc.name || typ.Kind != tc.kind || typ.Array != tc.array {
			t.Errorf("Lookup(%d) = %+v, %v; want %s %s array=%v", tc.oid, typ, ok, tc.name, tc.kind, tc.array)
		}
		if tc.array && (typ.Elem == nil || typ.Elem.Name+"[]" != typ.Name) {
			t.Errorf("Lookup(%d).Elem = %+v", tc.oid, typ.Elem)
		}
	}
	if _, ok := r.Lookup(99999); ok {
		t.Error("Lookup(99999) found a type")
	}
}

// TestAppendJSON_ForeignType covers Types that callers build themselves,
// without a Registry.
func TestAppendJSON_ForeignType(t *testing.T) {
	tests := []struct {
		typ  Type
		in   string
		want string
	}{
		{Type{Name: "int8", Kind: streams.KindNumber}, "12", "12"},
		{Type{Name: "timestamptz"}, "1970-01-01 00:00:00.001+00", "1"},
		{Type{Name: "mood", Kind: streams.KindString, Enum: true}, "happy", `"happy"`},
		{Type{Name: "mood[]", Kind: streams.KindJSON, Enum: true, Array: true}, "{happy,sad}", `["happy","sad"]`},
		{Type{Name: "int4[]", Array: true}, "{1}", "[1]"},
		{Type{Name: "whatever"}, "x", `"x"`},
	}
	for _, tc := range tests {
		got, err := AppendJSON(nil, tc.typ, []byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("AppendJSON(%+v, %q) = %s, %v; want %s", tc.typ, tc.in, got, err, tc.want)
		}
	}
	if typ, ok := TypeByName("int4[]"); !ok || typ.OID != pgtype.Int4ArrayOID {
		t.Errorf("TypeByName(int4[]) = %+v, %v", typ, ok)
	}
}

func TestAppendJSON_ErrorShortensText(t *testing.T) {
	_, err := AppendJSON(nil, mustType(t, pgtype.Int4OID), []byte(strings.Repeat("x", 1000)))
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("error = %v; want a short error", err)
	}
}
