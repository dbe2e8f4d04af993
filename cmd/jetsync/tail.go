package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/streams"
)

const tailSummary = `Print change events live as they enter the stream, one line per change.
It starts at new messages (an ordered consumer with DeliverNew) and runs until
interrupted. --table follows one table's subject (and the tx subject, where
transactions spanning tables end); --json prints JSON lines.`

// streamClient is what tail and replay share: a connection to the server
// holding the change stream, and the stream.
type streamClient struct {
	common
	natsConn
	table string
	json  bool
}

func (c *streamClient) register(fs *flag.FlagSet, e *env) {
	c.common.register(fs, e)
	c.natsConn.register(fs, e)
	fs.StringVar(&c.table, "table", "", "only this table: schema.table, or table for public.table")
	fs.BoolVar(&c.json, "json", false, "print one JSON object per line")
}

// subjects are what to follow: the whole shard, or one table's subject and
// the tx subject, where transactions spanning subjects end.
func (c *streamClient) subjects(shard streams.Shard) ([]string, error) {
	schema, table, err := parseTable(c.table)
	if err != nil {
		return nil, err
	}
	if table == "" {
		return []string{shard.ChangesFilter()}, nil
	}
	return []string{shard.TableSubject(schema, table), shard.TxSubject()}, nil
}

// streamSession is a connected streamClient.
type streamSession struct {
	log      *slog.Logger
	shard    streams.Shard
	subjects []string
	nc       *nats.Conn
	js       jetstream.JetStream
}

// start connects as name (see connect) and returns a context that ends at
// SIGINT or SIGTERM. Call stop when done: it also closes the connection.
func (c *streamClient) start(ctx context.Context, stderr io.Writer, name string) (*streamSession, context.Context, func(), error) {
	s, err := c.connect(stderr, name)
	if err != nil {
		return nil, ctx, nil, err
	}
	ctx, cancel := notifyContext(ctx, s.log)
	return s, ctx, func() { cancel(); s.nc.Close() }, nil
}

// consume follows the session's subjects with an ordered consumer that
// starts as deliver says (at startSeq for DeliverByStartSequencePolicy).
func (s *streamSession) consume(ctx context.Context, deliver jetstream.DeliverPolicy, startSeq uint64) (jetstream.MessagesContext, error) {
	name := s.shard.ChangesStream()
	cons, err := s.js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{
		FilterSubjects: s.subjects,
		DeliverPolicy:  deliver,
		OptStartSeq:    startSeq,
	})
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", name, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", name, err)
	}
	return it, nil
}

// connect resolves c's settings and connects to the server as name.
func (c *streamClient) connect(stderr io.Writer, name string) (*streamSession, error) {
	var s streamSession
	var err error
	if s.log, err = c.logger(stderr); err != nil {
		return nil, err
	}
	if s.shard, err = c.shard(); err != nil {
		return nil, err
	}
	if s.subjects, err = c.subjects(s.shard); err != nil {
		return nil, err
	}
	if s.nc, err = c.dial(name, s.log, true); err != nil {
		return nil, err
	}
	if s.js, err = jetstream.New(s.nc); err != nil {
		s.nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &s, nil
}

func cmdTail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c streamClient
	e := newEnv()
	fs := flag.NewFlagSet("jetsync tail", flag.ContinueOnError)
	c.register(fs, e)
	if err := parseFlags(fs, e, stdout, tailSummary, args); err != nil {
		return err
	}
	s, ctx, stop, err := c.start(ctx, stderr, "jetsync tail")
	if err != nil {
		return err
	}
	defer stop()
	log, shard := s.log, s.shard

	it, err := s.consume(ctx, jetstream.DeliverNewPolicy, 0)
	if err != nil {
		return err
	}
	defer it.Stop()
	log.Info("tailing", logkey.Stream, shard.ChangesStream(), "subjects", s.subjects, "nats", c.displayURL())
	p := newPrinter(stdout, c.json)
	p.log = log
	return follow(ctx, it, func(msg jetstream.Msg, md *jetstream.MsgMetadata) (bool, error) {
		return true, printMsg(p, msg, md, log)
	})
}

// follow hands each message to fn until fn says stop, ctx ends, or the
// iterator fails.
func follow(ctx context.Context, it jetstream.MessagesContext, fn func(jetstream.Msg, *jetstream.MsgMetadata) (more bool, err error)) error {
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("next message: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("message metadata: %w", err)
		}
		more, err := fn(msg, md)
		if err != nil || !more {
			return err
		}
	}
}

// printMsg prints one message. A message that does not decode is reported
// and skipped: a debugging tool should show what it can.
func printMsg(p *printer, msg jetstream.Msg, md *jetstream.MsgMetadata, log *slog.Logger) error {
	m, err := streams.Decode(msg.Data())
	if err != nil {
		log.Warn("undecodable message", logkey.Seq, md.Sequence.Stream, logkey.Subject, msg.Subject(), "err", err)
		return nil
	}
	return p.message(md.Sequence.Stream, md.Timestamp, m)
}
