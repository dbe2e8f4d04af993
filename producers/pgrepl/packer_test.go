package pgrepl

import (
	"encoding/json"
	"fmt"
	"slices"
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

// A change bigger than a message travels as fragments, each in a part of
// its own, cut the same way wherever the transaction falls.
func TestPacker_Fragments(t *testing.T) {
	sh := streams.Shard{App: "zero"}
	long := &tableRef{Schema: strings.Repeat("s", 63), Name: strings.Repeat("\"", 63)}
	long.subject = sh.TableSubject(long.Schema, long.Name)
	refs := testRefs(sh)
	// 3 MB whose escapes cost more than its bytes: quotes double.
	body, _ := json.Marshal(strings.Repeat(`x"é😀`, 3<<20/8))
	big := streams.Change{Op: streams.OpInsert, New: streams.Row{"id": json.RawMessage(`1`), "body": body}}
	small := func(id int) streams.Change {
		return streams.Change{Op: streams.OpInsert, New: streams.Row{"id": json.RawMessage(fmt.Sprint(id))}}
	}
	type ch struct {
		t *tableRef
		c streams.Change
	}
	run := func(p *packer, lsn uint64, changes ...ch) []*outMsg {
		p.begin(streams.Lexi(lsn))
		for _, c := range changes {
			p.add(c.t, c.c, changeSize(&c.c))
		}
		p.commit(1, pglogrepl.LSN(lsn+1))
		p.flush()
		return p.take()
	}
	for _, tc := range []struct {
		name    string
		changes []ch
	}{
		{"Alone", []ch{{refs["a"], big}}},
		{"Between", []ch{{refs["a"], small(1)}, {refs["a"], big}, {refs["a"], small(2)}}},
		{"MultiTable", []ch{{refs["b"], small(1)}, {refs["a"], big}, {refs["b"], small(2)}}},
		{"LongNames", []ch{{long, big}, {long, big}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			alone := run(&packer{shard: sh}, 100, tc.changes...)
			p := &packer{shard: sh}
			p.begin(streams.Lexi(10))
			c := small(0)
			p.add(refs["a"], c, changeSize(&c))
			p.commit(1, 11)
			after := run(p, 100, tc.changes...)
			if diff := cmp.Diff(summary(alone), summary(after)[len(after)-len(alone):]); diff != "" {
				t.Errorf("parts differ after a packed transaction (-alone +after):\n%s", diff)
			}
			var a streams.Assembler
			var got []streams.Change
			frags := 0
			for i, m := range alone {
				b, err := streams.Encode(&m.msg)
				if err != nil {
					t.Fatal(err)
				}
				if len(b) > streams.MaxMessageBytes {
					t.Errorf("message %d %s is %d bytes", i, summary([]*outMsg{m}), len(b))
				}
				am := after[len(after)-len(alone)+i].msg
				if i == 0 {
					am.Parts = slices.Clone(am.Parts)
					am.Parts[0].Prev = m.first().Prev
				}
				if bb, _ := streams.Encode(&am); string(bb) != string(b) {
					t.Errorf("message %d differs after a packed transaction", i)
				}
				dm, err := streams.Decode(b)
				if err != nil {
					t.Fatal(err)
				}
				for j := range dm.Parts {
					for _, c := range dm.Parts[j].Changes {
						if c.Op == streams.OpFragment {
							frags++
							if len(dm.Parts[j].Changes) != 1 {
								t.Errorf("message %d: a fragment shares its part", i)
							}
						}
					}
					cs, err := a.Part(dm.Schema, dm.Table, &dm.Parts[j])
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, cs...)
				}
			}
			if frags < 6 {
				t.Errorf("%d fragments; want the 3 MB change cut into at least 6", frags)
			}
			var want []streams.Change
			for _, c := range tc.changes {
				want = append(want, c.c)
			}
			// cmp walks a 3 MB value byte by byte: compare encodings.
			enc := func(cs []streams.Change) string {
				b, _ := json.Marshal(cs)
				return string(b)
			}
			if enc(got) != enc(want) {
				t.Errorf("joined changes differ from those added (%d, want %d)", len(got), len(want))
			}
			if last := alone[len(alone)-1]; last.confirm != 101 || !last.last().Last {
				t.Errorf("last message %s confirms %d", summary([]*outMsg{last}), last.confirm)
			}
		})
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
