package pgrepl

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pglogrepl"
)

// Postgres streams a transaction before its commit once its decoded changes
// outgrow logical_decoding_work_mem (pgoutput protocol 2, streaming on):
// blocks of its changes, between stream start and stop, interleaved with
// other transactions, then a stream commit or abort. The change stream
// takes only committed transactions, whole and in commit order, so each
// streamed transaction waits in a file of its own, as the raw pgoutput
// messages, and is decoded like any other transaction at its commit. The
// producer's memory stays bounded by a write buffer per open transaction,
// whatever their size.
//
// Nothing of a streamed transaction is published before its commit, so the
// confirmation rule is unchanged. Postgres resends a streamed transaction
// whole, from its first block, to a session that did not confirm its
// commit; the files belong to one session and vanish with it (they are
// unlinked from the start, so a killed process leaves nothing behind).

// spillBufSize is each open transaction's write buffer, and the replay's
// read buffer.
const spillBufSize = 64 << 10

// streamedTxs tracks one session's streamed transactions.
type streamedTxs struct {
	dir string // for the files; "" is the system's temp directory
	txs map[uint32]*spill
	cur *spill // the transaction of the open stream block, or nil
	buf []byte // replay buffer, reused
}

// spill is one streamed transaction so far: records of its messages, each
// a 4-byte subtransaction xid, a 4-byte length and the message in
// protocol 1 form (the type byte, then what follows the in-stream xid).
type spill struct {
	xid     uint32
	f       *os.File
	w       *bufio.Writer
	aborted map[uint32]bool // rolled-back subtransactions
	msgs    int
	bytes   int64
}

func newStreamedTxs(dir string) *streamedTxs {
	return &streamedTxs{dir: dir, txs: make(map[uint32]*spill)}
}

// inBlock reports whether a stream block is open: every message but its
// stop then belongs to the streamed transaction.
func (st *streamedTxs) inBlock() bool { return st.cur != nil }

// start opens a block of transaction xid's changes.
func (st *streamedTxs) start(xid uint32, first bool) error {
	if st.cur != nil {
		return fmt.Errorf("stream start for xid %d inside the block of xid %d", xid, st.cur.xid)
	}
	sp, ok := st.txs[xid]
	switch {
	case first && ok:
		return fmt.Errorf("stream of xid %d started twice", xid)
	case !first && !ok:
		return fmt.Errorf("stream block for xid %d, whose first block this session never saw", xid)
	case first:
		f, err := os.CreateTemp(st.dir, "jetsync-streamed-*")
		if err != nil {
			return fmt.Errorf("spill streamed transaction: %w", err)
		}
		// Unlinked at once: the open file is all that is needed, and a
		// crash must leave nothing behind.
		if err := os.Remove(f.Name()); err != nil {
			f.Close()
			return fmt.Errorf("spill streamed transaction: %w", err)
		}
		sp = &spill{xid: xid, f: f, w: bufio.NewWriterSize(f, spillBufSize)}
		st.txs[xid] = sp
	}
	st.cur = sp
	return nil
}

// stop closes the open block.
func (st *streamedTxs) stop() error {
	if st.cur == nil {
		return errors.New("stream stop outside a stream block")
	}
	st.cur = nil
	return nil
}

// add records a message of the open block.
func (st *streamedTxs) add(data []byte) error {
	sp := st.cur
	if data[0] == byte(pglogrepl.MessageTypeOrigin) {
		// Sent after a first stream start, without an xid; unused.
		return nil
	}
	if len(data) < 5 {
		return fmt.Errorf("streamed message %q of xid %d: %d bytes, too short for its xid", data[0], sp.xid, len(data))
	}
	sub := binary.BigEndian.Uint32(data[1:5])
	var hdr [9]byte
	binary.BigEndian.PutUint32(hdr[0:4], sub)
	binary.BigEndian.PutUint32(hdr[4:8], uint32(len(data)-4))
	hdr[8] = data[0]
	if _, err := sp.w.Write(hdr[:]); err != nil {
		return fmt.Errorf("spill streamed transaction: %w", err)
	}
	if _, err := sp.w.Write(data[5:]); err != nil {
		return fmt.Errorf("spill streamed transaction: %w", err)
	}
	sp.msgs++
	sp.bytes += int64(len(data) + 4)
	return nil
}

// abort drops transaction xid, or only its subtransaction subxid. An
// abort of something never streamed to this session is no news.
func (st *streamedTxs) abort(xid, subxid uint32) {
	sp, ok := st.txs[xid]
	if !ok {
		return
	}
	if subxid == xid {
		sp.close()
		delete(st.txs, xid)
		return
	}
	if sp.aborted == nil {
		sp.aborted = make(map[uint32]bool)
	}
	sp.aborted[subxid] = true
}

// take removes transaction xid for its commit.
func (st *streamedTxs) take(xid uint32) (*spill, error) {
	sp, ok := st.txs[xid]
	if !ok {
		return nil, fmt.Errorf("stream commit of xid %d, which this session never saw streamed", xid)
	}
	delete(st.txs, xid)
	return sp, nil
}

// close drops every transaction: the session is over.
func (st *streamedTxs) close() {
	for xid, sp := range st.txs {
		sp.close()
		delete(st.txs, xid)
	}
	st.cur = nil
}

func (sp *spill) close() { sp.f.Close() }

// replay calls f with each message kept, in order: the messages of
// rolled-back subtransactions are dropped, but for their Relation and Type
// messages, which pgoutput counts as sent for the whole transaction. The
// message passed to f is valid until f returns.
func (st *streamedTxs) replay(sp *spill, f func(msg []byte) error) error {
	if err := sp.w.Flush(); err != nil {
		return fmt.Errorf("spill streamed transaction: %w", err)
	}
	if _, err := sp.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("read streamed transaction: %w", err)
	}
	r := bufio.NewReaderSize(sp.f, spillBufSize)
	var hdr [8]byte
	for range sp.msgs {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return fmt.Errorf("read streamed transaction: %w", err)
		}
		sub, n := binary.BigEndian.Uint32(hdr[0:4]), int(binary.BigEndian.Uint32(hdr[4:8]))
		if cap(st.buf) < n {
			st.buf = make([]byte, n)
		}
		msg := st.buf[:n]
		if _, err := io.ReadFull(r, msg); err != nil {
			return fmt.Errorf("read streamed transaction: %w", err)
		}
		if sp.aborted[sub] && msg[0] != byte(pglogrepl.MessageTypeRelation) && msg[0] != byte(pglogrepl.MessageTypeType) {
			continue
		}
		if err := f(msg); err != nil {
			return err
		}
	}
	if cap(st.buf) > 16<<20 {
		st.buf = nil // a huge value's buffer is not kept for the session
	}
	return nil
}

// parseStreamControl parses a stream start, stop, commit or abort message,
// turning a panic of the parser into an error as parsePgoutput does.
func parseStreamControl(data []byte) (m pglogrepl.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("malformed pgoutput stream message (%d bytes): %v", len(data), r)
		}
	}()
	return pglogrepl.ParseV2(data, false)
}

// isStreamControl reports whether a message outside a stream block is one
// of the stream messages.
func isStreamControl(t byte) bool {
	switch pglogrepl.MessageType(t) {
	case pglogrepl.MessageTypeStreamStart, pglogrepl.MessageTypeStreamStop,
		pglogrepl.MessageTypeStreamCommit, pglogrepl.MessageTypeStreamAbort:
		return true
	}
	return false
}

// streamControl handles a stream message; a commit decodes the whole
// transaction through dec, as if Postgres had sent it after its commit.
func (s *Source) streamControl(ctx context.Context, st *streamedTxs, dec *decoder, data []byte, emit func(event) error) error {
	m, err := parseStreamControl(data)
	if err != nil {
		return err
	}
	switch m := m.(type) {
	case *pglogrepl.StreamStartMessageV2:
		return st.start(m.Xid, m.FirstSegment == 1)
	case *pglogrepl.StreamStopMessageV2:
		return st.stop()
	case *pglogrepl.StreamAbortMessageV2:
		if m.SubXid == m.Xid {
			if _, ok := st.txs[m.Xid]; ok {
				s.m.streamedAborts.Inc()
			}
		}
		st.abort(m.Xid, m.SubXid)
		return nil
	case *pglogrepl.StreamCommitMessageV2:
		sp, err := st.take(m.Xid)
		if err != nil {
			return err
		}
		defer sp.close()
		s.m.streamedCommits.Inc()
		s.log.Debug("streamed transaction committed", "xid", m.Xid, "messages", sp.msgs, "bytes", sp.bytes)
		if err := dec.decode(ctx, &pglogrepl.BeginMessage{FinalLSN: m.CommitLSN, CommitTime: m.CommitTime, Xid: m.Xid}, emit); err != nil {
			return err
		}
		err = st.replay(sp, func(msg []byte) error {
			pm, err := parsePgoutput(msg)
			if err != nil {
				return fmt.Errorf("parse streamed pgoutput of xid %d: %w", m.Xid, err)
			}
			return dec.decode(ctx, pm, emit)
		})
		if err != nil {
			return err
		}
		return dec.decode(ctx, &pglogrepl.CommitMessage{CommitLSN: m.CommitLSN, TransactionEndLSN: m.TransactionEndLSN, CommitTime: m.CommitTime}, emit)
	}
	return fmt.Errorf("unexpected pgoutput message %T", m)
}
