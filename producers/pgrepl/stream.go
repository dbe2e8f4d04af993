package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"golang.org/x/sync/errgroup"

	"github.com/jetsync/jetsync/internal/logkey"
)

var errReaderDone = errors.New("replication reader stopped")

// stream runs logical replication from pos until an error: a reader
// goroutine decodes pgoutput into a bounded queue, and this goroutine packs
// and publishes it and confirms what JetStream has acked.
func (s *Source) stream(ctx context.Context, conn *pgx.Conn, replConn *pgconn.PgConn, up upstream,
	pos position, pub *publisher, rs *runState,
) error {
	senderTimeout, err := walSenderTimeout(ctx, replConn)
	if err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, replConn, pos.slot, pos.startLSN, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			// Protocol 2 streams a large transaction while it runs, rather
			// than only after its commit (streamed.go).
			"proto_version '2'",
			"streaming 'on'",
			"publication_names " + publicationNames(up.publications),
			"messages 'true'",
		},
	})
	if err != nil {
		return fmt.Errorf("start replication on %s at %s: %w", pos.slot, pos.startLSN, err)
	}
	log := s.log.With(logkey.Slot, pos.slot, logkey.ReplicaVersion, pos.replicaVersion)
	log.Info("streaming", logkey.LSN, pos.startLSN, logkey.Seq, pub.lastSeq)
	rs.streamed = true

	st := &status{conn: replConn}
	idle := inboundLimit(senderTimeout)
	events := make(chan event, queueLen)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, rctx := errgroup.WithContext(rctx)
	dec := newDecoder(s.cfg.Shard, s.reg, conn, log)
	dec.resumeWM, dec.resumePartial = pos.resumeWM, pos.partial()
	dec.initial = pos.initial
	dec.progress, dec.progressEvery = s.m.backfill, s.cfg.ProgressEvery
	g.Go(func() error {
		defer close(events)
		return s.read(rctx, replConn, dec, events, st, idle)
	})
	g.Go(func() error {
		s.watchSlot(rctx, pos.slot, slotWatchEvery)
		return nil
	})
	err = s.publishLoop(rctx, events, pub, st, pos, rs, statusIntervalFor(senderTimeout))
	cancel()
	// A reader that fails cancels rctx, and the publisher may see that
	// before the closed queue: the reader's error is the one that counts.
	readerFailed := errors.Is(err, context.Canceled) && ctx.Err() == nil
	if rerr := g.Wait(); errors.Is(err, errReaderDone) || err == nil || readerFailed && rerr != nil {
		err = rerr
	}
	return err
}

// walSenderTimeout reads the session's wal_sender_timeout (0: none).
//
// The reader answers the server's keepalives, but not while it copies a
// table after a schema change, which may outlast that timeout: the
// publisher's unprompted status updates keep the session alive meanwhile,
// so they come well inside it (statusIntervalFor). They also ask for a
// reply, so that even an idle upstream sends something that often, and
// the reader takes a silence of twice the timeout for a dead peer
// (inboundLimit), as zero-cache does.
func walSenderTimeout(ctx context.Context, replConn *pgconn.PgConn) (time.Duration, error) {
	// pg_settings gives the value in its unit, milliseconds; SHOW would
	// pick a unit to print it in.
	res, err := replConn.Exec(ctx, "SELECT setting FROM pg_settings WHERE name = 'wal_sender_timeout'").ReadAll()
	if err != nil {
		return 0, fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return 0, errors.New("read wal_sender_timeout: unexpected result")
	}
	ms, err := strconv.ParseInt(string(res[0].Rows[0][0]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// inboundLimit is how long the reader waits for a message before it takes
// the upstream for dead; 0 waits forever (the server sends nothing unasked
// without a timeout).
func inboundLimit(timeout time.Duration) time.Duration {
	if timeout <= 0 {
		return 0
	}
	return max(2*timeout, time.Second)
}

// statusIntervalFor is the unprompted status interval under a
// wal_sender_timeout (0: none).
func statusIntervalFor(timeout time.Duration) time.Duration {
	if timeout <= 0 {
		return statusInterval
	}
	return max(min(statusInterval, timeout/3), 100*time.Millisecond)
}

// read receives the replication stream until an error.
func (s *Source) read(ctx context.Context, conn *pgconn.PgConn, dec *decoder, events chan<- event, st *status, idle time.Duration) error {
	emit := func(ev event) error {
		select {
		case events <- ev:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	stx := newStreamedTxs(s.cfg.SpillDir)
	defer stx.close()
	for {
		msg, err := receive(ctx, conn, idle)
		if err != nil {
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse keepalive: %w", err)
				}
				if ka.ReplyRequested {
					if err := st.send(); err != nil {
						return err
					}
				}
				// Only an idle publisher uses keepalives; a busy one has no
				// room for them and needs none.
				select {
				case events <- event{kind: evKeepalive, end: ka.ServerWALEnd}:
				default:
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("parse xlogdata: %w", err)
				}
				if err := s.walData(ctx, stx, dec, xld.WALStart, xld.WALData, emit); err != nil {
					return err
				}
			}
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.CopyDone:
			return errors.New("upstream ended replication")
		}
	}
}

// walData handles one pgoutput message: inside a stream block it goes to
// the streamed transaction's file; otherwise it is decoded, or, for a
// stream message, handled (streamed.go).
func (s *Source) walData(ctx context.Context, stx *streamedTxs, dec *decoder, at pglogrepl.LSN, data []byte, emit func(event) error) error {
	if len(data) == 0 {
		return nil
	}
	if stx.inBlock() {
		switch {
		case data[0] == byte(pglogrepl.MessageTypeStreamStop):
			return stx.stop()
		case isStreamControl(data[0]) || data[0] == byte(pglogrepl.MessageTypeBegin) || data[0] == byte(pglogrepl.MessageTypeCommit):
			return fmt.Errorf("pgoutput message %q at %s inside a stream block", data[0], at)
		}
		return stx.add(data)
	}
	if isStreamControl(data[0]) {
		return s.streamControl(ctx, stx, dec, data, emit)
	}
	m, err := parsePgoutput(data)
	if err != nil {
		return fmt.Errorf("parse pgoutput at %s: %w", at, err)
	}
	return dec.decode(ctx, m, emit)
}

// receive waits for the next replication message, at most idle when it is
// positive.
func receive(ctx context.Context, conn *pgconn.PgConn, idle time.Duration) (pgproto3.BackendMessage, error) {
	rctx := ctx
	if idle > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, idle)
		defer cancel()
	}
	msg, err := conn.ReceiveMessage(rctx)
	if err != nil {
		if ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("receive replication: nothing from upstream in %v (twice wal_sender_timeout): presumed dead", idle)
		}
		return nil, fmt.Errorf("receive replication: %w", err)
	}
	return msg, nil
}

// publishLoop packs, publishes and confirms.
func (s *Source) publishLoop(ctx context.Context, events <-chan event, pub *publisher, st *status, pos position, rs *runState, every time.Duration) error {
	pk := &packer{shard: s.cfg.Shard, prev: pos.prev}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	var inTx, skip, resumed bool
	for {
		okc, errc := pub.ackChans()
		select {
		case ev, ok := <-events:
			if !ok {
				return errReaderDone
			}
			switch ev.kind {
			case evBegin:
				inTx = true
				skip = inStream(ev.wm, pos.resumeWM, pos.partial())
				if !skip && pos.partial() && ev.wm > pos.resumeWM {
					return fmt.Errorf("transaction %s is partly in the stream, but replication went on to %s", pos.resumeWM, ev.wm)
				}
				if !skip {
					pk.begin(ev.wm)
				}
			case evChange:
				if !skip {
					pk.add(ev.table, ev.change, ev.size)
				}
			case evCommit:
				inTx = false
				if skip {
					// Already in the stream: confirm it in turn.
					pk.begin(ev.wm)
					pk.commit(ev.ms, ev.end)
					break
				}
				pk.commit(ev.ms, ev.end)
				// The commit emits the last data part too, which may be
				// in the stream already: stop skipping after the take.
				resumed = ev.wm == pos.resumeWM
			case evKeepalive:
				if !inTx && !pos.partial() && pub.idle() && len(pk.done) == 0 && ev.end > pub.confirmed {
					// Nothing of ours before the server's WAL end is
					// unconfirmed: let the slot move on.
					pub.confirmed = ev.end
					if err := st.set(pub.confirmed, s.m); err != nil {
						return err
					}
				}
			}
			// Group commit: while a message awaits its PubAck (the
			// stream's fsync), the transactions that arrive wait in the
			// packer and go as one message, with one fsync, at its ack.
			if len(events) == 0 && (!groupCommit || !pub.inFlight()) {
				pk.flush()
			}
			if err := publishTaken(pk, pub, pos); err != nil {
				return err
			}
			if resumed {
				pos.resumePart, resumed = allParts, false
			}
		case ack := <-okc:
			if err := pub.acked(ack); err != nil {
				return err
			}
			if pub.confirmed != pglogrepl.LSN(st.pos.Load()) {
				if pub.idle() {
					// Caught up: tell the server now rather than at the
					// next tick, so the slot releases WAL promptly.
					if err := st.set(pub.confirmed, s.m); err != nil {
						return err
					}
				} else {
					st.record(pub.confirmed, s.m)
				}
			}
			// The transactions held for it go now.
			if len(events) == 0 && !pub.inFlight() {
				pk.flush()
				if err := publishTaken(pk, pub, pos); err != nil {
					return err
				}
			}
		case err := <-errc:
			return pub.failed(err)
		case <-ticker.C:
			st.record(pub.confirmed, s.m)
			if err := st.ping(); err != nil {
				return err
			}
		case m := <-rs.resync:
			rs.waiting = append(rs.waiting, m)
			return errResync
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// groupCommit is off only in a test that measures what it saves.
var groupCommit = true

// publishTaken publishes the messages the packer has emitted, those a
// resumed session finds in the stream already as confirms only.
func publishTaken(pk *packer, pub *publisher, pos position) error {
	for _, m := range pk.take() {
		if pos.partial() && len(m.msg.Parts) > 0 && m.first().Watermark == pos.resumeWM && m.last().Num <= pos.resumePart {
			m = &outMsg{confirm: m.confirm} // already in the stream
		}
		if err := pub.publish(m); err != nil {
			return err
		}
	}
	return nil
}

// status sends standby status updates. The reader answers keepalives with
// it, so both goroutines write: sends are serialized.
type status struct {
	mu   sync.Mutex
	conn *pgconn.PgConn
	pos  atomic.Uint64 // the confirmed LSN
}

// set records the confirmed LSN and sends it.
func (st *status) set(lsn pglogrepl.LSN, m *metrics) error {
	st.record(lsn, m)
	return st.send()
}

// record records the confirmed LSN for the next status update.
func (st *status) record(lsn pglogrepl.LSN, m *metrics) {
	st.pos.Store(uint64(lsn))
	m.confirmed.Set(float64(lsn))
}

func (st *status) send() error { return st.sendUpdate(false) }

// ping sends the confirmed LSN and asks the server to answer at once.
func (st *status) ping() error { return st.sendUpdate(true) }

func (st *status) sendUpdate(replyRequested bool) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	lsn := pglogrepl.LSN(st.pos.Load())
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), st.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn, ReplyRequested: replyRequested,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	return nil
}

// slotWatchEvery paces the reads of the slot's retained WAL.
const slotWatchEvery = 10 * time.Second

// watchSlot keeps the slot's retained WAL gauge current until ctx ends, on
// a connection of its own (the decoder owns the session's). A failed read
// is retried at the next tick: the figure is advisory.
func (s *Source) watchSlot(ctx context.Context, slot string, every time.Duration) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if conn == nil || conn.IsClosed() {
			c, err := pgx.Connect(ctx, s.cfg.UpstreamURL)
			if err != nil {
				s.log.Debug("slot watch: connect", "err", err)
			}
			conn = c
		}
		if conn != nil {
			var bytes float64
			err := conn.QueryRow(ctx, `SELECT COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::float8
				FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&bytes)
			if err == nil {
				s.m.slotWAL.Set(bytes)
			} else if ctx.Err() == nil {
				s.log.Debug("slot watch: read", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
