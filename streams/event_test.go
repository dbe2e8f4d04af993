package streams

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func TestDecode(t *testing.T) {
	good := []string{
		`{"schema":"public","table":"t","parts":[{"wm":"0a","prev":"09","part":0,"last":true,"changes":[{"op":"insert","new":{"id":1}}]}]}`,
		`{"schema":"public","table":"t","parts":[{"wm":"0a","part":3,"changes":[{"op":"delete","old":{"id":1}}]}]}`,
		`{"schema":"public","table":"t","parts":[{"wm":"0a","part":0,"last":true,"changes":[]},{"wm":"0b","part":0,"last":true,"changes":[{"op":"truncate"}]}]}`,
		`{"parts":[{"wm":"0a","part":0,"changes":[{"op":"reset","reset":{"replicaVersion":"0a","publications":["p"],"systemID":"1","slot":"s"}}]}]}`,
		`{"schema":"public","table":"t","parts":[{"wm":"0a","part":0,"last":true,"changes":[{"op":"add-column","columns":["b"],"new":{"b":"x"},"spec":{"schema":"public","name":"t","columns":[{"name":"a","pos":1,"dataType":"int4","kind":"number"},{"name":"b","pos":2,"dataType":"text","kind":"string"}]}},{"op":"update-column","columns":["b","c"],"spec":{"schema":"public","name":"t","columns":[{"name":"a","pos":1,"dataType":"int4","kind":"number"},{"name":"c","pos":2,"dataType":"text","kind":"string"}]}},{"op":"drop-column","columns":["c"],"spec":{"schema":"public","name":"t","columns":[{"name":"a","pos":1,"dataType":"int4","kind":"number"}]}},{"op":"drop-index","index":{"schema":"public","tableName":"t","name":"t_a","unique":false,"columns":null}},{"op":"rename-table","spec":{"schema":"public","name":"u","columns":[{"name":"a","pos":1,"dataType":"int4","kind":"number"}]}},{"op":"drop-table"}]}]}`,
	}
	for _, s := range good {
		m, err := Decode([]byte(s))
		if err != nil {
			t.Errorf("Decode(%s) = %v", s, err)
			continue
		}
		b, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		m2, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode) = %v", err)
		}
		b2, _ := Encode(m2)
		if string(b) != string(b2) {
			t.Errorf("round trip changed %s into %s", b, b2)
		}
	}
	bad := []string{
		``, `{}`, `{"parts":[]}`, `[1]`,
		`{"table":"t","parts":[{"wm":"x","part":0,"changes":[]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"nope"}]}]}`,
		`{"parts":[{"wm":"0a","part":0,"changes":[{"op":"insert","new":{}}]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"insert"}]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[]},{"wm":"0b","part":0,"changes":[]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"last":true,"changes":[]},{"wm":"0b","part":0,"changes":[]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":3,"last":true,"changes":[]},{"wm":"0b","part":0,"last":true,"changes":[]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"last":true,"changes":[]},{"wm":"09","part":0,"changes":[]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"backfill","columns":["a"],"rows":[[1,2]]}]}]}`,
		// Schema changes: outside a table, without a spec, or with a spec
		// that contradicts the change.
		`{"parts":[{"wm":"0a","part":0,"changes":[{"op":"drop-table"}]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"rename-table"}]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"add-column","columns":["b"],"spec":{"name":"t","columns":[{"name":"a"}]}}]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"add-column","columns":["a"],"new":{"b":1},"spec":{"name":"t","columns":[{"name":"a"}]}}]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"drop-column","columns":["a"],"spec":{"name":"t","columns":[{"name":"a"}]}}]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"update-column","columns":["a"],"spec":{"name":"t","columns":[{"name":"a"}]}}]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"drop-column","columns":["b"],"new":{"b":1},"spec":{"name":"t","columns":[{"name":"a"}]}}]}]}`,
		`{"table":"t","parts":[{"wm":"0a","part":0,"changes":[{"op":"drop-index","index":{"schema":"public"}}]}]}`,
	}
	for _, s := range bad {
		if _, err := Decode([]byte(s)); !errors.Is(err, ErrMalformed) {
			t.Errorf("Decode(%s) = %v; want ErrMalformed", s, err)
		}
	}
}

func TestValue(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want any
	}{
		{`null`, nil}, {`true`, int64(1)}, {`false`, int64(0)}, {`"x\u00e9"`, "xé"},
		{`9007199254740993`, int64(9007199254740993)}, {`1.5`, 1.5}, {`1e3`, 1000.0},
		{`{"a": [1]}`, `{"a": [1]}`}, {`[1,2]`, `[1,2]`},
	} {
		got, err := Value(json.RawMessage(tc.in))
		if err != nil || got != tc.want {
			t.Errorf("Value(%s) = %#v, %v; want %#v", tc.in, got, err, tc.want)
		}
	}
	if _, err := Value(json.RawMessage(`1x`)); err == nil {
		t.Error("Value(1x) succeeded")
	}
}

func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"schema":"public","table":"t","parts":[{"wm":"0a","prev":"09","part":0,"last":true,"changes":[{"op":"insert","new":{"id":1}}]}]}`))
	f.Add([]byte(`{"parts":[{"wm":"0a","part":0,"changes":[{"op":"reset","reset":{"replicaVersion":"0a","publications":["p"],"systemID":"1","slot":"s"}}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			return
		}
		b, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode of a decoded message: %v", err)
		}
		if _, err := Decode(b); err != nil {
			t.Fatalf("Decode(Encode(m)) = %v", err)
		}
	})
}

func TestValueOverflow(t *testing.T) {
	big := "1e400"
	got, err := Value(json.RawMessage(big))
	if err != nil {
		t.Fatalf("Value(%s) = %v", big, err)
	}
	if f, ok := got.(float64); !ok || f < 1e308 {
		t.Errorf("Value(%s) = %v; want +Inf", big, got)
	}
}

func TestEncodeKeepsHTML(t *testing.T) {
	m := &Message{Schema: "public", Table: "t", Parts: []Part{{Watermark: "0a", Last: true, Changes: []Change{
		{Op: OpInsert, New: Row{"body": json.RawMessage(`"<b>&</b>"`)}},
	}}}}
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"body":"<b>&</b>"`; !bytes.Contains(b, []byte(want)) {
		t.Errorf("Encode = %s; want it to contain %s", b, want)
	}
	if b[len(b)-1] == '\n' {
		t.Error("Encode left a trailing newline")
	}
}

func TestNewMsg(t *testing.T) {
	s := Shard{App: "zero"}
	m := &Message{Schema: "public", Table: "issue", Parts: []Part{
		{Watermark: "0a", Last: true, Changes: []Change{}},
		{Watermark: "0b", Last: true, Changes: []Change{}},
	}}
	msg, err := NewMsg(s, m, "09")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{HeaderMsgID: "0a:0", HeaderWatermark: "0b", HeaderPart: "0", HeaderCommit: "0b", HeaderReplicaVersion: "09"}
	for k, v := range want {
		if got := msg.Header.Get(k); got != v {
			t.Errorf("header %s = %q; want %q", k, got, v)
		}
	}
	if msg.Subject != "jetsync.zero_0.changes.public.issue" {
		t.Errorf("subject = %q", msg.Subject)
	}
	tx, err := NewMsg(s, &Message{Parts: []Part{{Watermark: "0c", Num: 3, Changes: []Change{}}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if tx.Subject != s.TxSubject() || tx.Header.Get(HeaderCommit) != "" || tx.Header.Get(HeaderPart) != "3" {
		t.Errorf("tx message: subject %q, headers %v", tx.Subject, tx.Header)
	}
}
