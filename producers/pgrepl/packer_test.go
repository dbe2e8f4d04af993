package pgrepl

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pglogrepl"

	"github.com/jetsync/jetsync/streams"
)

// ptx is a transaction fed to the packer in tests: its changes go to the
// named tables in order.
type ptx struct {
	lsn    uint64
	tables []string
	val    int // bytes of value per change
}

func feed(p *packer, refs map[string]*tableRef, txs []ptx, flushAfter bool) []*outMsg {
	var out []*outMsg
	for _, tx := range txs {
		p.begin(streams.Lexi(tx.lsn))
		for i, name := range tx.tables {
			c := streams.Change{Op: streams.OpInsert, New: streams.Row{
				"id": json.RawMessage(fmt.Sprint(i)),
				"v":  json.RawMessage(`"` + strings.Repeat("x", tx.val) + `"`),
			}}
			p.add(refs[name], c, changeSize(&c))
		}
		p.commit(1, pglogrepl.LSN(tx.lsn+1))
		if flushAfter {
			p.flush()
		}
		out = append(out, p.take()...)
	}
	p.flush()
	return append(out, p.take()...)
}

func testRefs(sh streams.Shard) map[string]*tableRef {
	refs := map[string]*tableRef{}
	for _, n := range []string{"a", "b"} {
		refs[n] = &tableRef{Schema: "public", Name: n, subject: sh.TableSubject("public", n)}
	}
	return refs
}

// summary renders messages as "subject:wm/part[L],..." for comparison.
func summary(ms []*outMsg) []string {
	var s []string
	for _, m := range ms {
		if len(m.msg.Parts) == 0 {
			s = append(s, fmt.Sprintf("confirm %d", m.confirm))
			continue
		}
		sub := m.msg.Table
		if sub == "" {
			sub = "tx"
		}
		var parts []string
		for _, p := range m.msg.Parts {
			l := ""
			if p.Last {
				l = "L"
			}
			parts = append(parts, fmt.Sprintf("%s/%d%s(%d)", p.Watermark, p.Num, l, len(p.Changes)))
		}
		s = append(s, sub+":"+strings.Join(parts, ","))
	}
	return s
}

func TestPacker(t *testing.T) {
	sh := streams.Shard{App: "zero"}
	w := func(n uint64) string { return streams.Lexi(n) }
	for _, tc := range []struct {
		name  string
		txs   []ptx
		flush bool
		want  []string
	}{
		{
			name: "PacksSameTable",
			txs:  []ptx{{lsn: 10, tables: []string{"a"}}, {lsn: 20, tables: []string{"a", "a"}}, {lsn: 30, tables: []string{"a"}}},
			want: []string{"a:" + w(10) + "/0L(1)," + w(20) + "/0L(2)," + w(30) + "/0L(1)"},
		},
		{
			name:  "NoPackingWhenIdle",
			txs:   []ptx{{lsn: 10, tables: []string{"a"}}, {lsn: 20, tables: []string{"a"}}},
			flush: true,
			want:  []string{"a:" + w(10) + "/0L(1)", "a:" + w(20) + "/0L(1)"},
		},
		{
			name: "TableSwitch",
			txs:  []ptx{{lsn: 10, tables: []string{"a"}}, {lsn: 20, tables: []string{"b"}}, {lsn: 30, tables: []string{"b"}}},
			want: []string{"a:" + w(10) + "/0L(1)", "b:" + w(20) + "/0L(1)," + w(30) + "/0L(1)"},
		},
		{
			name: "MultiTable",
			txs:  []ptx{{lsn: 10, tables: []string{"a"}}, {lsn: 20, tables: []string{"a", "b", "b"}}, {lsn: 30, tables: []string{"b"}}},
			want: []string{
				"a:" + w(10) + "/0L(1)", "a:" + w(20) + "/0(1)", "b:" + w(20) + "/1(2)", "tx:" + w(20) + "/2L(0)",
				"b:" + w(30) + "/0L(1)",
			},
		},
		{
			name: "EmptyTransaction",
			txs:  []ptx{{lsn: 10}, {lsn: 20, tables: []string{"a"}}, {lsn: 30}},
			want: []string{"confirm 11", "a:" + w(20) + "/0L(1)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &packer{shard: sh, prev: w(1)}
			got := feed(p, testRefs(sh), tc.txs, tc.flush)
			if diff := cmp.Diff(tc.want, summary(got)); diff != "" {
				t.Errorf("messages (-want +got):\n%s", diff)
			}
			prev := w(1)
			for _, m := range got {
				for _, part := range m.msg.Parts {
					if part.Num == 0 && part.Prev != prev {
						t.Errorf("%s/0: prev = %s; want %s", part.Watermark, part.Prev, prev)
					}
					if part.Last {
						prev = part.Watermark
					}
				}
			}
			if last := got[len(got)-1]; last.confirm != pglogrepl.LSN(tc.txs[len(tc.txs)-1].lsn+1) {
				t.Errorf("last message confirms %d; want %d", last.confirm, tc.txs[len(tc.txs)-1].lsn+1)
			}
		})
	}
}

// A split transaction's parts depend only on its own changes.
func TestPacker_SplitIsPure(t *testing.T) {
	sh := streams.Shard{App: "zero"}
	refs := testRefs(sh)
	big := ptx{lsn: 100, tables: make([]string, 300), val: 4000}
	for i := range big.tables {
		big.tables[i] = "a"
	}
	small := []ptx{{lsn: 10, tables: []string{"a"}, val: 100000}, {lsn: 20, tables: []string{"a"}, val: 100000}}

	alone := feed(&packer{shard: sh}, refs, []ptx{big}, false)
	after := feed(&packer{shard: sh}, refs, append(small, big), false)
	if len(alone) < 3 {
		t.Fatalf("big transaction in %d messages; want it split", len(alone))
	}
	if diff := cmp.Diff(summary(alone), summary(after[len(after)-len(alone):])); diff != "" {
		t.Errorf("parts differ after packed transactions (-alone +after):\n%s", diff)
	}
	if got := summary(after[:len(after)-len(alone)]); len(got) != 1 {
		t.Errorf("small transactions in %v; want one packed message", got)
	}
	for _, m := range after {
		b, err := streams.Encode(&m.msg)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > streams.MaxMessageBytes {
			t.Errorf("message %s is %d bytes", summary([]*outMsg{m}), len(b))
		}
	}
}

func TestJSONStringSize(t *testing.T) {
	for _, s := range []string{"", "abc", `a"b\c`, "<&>", "\x01\n\t", "é\u2028", "\xff"} {
		b, _ := json.Marshal(s)
		if got := jsonStringSize(s); got != len(b) {
			t.Errorf("jsonStringSize(%q) = %d; want %d", s, got, len(b))
		}
	}
}

func TestRawJSONSize(t *testing.T) {
	for _, s := range []string{`"abc"`, `"<a href=\"x\">&amp;</a>"`, "\"\u2028 \u2029 \u2027\"", `{"a": [1, 2]}`} {
		b, err := json.Marshal(json.RawMessage(s))
		if err != nil {
			t.Fatal(err)
		}
		if got := rawJSONSize(json.RawMessage(s)); got < len(b) {
			t.Errorf("rawJSONSize(%s) = %d; encoded is %d bytes", s, got, len(b))
		}
	}
}

func TestSlotSuffix(t *testing.T) {
	for i, want := range map[int]string{0: "a", 25: "z", 26: "aa", 27: "ab", 51: "az", 52: "ba", 701: "zz", 702: "aaa"} {
		if got := slotSuffix(i); got != want {
			t.Errorf("slotSuffix(%d) = %q; want %q", i, got, want)
		}
	}
}
