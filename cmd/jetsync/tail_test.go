package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

var testShard = streams.Shard{App: "zero", Num: 0}

// publish puts m on its table's subject, or the tx subject, with the headers
// the contract requires, and returns its stream sequence.
func publish(t *testing.T, js jetstream.JetStream, m *streams.Message) uint64 {
	t.Helper()
	msg, err := streams.NewMsg(testShard, m, "")
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatalf("publish %s: %v", msg.Subject, err)
	}
	return ack.Sequence
}

func rowMsg(table string, wm uint64, op streams.Op, row string) *streams.Message {
	var r streams.Row
	if err := json.Unmarshal([]byte(row), &r); err != nil {
		panic(err)
	}
	c := streams.Change{Op: op, New: r}
	if op == streams.OpDelete {
		c = streams.Change{Op: op, Old: r}
	}
	return &streams.Message{Schema: "public", Table: table, Parts: []streams.Part{{
		Watermark: streams.Lexi(wm), Num: 0, Last: true, Changes: []streams.Change{c},
	}}}
}

// syncBuffer is a bytes.Buffer that a command writes while a test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startStream(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	ns := natstest.Start(t)
	_, js := natstest.Connect(t, ns)
	if _, _, err := streams.Ensure(context.Background(), js, streams.Config{Shard: testShard}); err != nil {
		t.Fatal(err)
	}
	return ns.ClientURL(), js
}

func decodeLines(t *testing.T, out string) []event {
	t.Helper()
	var evs []event
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var ev event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestTail(t *testing.T) {
	url, js := startStream(t)
	publish(t, js, rowMsg("issue", 100, streams.OpInsert, `{"id":"old"}`)) // before tail: not shown
	base := uint64(0)

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"JSON", []string{"--json"}, `"op":"insert"`},
		{"Text", nil, `table=public.issue op=update new={"id":"i1","title":"héllo"}`},
		{"Table", []string{"--table", "issue", "--json"}, `"table":"issue"`},
	} {
		base += 1000 // Nats-Msg-Id dedup would drop a repeat
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr syncBuffer
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan int, 1)
			go func() {
				done <- mainExit(ctx, append([]string{"tail", "--nats-url", url}, tc.args...), &stdout, &stderr)
			}()
			polltest.Until(t, 10*time.Second, "tail to subscribe", func() bool { return strings.Contains(stderr.String(), "tailing") })
			publish(t, js, rowMsg("comment", base+1, streams.OpInsert, `{"id":"c1"}`))
			publish(t, js, rowMsg("issue", base+2, streams.OpUpdate, `{"id":"i1","title":"héllo"}`))
			// A transaction spanning subjects ends on the tx subject, which a
			// one-table tail follows too.
			publish(t, js, &streams.Message{Parts: []streams.Part{{Watermark: streams.Lexi(base + 3), Num: 1, Last: true, Changes: []streams.Change{}}}})
			polltest.Until(t, 10*time.Second, "the issue change and the commit", func() bool {
				out := stdout.String()
				return strings.Contains(out, "i1") && strings.Contains(out, "commit")
			})
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("tail exit %d; stderr:\n%s", code, stderr.String())
			}
			out := stdout.String()
			if !strings.Contains(out, tc.want) {
				t.Errorf("tail output lacks %q:\n%s", tc.want, out)
			}
			if strings.Contains(out, `"old"`) {
				t.Errorf("tail printed a message from before it started:\n%s", out)
			}
			if tc.name == "Table" && strings.Contains(out, "c1") {
				t.Errorf("tail --table issue printed a comment:\n%s", out)
			}
		})
	}
}

func TestReplay(t *testing.T) {
	url, js := startStream(t)
	s1 := publish(t, js, rowMsg("issue", 100, streams.OpInsert, `{"id":"a"}`))
	publish(t, js, rowMsg("comment", 200, streams.OpInsert, `{"id":"b"}`))
	s3 := publish(t, js, rowMsg("issue", 300, streams.OpUpdate, `{"id":"c"}`))
	// Two transactions packed in one message: a watermark range cuts it.
	packed := rowMsg("issue", 400, streams.OpInsert, `{"id":"d"}`)
	packed.Parts = append(packed.Parts, rowMsg("issue", 500, streams.OpDelete, `{"id":"e"}`).Parts[0])
	publish(t, js, packed)

	ids := func(evs []event) string {
		var out []string
		for _, ev := range evs {
			r := ev.New
			if r == nil {
				r = ev.Old
			}
			out = append(out, strings.Trim(string(r["id"]), `"`))
		}
		return strings.Join(out, ",")
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"All", nil, "a,b,c,d,e"},
		{"Table", []string{"--table", "public.issue"}, "a,c,d,e"},
		{"FromSeq", []string{"--from", "2"}, "b,c,d,e"},
		{"ToSeq", []string{"--from", "seq:1", "--to", "seq:3"}, "a,b,c"},
		{"TableToSeq", []string{"--table", "comment", "--to", "1"}, ""},
		{"FromWatermark", []string{"--from", "wm:" + streams.Lexi(200)}, "b,c,d,e"},
		{"BetweenWatermarks", []string{"--from", "wm:" + streams.Lexi(150), "--to", streams.Lexi(400)}, "b,c,d"},
		{"FromTime", []string{"--from", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}, ""},
		{"ToTime", []string{"--to", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr syncBuffer
			code := mainExit(context.Background(), append([]string{"replay", "--json", "--nats-url", url}, tc.args...), &stdout, &stderr)
			if code != 0 {
				t.Fatalf("replay exit %d; stderr:\n%s", code, stderr.String())
			}
			if got := ids(decodeLines(t, stdout.String())); got != tc.want {
				t.Errorf("replay %v printed %q; want %q\n%s", tc.args, got, tc.want, stdout.String())
			}
		})
	}
	t.Run("SeqAndTimeFields", func(t *testing.T) {
		var stdout, stderr syncBuffer
		if code := mainExit(context.Background(), []string{"replay", "--json", "--nats-url", url, "--to", "3"}, &stdout, &stderr); code != 0 {
			t.Fatalf("replay exit %d: %s", code, stderr.String())
		}
		evs := decodeLines(t, stdout.String())
		if len(evs) != 3 || evs[0].Seq != s1 || evs[2].Seq != s3 || evs[0].Time.IsZero() || evs[0].Watermark != streams.Lexi(100) || !evs[0].Last {
			t.Errorf("replay events = %+v; want seqs %d..%d with times and watermarks", evs, s1, s3)
		}
	})
}

func TestFormatText(t *testing.T) {
	ev := event{Seq: 7, Watermark: "0a", Part: 1, Last: true, Schema: "public", Table: "issue", Op: streams.OpUpdate,
		New: streams.Row{"id": json.RawMessage(`"i1"`), "n": json.RawMessage(`2`)}, Old: streams.Row{"id": json.RawMessage(`"i0"`)}}
	want := `seq=7 wm=0a part=1 last=true table=public.issue op=update new={"id":"i1","n":2} old={"id":"i0"}` + "\n"
	if got := formatText(&ev); got != want {
		t.Errorf("formatText = %q; want %q", got, want)
	}
	commit := event{Seq: 8, Watermark: "0b", Op: opCommit}
	if got, want := formatText(&commit), "seq=8 wm=0b part=0 table=- op=commit\n"; got != want {
		t.Errorf("formatText = %q; want %q", got, want)
	}
}

func TestPrinter_Backfill(t *testing.T) {
	var buf bytes.Buffer
	p := newPrinter(&buf, true)
	m := &streams.Message{Schema: "public", Table: "label", Parts: []streams.Part{{
		Watermark: streams.Lexi(5), Changes: []streams.Change{{
			Op: streams.OpBackfill, Columns: []string{"id", "name"},
			Rows: [][]json.RawMessage{{[]byte(`"l1"`), []byte(`"bug"`)}, {[]byte(`"l2"`), []byte(`null`)}},
		}},
	}}}
	if err := p.message(1, time.Unix(0, 0), m); err != nil {
		t.Fatal(err)
	}
	evs := decodeLines(t, buf.String())
	if len(evs) != 2 || string(evs[1].New["name"]) != "null" || string(evs[0].New["id"]) != `"l1"` {
		t.Errorf("backfill printed %s; want one row per line", buf.String())
	}
}

func TestPrinter_Fragments(t *testing.T) {
	big := streams.Change{Op: streams.OpInsert, New: streams.Row{"id": json.RawMessage(`"i1"`), "body": json.RawMessage(`"` + strings.Repeat("x", 1000) + `"`)}}
	frags, err := streams.Fragment(&big, 300)
	if err != nil || len(frags) < 3 {
		t.Fatalf("Fragment = %d, %v", len(frags), err)
	}
	msgs := make([]*streams.Message, len(frags))
	for i := range frags {
		msgs[i] = &streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{{
			Watermark: streams.Lexi(5), Num: i, Last: i == len(frags)-1, Changes: frags[i : i+1],
		}}}
	}
	for _, tc := range []struct {
		name string
		from int
		want []streams.Op
	}{
		{"Whole", 0, []streams.Op{streams.OpInsert}},
		{"FromMiddle", 1, slices.Repeat([]streams.Op{streams.OpFragment}, len(frags)-1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			p := newPrinter(&buf, true)
			for i, m := range msgs[tc.from:] {
				if err := p.message(uint64(i+1), time.Unix(0, 0), m); err != nil {
					t.Fatal(err)
				}
			}
			evs := decodeLines(t, buf.String())
			var ops []streams.Op
			for _, ev := range evs {
				ops = append(ops, ev.Op)
			}
			if !slices.Equal(ops, tc.want) {
				t.Fatalf("printed ops %v; want %v", ops, tc.want)
			}
			if tc.from == 0 && (len(evs[0].New["body"]) != 1002 || !evs[0].Last) {
				t.Errorf("joined insert printed as %+v", evs[0])
			}
		})
	}
}
