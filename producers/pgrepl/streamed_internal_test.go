package pgrepl

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

// In-stream forms of pgoutput protocol 2 messages.
func withXid(xid uint32, msg []byte) []byte {
	b := append([]byte{msg[0]}, binary.BigEndian.AppendUint32(nil, xid)...)
	return append(b, msg[1:]...)
}

func pgStreamStart(xid uint32, first bool) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'S'}, xid)
	if first {
		return append(b, 1)
	}
	return append(b, 0)
}

func pgStreamCommit(xid uint32, lsn uint64) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'c'}, xid)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = binary.BigEndian.AppendUint64(b, lsn+8)
	return binary.BigEndian.AppendUint64(b, 0)
}

func pgStreamAbort(xid, sub uint32) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'A'}, xid)
	return binary.BigEndian.AppendUint32(b, sub)
}

// streamRig feeds XLogData payloads as the reader does.
type streamRig struct {
	s   *Source
	st  *streamedTxs
	dec *decoder
	evs []event
}

func newStreamRig(t *testing.T) *streamRig {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &streamRig{
		s:   &Source{m: m, log: log},
		st:  newStreamedTxs(t.TempDir()),
		dec: newDecoder(streams.Shard{App: "zero"}, pgvalue.NewRegistry(), nil, log),
	}
	t.Cleanup(r.st.close)
	return r
}

// feed is one XLogData payload.
func (r *streamRig) feed(data []byte) error {
	emit := func(ev event) error { r.evs = append(r.evs, ev); return nil }
	return r.s.walData(context.Background(), r.st, r.dec, 0, data, emit)
}

// summary renders the events as "B wm", "I id", "C wm".
func (r *streamRig) summary() []string {
	var out []string
	for _, ev := range r.evs {
		switch ev.kind {
		case evBegin:
			out = append(out, "B "+ev.wm)
		case evCommit:
			out = append(out, "C "+ev.wm)
		case evChange:
			s := string(ev.change.Op) + " " + ev.table.Name
			if ev.change.New != nil {
				s += " " + string(ev.change.New["id"])
			}
			out = append(out, s)
		}
	}
	return out
}

func TestStreamedTxs_Replay(t *testing.T) {
	r := newStreamRig(t)
	cols := []pgCol{{"id", pgtype.Int8OID, true}, {"t", pgtype.TextOID, false}}
	rel := pgRelation(1, "public", "a", cols)
	rel2 := pgRelation(2, "public", "b", cols)
	const top, sub, sub2 = 700, 701, 702
	for i, msg := range [][]byte{
		// Two transactions, blocks interleaved; 701 and 702 are
		// subtransactions of 700.
		pgStreamStart(top, true),
		{'O', 0, 0, 0, 0, 0, 0, 0, 0, 'x', 0}, // an origin, without xid
		withXid(top, rel),
		withXid(top, pgInsert(1, "1", "kept")),
		withXid(sub, rel2), // sent in a subtransaction that rolls back: still counts
		withXid(sub, pgInsert(2, "2", "rolled back")),
		{'E'},
		pgStreamStart(800, true),
		withXid(800, rel),
		withXid(800, pgInsert(1, "80", "aborted whole")),
		{'E'},
		pgStreamStart(top, false),
		withXid(sub2, pgInsert(2, "3", "kept")), // Relation 2 came in 701's block
		withXid(sub, pgDelete(1, "1")),
		{'E'},
		pgStreamAbort(top, sub),
		pgStreamAbort(800, 800),
		// A plain transaction commits meanwhile.
		rel,
		pgBegin(0x100),
		pgInsert(1, "9", "plain"),
		pgCommit(0x100),
		pgStreamCommit(top, 0x200),
	} {
		if err := r.feed(msg); err != nil {
			t.Fatalf("message %d (%q): %v", i, msg[0], err)
		}
	}
	got := r.summary()
	want := []string{
		"B " + streams.Lexi(0x100), "insert a 9", "C " + streams.Lexi(0x100),
		"B " + streams.Lexi(0x200), "insert a 1", "insert b 3", "C " + streams.Lexi(0x200),
	}
	if !slices.Equal(got, want) {
		t.Errorf("events\n%q\nwant\n%q", got, want)
	}
	if len(r.st.txs) != 0 {
		t.Errorf("%d streamed transactions still held", len(r.st.txs))
	}
	if err := r.feed(pgStreamCommit(800, 0x300)); err == nil {
		t.Error("the commit of a transaction streamed and aborted: no error")
	}
}

// TestStreamedTxs_BadInput: a stream out of protocol is an error, never a
// panic.
func TestStreamedTxs_BadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		msgs [][]byte
		want string
	}{
		{"StopOutsideBlock", [][]byte{{'E'}}, "outside a stream block"},
		{"NestedStart", [][]byte{pgStreamStart(1, true), pgStreamStart(2, true)}, "inside a stream block"},
		{"BeginInBlock", [][]byte{pgStreamStart(1, true), pgBegin(0x10)}, "inside a stream block"},
		{"FirstTwice", [][]byte{pgStreamStart(1, true), {'E'}, pgStreamStart(1, true)}, "started twice"},
		{"UnknownSegment", [][]byte{pgStreamStart(1, false)}, "never saw"},
		{"UnknownCommit", [][]byte{pgStreamCommit(9, 0x10)}, "never saw streamed"},
		{"ShortMessage", [][]byte{pgStreamStart(1, true), {'I', 0, 0}}, "too short"},
		{"TruncatedCommit", [][]byte{{'c', 0, 0, 0, 1, 0}}, "StreamCommit"},
		{"TruncatedStart", [][]byte{{'S', 0}}, "StreamStart"},
		{"BadReplayedMessage", [][]byte{pgStreamStart(1, true), withXid(1, []byte{'I', 0, 0, 0, 1}), {'E'}, pgStreamCommit(1, 0x10)}, "xid 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newStreamRig(t)
			var err error
			for _, m := range tc.msgs {
				if err = r.feed(m); err != nil {
					break
				}
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want one containing %q", err, tc.want)
			}
		})
	}
}
