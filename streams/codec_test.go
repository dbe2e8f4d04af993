package streams

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// stdDecode is the reference: encoding/json plus the same validation.
func stdDecode(data []byte) (*Message, error) {
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

func sampleMessage() *Message {
	return &Message{Schema: "public", Table: "issue", Parts: []Part{
		{Watermark: "0a", Prev: "09", Num: 0, Last: true, CommitTimeMs: 1704067200123.5, Changes: []Change{
			{Op: OpInsert, New: Row{"id": json.RawMessage(`"i1"`), "title": json.RawMessage(`"a \"quoted\" <b>&\u2028 é \\ \n"`), "n": json.RawMessage(`-1.5e3`), "j": json.RawMessage(`{"a":[1,null,true]}`)}},
			{Op: OpUpdate, New: Row{"id": json.RawMessage(`"i2"`)}, Old: Row{"id": json.RawMessage(`"i1"`)}},
			{Op: OpDelete, Old: Row{"id": json.RawMessage(`"i3"`)}},
			{Op: OpTruncate},
		}},
		{Watermark: "0b", Num: 0, Last: true, Changes: []Change{
			{Op: OpBackfill, Columns: []string{"id", "n"}, Rows: [][]json.RawMessage{{json.RawMessage(`"x"`), json.RawMessage(`1`)}, {json.RawMessage(`"y"`), json.RawMessage(`null`)}}},
			{Op: OpCreateTable, Spec: &TableSpec{OID: 16385, Schema: "public", Name: "issue", Columns: []ColumnSpec{{Name: "id", Pos: 1, DataType: "text", Kind: KindString, NotNull: true}}, PrimaryKey: []string{"id"}}},
			{Op: OpCreateIndex, Index: &IndexSpec{Schema: "public", TableName: "issue", Name: "issue_pkey", Unique: true, Columns: []string{"id"}}},
		}},
		{Watermark: "0c", Num: 0, Last: true, Changes: ddlChanges()},
		{Watermark: "0d", Num: 0, Last: true, Changes: []Change{
			{Op: OpFragment, Fragment: `{"op":"insert","new":{"id":"\u2028 é`, FragCount: 2},
			{Op: OpFragment, Fragment: `"}}`, FragNum: 1, FragCount: 2},
		}},
	}}
}

// ddlChanges has one of each schema change.
func ddlChanges() []Change {
	spec := func(cols ...string) *TableSpec {
		s := &TableSpec{Schema: "public", Name: "issue", PrimaryKey: []string{"id"}}
		for i, c := range cols {
			s.Columns = append(s.Columns, ColumnSpec{Name: c, Pos: i + 1, DataType: "int8", Kind: KindNumber})
		}
		return s
	}
	return []Change{
		{Op: OpAddColumn, Spec: spec("id", "n"), Columns: []string{"n"}, New: Row{"n": json.RawMessage(`7`)}},
		{Op: OpAddColumn, Spec: spec("id", "n", "m"), Columns: []string{"m"}},
		{Op: OpUpdateColumn, Spec: spec("id", "n", "m2"), Columns: []string{"m", "m2"}},
		{Op: OpDropColumn, Spec: spec("id", "n"), Columns: []string{"m2"}},
		{Op: OpDropIndex, Index: &IndexSpec{Schema: "public", TableName: "issue", Name: "issue_n"}},
		{Op: OpRenameTable, Spec: &TableSpec{Schema: "app", Name: "ticket", Columns: spec("id").Columns}},
		{Op: OpDropTable},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	m := sampleMessage()
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("Encode produced invalid JSON: %s", b)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Errorf("Decode(Encode(m)) = %+v; want %+v", got, m)
	}
	std, err := stdDecode(b)
	if err != nil {
		t.Fatalf("encoding/json rejects our output: %v", err)
	}
	if !reflect.DeepEqual(std, m) {
		t.Errorf("encoding/json reads %+v; want %+v", std, m)
	}
}

// TestCodecSpecWithoutOID reads a create-table written before TableSpec had
// an OID.
func TestCodecSpecWithoutOID(t *testing.T) {
	m, err := Decode([]byte(`{"schema":"public","table":"issue","parts":[{"wm":"0a","part":1,"changes":[` +
		`{"op":"create-table","spec":{"schema":"public","name":"issue","columns":[{"name":"id","pos":1,"dataType":"text","kind":"string"}],"primaryKey":["id"]}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	spec := m.Parts[0].Changes[0].Spec
	if spec == nil || spec.OID != 0 || spec.Name != "issue" || len(spec.Columns) != 1 {
		t.Errorf("spec = %+v; want issue with OID 0", spec)
	}
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"oid"`) {
		t.Errorf("Encode wrote an unknown OID: %s", b)
	}
}

func TestCodecStrings(t *testing.T) {
	for _, s := range []string{"", "plain", "a\"b\\c", "\x00\x1f\x7f", "é€😀", "\xff\xfe", "\u2028\u2029", "<&>"} {
		b := appendString(nil, s)
		var want string
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("appendString(%q) = %s: invalid JSON: %v", s, b, err)
		}
		d := decoder{data: b}
		got, err := d.str()
		if err != nil || got != want {
			t.Errorf("str(%s) = %q, %v; want %q", b, got, err, want)
		}
	}
	for _, s := range []string{`"\ud83d\ude00"`, `"\ud83d"`, `"\ude00x"`, `"\u00e9\/"`, "\"\xc3\""} {
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatal(err)
		}
		d := decoder{data: []byte(s)}
		got, err := d.str()
		if err != nil || got != want {
			t.Errorf("str(%s) = %q, %v; want %q", s, got, err, want)
		}
	}
}

func TestCodecRejects(t *testing.T) {
	base := `{"table":"t","parts":[{"wm":"0a","part":0,"last":true,"changes":[{"op":"insert","new":{"a":%s}}]}]}`
	for _, v := range []string{`01`, `1.`, `.5`, `-`, `1e`, `tru`, `"\x"`, `"abc`, `[1,]`, `{"a"}`, `{"a":1,}`, "\"\x01\"", strings.Repeat("[", 2000) + strings.Repeat("]", 2000)} {
		if _, err := Decode(fmt.Appendf(nil, base, v)); err == nil {
			t.Errorf("Decode accepted value %.40s", v)
		}
	}
	for _, s := range []string{`{"parts":[{"wm":"0a","part":0,"changes":[]}]} x`, `{"parts":[{"wm":"0a","part":"0","changes":[]}]}`, `{"parts":null}`} {
		if _, err := Decode([]byte(s)); err == nil {
			t.Errorf("Decode(%s) succeeded", s)
		}
	}
}

// FuzzCodec checks the hand-written codec against encoding/json: whatever it
// accepts, encoding/json accepts and reads the same, and what it encodes
// reads back unchanged.
func FuzzCodec(f *testing.F) {
	b, _ := Encode(sampleMessage())
	f.Add(b)
	f.Add([]byte(`{"table":"t","parts":[{"wm":"0a","part":0,"last":true,"changes":[{"op":"insert","new":{"a":"\u00e9\ud83d\ude00","b":[1,{"c":null}]}}]}]}`))
	frags, _ := Fragment(&Change{Op: OpInsert, New: Row{"id": json.RawMessage(`"a\"b\\c\u2028é😀"`)}}, minFragmentBytes)
	for _, c := range append(ddlChanges(), frags...) {
		b, _ := Encode(&Message{Schema: "public", Table: "issue", Parts: []Part{{Watermark: "0a", Num: 0, Last: true, Changes: []Change{c}}}})
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			return
		}
		std, err := stdDecode(data)
		if err != nil {
			t.Fatalf("Decode accepted what encoding/json rejects (%v): %q", err, data)
		}
		if !cmp.Equal(m, std, cmpopts.EquateEmpty()) {
			t.Fatalf("Decode = %+v; encoding/json = %+v", m, std)
		}
		out, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode(Decode(x)) = %v", err)
		}
		back, err := Decode(out)
		if err != nil || !cmp.Equal(back, m, cmpopts.EquateEmpty()) {
			t.Fatalf("round trip changed %+v into %+v (%v)", m, back, err)
		}
	})
}

func backfillMessage(rows int) []byte {
	m := &Message{Schema: "public", Table: "issue", Parts: []Part{{Watermark: "0a", Num: 3}}}
	c := Change{Op: OpBackfill, Columns: []string{"id", "title", "open", "modified", "owner_id", "created"}}
	for i := range rows {
		c.Rows = append(c.Rows, []json.RawMessage{
			json.RawMessage(fmt.Sprintf(`"i%07d"`, i)), json.RawMessage(`"Issue 1 c4ca4238a0b923820dcc509a6f75849b"`),
			json.RawMessage(`true`), json.RawMessage(`237570030`), json.RawMessage(`"u000001"`), json.RawMessage(`1704069000000`),
		})
	}
	m.Parts[0].Changes = []Change{c}
	b, _ := Encode(m)
	return b
}

func BenchmarkDecodeEvent(b *testing.B) {
	data := backfillMessage(2000)
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := Decode(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := stdDecode(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkEncodeEvent(b *testing.B) {
	m, _ := Decode(backfillMessage(2000))
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		var err error
		if buf, err = AppendEncode(buf[:0], m); err != nil {
			b.Fatal(err)
		}
	}
}
