package pgrepl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetsync/jetsync/internal/telemetry"
	"github.com/jetsync/jetsync/streams"
)

const (
	// stallWait is how long a publish waits for room under the pending
	// bound: long, because a slow server should slow us, not fail us.
	stallWait = 2 * time.Minute
	// ackTimeout bounds the wait for one PubAck.
	ackTimeout = 10 * time.Second
	// maxPendingBytes bounds the encoded bytes awaiting a PubAck, which
	// nats.go keeps for retries: maxPending full-size messages would hold
	// 32 MiB, too much of a 64 MiB heap budget during a large transaction.
	// 8 MiB is 16 full messages, ample to keep a local server busy.
	maxPendingBytes = 8 << 20
)

// ErrDuplicate reports a PubAck for a message the stream already held: the
// producer's idea of the stream tail was wrong.
var ErrDuplicate = errors.New("duplicate publish")

// tail is what the change stream holds, as a session finds it.
type tail struct {
	lastSeq        uint64 // the stream's last sequence, deleted or not
	empty          bool   // no message at all
	replicaVersion string
	// wm is the watermark of the last message's last part; complete says
	// whether that part ends its transaction. If not, parts 0..part of
	// transaction wm are in the stream and the rest must follow.
	wm       string
	part     int
	complete bool
}

// readTail reads the change stream's last message headers.
func readTail(ctx context.Context, s jetstream.Stream, shard streams.Shard) (tail, error) {
	var t tail
	info, err := s.Info(ctx)
	if err != nil {
		return t, fmt.Errorf("stream info: %w", err)
	}
	t.lastSeq = info.State.LastSeq
	if info.State.Msgs == 0 {
		t.empty = true
		return t, nil
	}
	m, err := s.GetLastMsgForSubject(ctx, shard.ChangesFilter())
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		t.empty = true
		return t, nil
	}
	if err != nil {
		return t, fmt.Errorf("read stream tail: %w", err)
	}
	t.replicaVersion = m.Header.Get(streams.HeaderReplicaVersion)
	t.wm = m.Header.Get(streams.HeaderWatermark)
	if t.part, err = strconv.Atoi(m.Header.Get(streams.HeaderPart)); err != nil {
		return t, fmt.Errorf("stream tail seq %d: bad %s header: %w", m.Sequence, streams.HeaderPart, err)
	}
	if _, err := streams.ParseLexi(t.wm); err != nil {
		return t, fmt.Errorf("stream tail seq %d: %w", m.Sequence, err)
	}
	t.complete = m.Header.Get(streams.HeaderCommit) != ""
	return t, nil
}

// publisher publishes change messages in order, predicting each one's
// stream sequence, and tracks their PubAcks.
type publisher struct {
	js             jetstream.JetStream
	replicaVersion string
	next           uint64 // the sequence the next message gets
	pending        []pendingMsg
	head           int
	pendingBytes   int // encoded bytes of the unacked messages
	// confirmed is the end LSN of the last transaction whose messages are
	// all acked, and everything before it.
	confirmed pglogrepl.LSN
	lastSeq   uint64 // of the last acked message
	onAck     func(m *outMsg, seq uint64)
	// fence, when set, is asked before each publish whether this process
	// may still publish (Config.Fence).
	fence func() error
}

type pendingMsg struct {
	fut  jetstream.PubAckFuture // nil for a confirm-only entry
	seq  uint64
	m    *outMsg
	size int // encoded bytes
	// span, when the message is traced, is its publish, ended at the ack.
	span trace.Span
}

// newJetStream returns a JetStream context like js, for publishing with a
// small pending bound.
func newJetStream(js jetstream.JetStream, maxPending int) (jetstream.JetStream, error) {
	o := js.Options()
	opts := []jetstream.JetStreamOpt{
		jetstream.WithPublishAsyncMaxPending(maxPending),
		jetstream.WithPublishAsyncTimeout(ackTimeout),
	}
	switch {
	case o.Domain != "":
		return jetstream.NewWithDomain(js.Conn(), o.Domain, opts...)
	case o.APIPrefix != "":
		return jetstream.NewWithAPIPrefix(js.Conn(), o.APIPrefix, opts...)
	default:
		return jetstream.New(js.Conn(), opts...)
	}
}

// publish sends m. A message with no parts is only a confirm. Past
// maxPendingBytes in flight it first waits for PubAcks, each wait bounded by
// ackTimeout, as nats.go's stall wait bounds the count of pending publishes.
func (p *publisher) publish(m *outMsg) error {
	if len(m.msg.Parts) == 0 {
		p.pending = append(p.pending, pendingMsg{m: m})
		return nil
	}
	if p.fence != nil {
		if err := p.fence(); err != nil {
			return err
		}
	}
	data, err := streams.Encode(&m.msg)
	if err != nil {
		return err
	}
	for !p.idle() && p.pendingBytes+len(data) > maxPendingBytes {
		if err := p.awaitOldest(); err != nil {
			return err
		}
	}
	// The subject is the table's, cached by the decoder.
	msg := &nats.Msg{Subject: m.subject, Data: data, Header: streams.Header(m.msg.Parts, p.replicaVersion)}
	var span trace.Span
	if telemetry.Tracing() && m.txs > 0 {
		span = tracePublish(m, msg.Header)
	}
	fut, err := p.js.PublishMsgAsync(msg,
		jetstream.WithExpectLastSequence(p.next-1),
		jetstream.WithStallWait(stallWait))
	if err != nil {
		if span != nil {
			span.End()
		}
		return fmt.Errorf("publish %s: %w", m.subject, err)
	}
	p.pending = append(p.pending, pendingMsg{fut: fut, seq: p.next, m: m, size: len(data), span: span})
	p.pendingBytes += len(data)
	p.next++
	// The encoded copy is what travels and what a retry resends: drop the
	// decoded changes, which would double what an unacked message holds.
	m.msg.Parts = nil
	return nil
}

// awaitOldest waits for the oldest unacked message's PubAck, which
// nats.go's publish timeout bounds.
func (p *publisher) awaitOldest() error {
	ok, errc := p.ackChans()
	if ok == nil {
		return nil
	}
	select {
	case ack := <-ok:
		return p.acked(ack)
	case err := <-errc:
		return p.failed(err)
	}
}

// inFlight reports whether a published message awaits its PubAck.
func (p *publisher) inFlight() bool {
	p.settle()
	return !p.idle()
}

// idle reports whether every message published has been acked.
func (p *publisher) idle() bool { return p.head == len(p.pending) }

// ackChans returns the channels of the oldest unacked message, or nils.
func (p *publisher) ackChans() (<-chan *jetstream.PubAck, <-chan error) {
	p.settle()
	if p.idle() {
		return nil, nil
	}
	f := p.pending[p.head].fut
	return f.Ok(), f.Err()
}

// acked records the PubAck of the oldest unacked message.
func (p *publisher) acked(ack *jetstream.PubAck) error {
	e := p.pending[p.head]
	if ack.Duplicate {
		return fmt.Errorf("%w: seq %d (%s)", ErrDuplicate, ack.Sequence, e.m.subject)
	}
	if ack.Sequence != e.seq {
		return fmt.Errorf("publish %s: acked as seq %d, expected %d", e.m.subject, ack.Sequence, e.seq)
	}
	if e.span != nil {
		e.span.SetAttributes(attribute.Int64("jetsync.stream_seq", int64(ack.Sequence)))
		e.span.End()
	}
	p.pop()
	p.lastSeq = ack.Sequence
	if p.onAck != nil {
		p.onAck(e.m, ack.Sequence)
	}
	p.settle()
	return nil
}

func (p *publisher) pop() {
	e := p.pending[p.head]
	p.pending[p.head] = pendingMsg{}
	p.pendingBytes -= e.size
	p.head++
	if e.m.confirm != 0 {
		p.confirmed = max(p.confirmed, e.m.confirm)
	}
	if p.head == len(p.pending) {
		p.pending, p.head = p.pending[:0], 0
	}
}

// settle pops confirm-only entries at the head.
func (p *publisher) settle() {
	for !p.idle() && p.pending[p.head].fut == nil {
		p.pop()
	}
}

// wait blocks until every message published so far is acked.
func (p *publisher) wait(ctx context.Context) error {
	for {
		ok, errc := p.ackChans()
		if ok == nil {
			return nil
		}
		select {
		case ack := <-ok:
			if err := p.acked(ack); err != nil {
				return err
			}
		case err := <-errc:
			return p.failed(err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// poll records the PubAcks that have arrived, without waiting.
func (p *publisher) poll() error {
	for {
		ok, errc := p.ackChans()
		if ok == nil {
			return nil
		}
		select {
		case ack := <-ok:
			if err := p.acked(ack); err != nil {
				return err
			}
		case err := <-errc:
			return p.failed(err)
		default:
			return nil
		}
	}
}

func (p *publisher) failed(err error) error {
	e := p.pending[p.head]
	return fmt.Errorf("publish %s seq %d: %w", e.m.subject, e.seq, err)
}

// tracePublish starts the trace of the last transaction m completes: a
// span for its Postgres commit, from the commit time to now, and a child
// for the publish, which h's traceparent names. One message, not one row,
// pays for it, and a message that completes no transaction is not traced.
// A transaction the sampler passes over gets nil: no span, no header.
func tracePublish(m *outMsg, h nats.Header) trace.Span {
	var commit *streams.Part
	for i := len(m.msg.Parts) - 1; i >= 0; i-- {
		if m.msg.Parts[i].Last {
			commit = &m.msg.Parts[i]
			break
		}
	}
	if commit == nil {
		return nil
	}
	now := time.Now()
	start := now
	if t := time.UnixMicro(int64(commit.CommitTimeMs * 1000)); commit.CommitTimeMs > 0 && t.Before(now) {
		start = t
	}
	ctx, cs, ok := telemetry.StartTrace(context.Background(), "postgres commit",
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(start))
	if !ok {
		return nil
	}
	cs.SetAttributes(attribute.String("jetsync.watermark", commit.Watermark))
	cs.End(trace.WithTimestamp(now))
	ctx, ps := telemetry.Tracer().Start(ctx, "jetstream publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "nats"), attribute.String("messaging.destination.name", m.subject),
			attribute.Int("jetsync.transactions", m.txs), attribute.Int("jetsync.changes", m.changes)))
	telemetry.Inject(ctx, h)
	return ps
}
