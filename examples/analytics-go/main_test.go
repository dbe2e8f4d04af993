package main

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/jetsync/jetsync/streams"
)

// The counting rules without a server: messages go through Encode and
// Decode as they would over NATS. e2e/examples_test.go runs the program
// against jetsync itself.

func newTestAnalytics() *analytics {
	return &analytics{st: &state{Tables: map[string]*counts{}}, rate: newRate(time.Minute)}
}

// feed encodes, decodes and applies m as message seq.
func feed(t *testing.T, a *analytics, seq uint64, m *streams.Message) error {
	t.Helper()
	data, err := streams.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	d, err := streams.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	return a.apply(seq, d)
}

func mustFeed(t *testing.T, a *analytics, seq uint64, m *streams.Message) {
	t.Helper()
	if err := feed(t, a, seq, m); err != nil {
		t.Fatalf("message %d: %v", seq, err)
	}
}

func row(kv ...string) streams.Row {
	r := streams.Row{}
	for i := 0; i < len(kv); i += 2 {
		r[kv[i]] = json.RawMessage(kv[i+1])
	}
	return r
}

var issueSpec = &streams.TableSpec{Schema: "public", Name: "issue", PrimaryKey: []string{"id"},
	Columns: []streams.ColumnSpec{{Name: "id", Pos: 1, DataType: "text", Kind: streams.KindString}}}

// initialSync is the history's start at replica version 0a: a reset, one
// table with three rows, and the empty last part.
func initialSync(t *testing.T, a *analytics) {
	t.Helper()
	mustFeed(t, a, 1, &streams.Message{Parts: []streams.Part{{Watermark: "0a", Num: 0, Changes: []streams.Change{
		{Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: "0a", Publications: []string{"p"}, SystemID: "1", Slot: "s"}}}}}})
	mustFeed(t, a, 2, &streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{{Watermark: "0a", Num: 1, Changes: []streams.Change{
		{Op: streams.OpCreateTable, Spec: issueSpec},
		{Op: streams.OpBackfill, Columns: []string{"id"}, Rows: [][]json.RawMessage{{json.RawMessage(`"a"`)}, {json.RawMessage(`"b"`)}, {json.RawMessage(`"c"`)}}}}}}})
	mustFeed(t, a, 3, &streams.Message{Parts: []streams.Part{{Watermark: "0a", Num: 2, Last: true, Changes: []streams.Change{}}}})
}

func TestApply_CountsCompleteTransactions(t *testing.T) {
	a := newTestAnalytics()
	initialSync(t, a)
	if a.st.Seq != 3 || a.st.Watermark != "0a" || a.st.ReplicaVersion != "0a" || a.st.Resets != 1 || a.st.Transactions != 1 {
		t.Fatalf("after the initial sync: %+v", a.st)
	}
	if got := *a.st.Tables["public.issue"]; got != (counts{Backfill: 3}) {
		t.Fatalf("issue after the initial sync: %+v", got)
	}

	// Two transactions packed in one message, as a busy producer does.
	mustFeed(t, a, 4, &streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{
		{Watermark: "0b", Prev: "0a", Num: 0, Last: true, CommitTimeMs: float64(time.Now().UnixMilli()), Changes: []streams.Change{
			{Op: streams.OpInsert, New: row("id", `"d"`)}, {Op: streams.OpInsert, New: row("id", `"e"`)}}},
		{Watermark: "0c", Prev: "0b", Num: 0, Last: true, CommitTimeMs: float64(time.Now().UnixMilli()), Changes: []streams.Change{
			{Op: streams.OpUpdate, New: row("id", `"d"`)}, {Op: streams.OpDelete, Old: row("id", `"a"`)}}},
	}})
	if got := *a.st.Tables["public.issue"]; got != (counts{Insert: 2, Update: 1, Delete: 1, Backfill: 3}) {
		t.Errorf("issue: %+v", got)
	}
	if a.st.Watermark != "0c" || a.st.Seq != 4 || a.st.Transactions != 3 {
		t.Errorf("position: %+v", a.st)
	}
	if r := a.rate.perSec(time.Now()); r != 4.0/60 {
		t.Errorf("rate %v; want 4 changes over a minute", r)
	}
}

func TestApply_HoldsAPartialTransaction(t *testing.T) {
	a := newTestAnalytics()
	initialSync(t, a)
	// One transaction over two tables: its last part is on the tx subject.
	mustFeed(t, a, 4, &streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{
		{Watermark: "0b", Prev: "0a", Num: 0, Changes: []streams.Change{{Op: streams.OpInsert, New: row("id", `"d"`)}}}}})
	mustFeed(t, a, 5, &streams.Message{Schema: "public", Table: "comment", Parts: []streams.Part{
		{Watermark: "0b", Num: 1, Changes: []streams.Change{{Op: streams.OpDelete, Old: row("id", `"x"`)}}}}})
	if a.st.Seq != 3 || a.st.Watermark != "0a" || a.st.Tables["public.comment"] != nil || a.st.Tables["public.issue"].Insert != 0 {
		t.Fatalf("a transaction in hand reached the state: %+v", a.st)
	}
	mustFeed(t, a, 6, &streams.Message{Parts: []streams.Part{{Watermark: "0b", Num: 2, Last: true, Changes: []streams.Change{}}}})
	if a.st.Seq != 6 || a.st.Watermark != "0b" || a.st.Tables["public.issue"].Insert != 1 || a.st.Tables["public.comment"].Delete != 1 {
		t.Errorf("after the last part: %+v %+v", a.st, a.st.Tables["public.comment"])
	}
}

func TestApply_SkipsRedeliveries(t *testing.T) {
	a := newTestAnalytics()
	initialSync(t, a)
	m := &streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{
		{Watermark: "0b", Prev: "0a", Num: 0, Last: true, Changes: []streams.Change{{Op: streams.OpInsert, New: row("id", `"d"`)}}}}}
	mustFeed(t, a, 4, m)
	mustFeed(t, a, 4, m)
	mustFeed(t, a, 2, m)
	if got := a.st.Tables["public.issue"].Insert; got != 1 {
		t.Errorf("%d inserts after redeliveries; want 1", got)
	}
}

func TestApply_StopsOnAGap(t *testing.T) {
	cases := map[string]*streams.Message{
		"prev is not the watermark": {Schema: "public", Table: "issue", Parts: []streams.Part{
			{Watermark: "0c", Prev: "0b", Num: 0, Last: true, Changes: []streams.Change{{Op: streams.OpInsert, New: row("id", `"d"`)}}}}},
		"a part without part 0": {Schema: "public", Table: "issue", Parts: []streams.Part{
			{Watermark: "0b", Num: 1, Last: true, Changes: []streams.Change{{Op: streams.OpInsert, New: row("id", `"d"`)}}}}},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			a := newTestAnalytics()
			initialSync(t, a)
			var gap *GapError
			if err := feed(t, a, 4, m); !errors.As(err, &gap) {
				t.Fatalf("err %v; want a GapError", err)
			}
			if a.st.Tables["public.issue"].Insert != 0 || a.st.Seq != 3 {
				t.Errorf("a gap was counted: %+v", a.st)
			}
		})
	}
	t.Run("a part out of order", func(t *testing.T) {
		a := newTestAnalytics()
		initialSync(t, a)
		mustFeed(t, a, 4, &streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{
			{Watermark: "0b", Prev: "0a", Num: 0, Changes: []streams.Change{{Op: streams.OpInsert, New: row("id", `"d"`)}}}}})
		var gap *GapError
		err := feed(t, a, 5, &streams.Message{Parts: []streams.Part{{Watermark: "0b", Num: 2, Last: true, Changes: []streams.Change{}}}})
		if !errors.As(err, &gap) {
			t.Fatalf("err %v; want a GapError", err)
		}
	})
}

func TestApply_JoinsFragments(t *testing.T) {
	a := newTestAnalytics()
	initialSync(t, a)
	big := &streams.Change{Op: streams.OpInsert, New: row("id", `"big"`, "body", `"lorem ipsum dolor sit amet, consectetur adipiscing elit"`)}
	frags, err := streams.Fragment(big, 40)
	if err != nil {
		t.Fatal(err)
	}
	if len(frags) < 3 {
		t.Fatalf("%d fragments; the test wants several", len(frags))
	}
	for i := range frags {
		p := streams.Part{Watermark: "0b", Num: i, Last: i == len(frags)-1, Changes: []streams.Change{frags[i]}}
		if i == 0 {
			p.Prev = "0a"
		}
		mustFeed(t, a, uint64(4+i), &streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{p}})
	}
	if got := a.st.Tables["public.issue"].Insert; got != 1 {
		t.Errorf("%d inserts from %d fragments; want 1", got, len(frags))
	}
}

func TestApply_ResetStartsANewHistory(t *testing.T) {
	a := newTestAnalytics()
	initialSync(t, a)
	// A transaction in hand when a reset comes is superseded.
	mustFeed(t, a, 4, &streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{
		{Watermark: "0b", Prev: "0a", Num: 0, Changes: []streams.Change{{Op: streams.OpInsert, New: row("id", `"d"`)}}}}})
	mustFeed(t, a, 5, &streams.Message{Parts: []streams.Part{{Watermark: "0f", Num: 0, Changes: []streams.Change{
		{Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: "0f", Publications: []string{"p"}, SystemID: "1", Slot: "s"}}}}}})
	mustFeed(t, a, 6, &streams.Message{Parts: []streams.Part{{Watermark: "0f", Num: 1, Last: true, Changes: []streams.Change{}}}})
	if a.st.Watermark != "0f" || a.st.ReplicaVersion != "0f" || a.st.Resets != 2 || a.st.Tables["public.issue"].Insert != 0 {
		t.Errorf("after a second reset: %+v", a.st)
	}
	// The chain goes on from the new replica version.
	mustFeed(t, a, 7, &streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{
		{Watermark: "0g", Prev: "0f", Num: 0, Last: true, Changes: []streams.Change{{Op: streams.OpDelete, Old: row("id", `"a"`)}}}}})
	if a.st.Tables["public.issue"].Delete != 1 {
		t.Errorf("issue after the reset: %+v", a.st.Tables["public.issue"])
	}
}

func TestState_SaveAndLoad(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state.json")
	st, err := loadState(file)
	if err != nil || st.Seq != 0 || len(st.Tables) != 0 {
		t.Fatalf("no file: %+v, %v", st, err)
	}
	st.Seq, st.Watermark = 42, "0x"
	st.Tables["public.issue"] = &counts{Insert: 1, Update: 2, Delete: 3}
	if err := st.save(file); err != nil {
		t.Fatal(err)
	}
	back, err := loadState(file)
	if err != nil {
		t.Fatal(err)
	}
	if back.Seq != 42 || back.Watermark != "0x" || *back.Tables["public.issue"] != (counts{Insert: 1, Update: 2, Delete: 3}) {
		t.Errorf("loaded %+v", back)
	}
}
