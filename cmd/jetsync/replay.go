package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

const replaySummary = `Print the stream's history between two points, in tail's line format, or,
with --into, build a replica file as of the --to point from the stream alone
(with --table, holding that table only).
A point is a stream sequence (123 or seq:123), a time (RFC3339, or
time:2006-01-02T15:04:05Z) or a commit watermark (wm:0a1b2c3, or a bare
watermark that is not all digits). --from defaults to the stream's start and
--to to its end as the command starts.`

type replayFlags struct {
	streamClient
	from, to, into string
}

func cmdReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c replayFlags
	e := newEnv()
	fs := flag.NewFlagSet("jetsync replay", flag.ContinueOnError)
	c.register(fs, e)
	fs.StringVar(&c.from, "from", "", "first point to replay (seq, time or watermark)")
	fs.StringVar(&c.to, "to", "", "last point to replay (seq, time or watermark)")
	fs.StringVar(&c.into, "into", "", "build a replica in this new SQLite file instead of printing")
	if err := parseFlags(fs, e, stdout, replaySummary, args); err != nil {
		return err
	}
	var err error
	var from, to position
	if c.from != "" {
		if from, err = parsePosition(c.from); err != nil {
			return err
		}
	}
	if c.to != "" {
		if to, err = parsePosition(c.to); err != nil {
			return err
		}
	}
	if c.into != "" {
		if c.json {
			return usageError("--into builds a replica: --json doesn't apply")
		}
		if _, err := os.Stat(c.into); err == nil {
			return usageError("--into %s: file exists; replay builds a new replica", c.into)
		}
	}
	s, ctx, stop, err := c.start(ctx, stderr, "jetsync replay")
	if err != nil {
		return err
	}
	defer stop()
	log, shard, js := s.log, s.shard, s.js

	st, err := js.Stream(ctx, shard.ChangesStream())
	if err != nil {
		return fmt.Errorf("stream %s: %w", shard.ChangesStream(), err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s: %w", shard.ChangesStream(), err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if info.State.Msgs == 0 {
		return fmt.Errorf("stream %s is empty", shard.ChangesStream())
	}
	sr := seqResolver{stream: st, filter: shard.ChangesFilter(), first: first, last: last}
	fromSeq, toSeq := first, last
	if !from.zero() {
		if fromSeq, err = sr.from(ctx, from); err != nil {
			return err
		}
	}
	if !to.zero() {
		if toSeq, err = sr.to(ctx, to); err != nil {
			return err
		}
	}
	log.Debug("replay range", "from_seq", fromSeq, "to_seq", toSeq, "first", first, "last", last)

	if c.into != "" {
		rcfg := replicator.ReplayConfig{File: c.into, Shard: shard, ToSeq: toSeq, Logger: log}
		if !from.zero() {
			rcfg.FromSeq = fromSeq
		}
		if c.table != "" {
			schema, table, _ := parseTable(c.table)
			rcfg.Table = replica.TableName(schema, table)
		}
		state, err := replicator.Replay(ctx, js, rcfg)
		if err != nil {
			return fmt.Errorf("replay into %s: %w", c.into, err)
		}
		log.Info("replica built", "file", c.into, logkey.Watermark, state.Watermark, logkey.Seq, state.StreamSeq,
			logkey.ReplicaVersion, state.ReplicaVersion)
		fmt.Fprintf(stdout, "built %s: watermark %s, stream seq %d, replica version %s\n",
			c.into, state.Watermark, state.StreamSeq, state.ReplicaVersion)
		return nil
	}

	if fromSeq > toSeq {
		return nil
	}
	// An ordered consumer with a filter waits forever for a message that
	// never comes, so look first whether the range holds one.
	head, err := st.GetMsg(ctx, fromSeq, jetstream.WithGetMsgSubject(s.subjects[0]))
	if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && head.Sequence > toSeq {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get message %d: %w", fromSeq, err)
	}
	it, err := s.consume(ctx, jetstream.DeliverByStartSequencePolicy, head.Sequence)
	if err != nil {
		return err
	}
	defer it.Stop()
	p := newPrinter(stdout, false)
	p.log = log
	p.json = c.json
	if from.kind == posWatermark {
		p.from = from.wm
	}
	if to.kind == posWatermark {
		p.to = to.wm
	}
	return follow(ctx, it, func(msg jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
		seq := md.Sequence.Stream
		if seq > toSeq {
			return false, nil
		}
		if err := printMsg(p, msg, md, log); err != nil {
			return false, err
		}
		return seq < toSeq && md.NumPending > 0, nil
	})
}

type posKind int

const (
	posNone posKind = iota
	posSeq
	posTime
	posWatermark
)

// position is a point in the stream as the user gave it.
type position struct {
	kind posKind
	seq  uint64
	t    time.Time
	wm   string
}

func (p position) zero() bool { return p.kind == posNone }

// parsePosition reads seq:N, time:T, wm:W, or the bare forms: digits are a
// sequence, an RFC3339 time is a time, and a LexiVersion is a watermark.
func parsePosition(s string) (position, error) {
	kind, v, ok := strings.Cut(s, ":")
	if ok {
		switch kind {
		case "seq":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return position{}, usageError("%q: bad sequence", s)
			}
			return position{kind: posSeq, seq: n}, nil
		case "time":
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return position{}, usageError("%q: bad time (want RFC3339)", s)
			}
			return position{kind: posTime, t: t}, nil
		case "wm":
			if _, err := streams.ParseLexi(v); err != nil {
				return position{}, usageError("%q: bad watermark", s)
			}
			return position{kind: posWatermark, wm: v}, nil
		}
	}
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		return position{kind: posSeq, seq: n}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return position{kind: posTime, t: t}, nil
	}
	if _, err := streams.ParseLexi(s); err == nil {
		return position{kind: posWatermark, wm: s}, nil
	}
	return position{}, usageError("%q: not a sequence, RFC3339 time or watermark", s)
}

// seqResolver turns positions into stream sequences by binary search, which
// holds because both message times and watermarks grow with the sequence.
type seqResolver struct {
	stream      jetstream.Stream
	filter      string
	first, last uint64
}

// from is the first sequence at or after p.
func (r seqResolver) from(ctx context.Context, p position) (uint64, error) {
	switch p.kind {
	case posSeq:
		return max(p.seq, r.first), nil
	case posTime:
		return r.search(ctx, func(m *jetstream.RawStreamMsg) bool { return !m.Time.Before(p.t) })
	default:
		return r.search(ctx, func(m *jetstream.RawStreamMsg) bool { return m.Header.Get(streams.HeaderWatermark) >= p.wm })
	}
}

// to is the last sequence at or before p. For a watermark it is the message
// that holds p's last part, which may pack later transactions too; the
// printer drops those.
func (r seqResolver) to(ctx context.Context, p position) (uint64, error) {
	switch p.kind {
	case posSeq:
		return min(p.seq, r.last), nil
	case posTime:
		s, err := r.search(ctx, func(m *jetstream.RawStreamMsg) bool { return m.Time.After(p.t) })
		return s - 1, err
	default:
		s, err := r.search(ctx, func(m *jetstream.RawStreamMsg) bool { return m.Header.Get(streams.HeaderWatermark) > p.wm })
		return min(s, r.last), err
	}
}

// search returns the first sequence in [first, last] whose message satisfies
// pred, which must be monotone, or last+1. Deleted sequences are skipped by
// asking for the next message at or after each probe.
func (r seqResolver) search(ctx context.Context, pred func(*jetstream.RawStreamMsg) bool) (uint64, error) {
	lo, hi := r.first, r.last
	ans := r.last + 1
	for lo <= hi {
		mid := lo + (hi-lo)/2
		m, err := r.stream.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(r.filter))
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, fmt.Errorf("get message %d: %w", mid, err)
		}
		switch {
		case err != nil || m.Sequence > hi:
			// Nothing left in [mid, hi].
			if mid == 0 {
				return ans, nil
			}
			hi = mid - 1
		case pred(m):
			ans = m.Sequence
			if mid == 0 {
				return ans, nil
			}
			hi = mid - 1
		default:
			lo = m.Sequence + 1
		}
	}
	return ans, nil
}
