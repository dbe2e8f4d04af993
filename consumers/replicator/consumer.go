// Package replicator is the consumer that keeps a SQLite replica of the change
// stream: a durable JetStream pull consumer feeding the replica projection.
// Each upstream transaction is applied atomically, several per SQLite
// commit; messages are acked only after the commit, and the stream sequence
// stored in SQLite is the truth of its progress.
package replicator

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/internal/telemetry"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// Defaults.
const (
	DefaultName = "replica"
	// DefaultBatchSize is how many messages one SQLite commit takes at
	// most (a transaction spanning more still commits whole).
	DefaultBatchSize = 256
	// DefaultSubscriptionCap is how many row changes a subscriber may hold
	// before it is told to re-read instead.
	DefaultSubscriptionCap = 10000
	// DefaultAckWait outlasts the longest transaction: its early messages
	// stay unacked until its last part commits.
	DefaultAckWait = 10 * time.Minute
	// DefaultMaxAckPending lets a transaction span that many messages.
	DefaultMaxAckPending = 1 << 20
	// DefaultResyncInterval is how often a consumer waiting for a resync
	// repeats its request.
	DefaultResyncInterval = 30 * time.Second
)

// pullBytes bounds each pull request, so that the messages pulled ahead of
// the one in hand stay within about two pulls' worth. A count bound alone
// would not do: 256 full-size messages are 128 MiB, and a large transaction
// is nothing but full-size messages. (jetstream.PullMaxBytes would bound the
// bytes exactly, but its million-message count makes nats.go allocate an
// 8 MB channel.)
const pullBytes = 4 << 20

// A batch in hand takes in the messages already pulled, then commits: it
// waits for none. A timed wait, however short, costs at least a millisecond
// on an idle process (the runtime's poller sleeps in whole milliseconds, so
// a 200 µs flush wait was 1.1-1.2 ms of a 4.4 ms commit → poke p50), while
// under load the messages that arrive during one commit are the next
// batch. pollTries bounds the attempts to find one: an expired context
// competes with a buffered message in Next's select, and each try takes
// the message with even odds, so a backlog still fills whole batches.
const pollTries = 8

// Bounds of the wait before following again after a lost pull.
const (
	minPullRetry = 100 * time.Millisecond
	maxPullRetry = 5 * time.Second
)

// lostPull reports an error of the pull itself, after which following the
// stream again is all it takes.
func lostPull(err error) bool {
	return errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerNotFound)
}

// Config configures a Consumer.
type Config struct {
	// File is the SQLite replica's path.
	File  string
	Shard streams.Shard
	// TaskID names this replica's owner; the durable consumer is
	// "<TaskID>_<Name>", sanitized.
	TaskID string
	// Name defaults to DefaultName.
	Name string
	// BatchSize defaults to DefaultBatchSize.
	BatchSize int
	// SubscriptionCap defaults to DefaultSubscriptionCap.
	SubscriptionCap int
	// ResyncInterval defaults to DefaultResyncInterval.
	ResyncInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer, if set, gets the consumer's metrics.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.SubscriptionCap == 0 {
		c.SubscriptionCap = DefaultSubscriptionCap
	}
	if c.ResyncInterval == 0 {
		c.ResyncInterval = DefaultResyncInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c (after defaults).
func (c Config) Validate() error {
	if c.File == "" {
		return errors.New("replica file is required")
	}
	if c.TaskID == "" {
		return errors.New("task id is required")
	}
	if err := c.Shard.Validate(); err != nil {
		return err
	}
	if c.BatchSize < 1 || c.SubscriptionCap < 1 || c.ResyncInterval < 0 {
		return errors.New("batch size and subscription cap must be positive")
	}
	return nil
}

// DurableName is the durable consumer's name: TaskID and Name with
// anything NATS does not allow in a name replaced by "_".
func (c Config) DurableName() string {
	return sanitize(c.TaskID) + "_" + sanitize(c.Name)
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, s)
}

// Consumer keeps a SQLite replica of the change stream.
type Consumer struct {
	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	metrics *metrics

	mu    sync.Mutex
	state replica.State
	subs  map[*Subscription]struct{}
	// commitMu is held across a commit and its publish, so that a reader
	// beginning a transaction under it (Subscription.NextRead) sees the
	// replica at exactly the watermark its subscription was told.
	commitMu sync.RWMutex

	// Owned by Run.
	proc        *processor
	bucket      stateBucket
	last        jetstream.Msg // last message handled, acked at commit
	rebuiltFrom uint64        // reset seq the current rebuild started from
	badReset    uint64        // a reset seq whose history has a gap
	lastGapSeq  uint64
	resyncAt    time.Time // when to repeat a resync request; zero = none pending
	full        diskFull
	rereadGap   uint64 // seq of the last gap read again before a rebuild

	// wmLatest is the watermark of the last commit, which
	// publishWatermarks copies to the state bucket off the commit path;
	// wmWake tells it there is a new one.
	wmMu     sync.Mutex
	wmLatest string
	wmWake   chan struct{}

	// traced are the messages in hand that carry a trace context.
	traced []tracedMsg
}

// tracedMsg is a message whose traceparent names its publish span.
type tracedMsg struct {
	parent   trace.SpanContext
	received time.Time
	seq      uint64
}

// New returns a Consumer; Run starts it.
func New(cfg Config, js jetstream.JetStream) (*Consumer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.Name)
	if err != nil {
		return nil, err
	}
	return &Consumer{
		cfg:     cfg,
		js:      js,
		log:     cfg.Logger.With(logkey.Consumer, cfg.DurableName(), logkey.Stream, cfg.Shard.ChangesStream()),
		metrics: m,
		subs:    map[*Subscription]struct{}{},
	}, nil
}

// State returns where the replica stands, as of its last commit.
func (c *Consumer) State() replica.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

func (c *Consumer) setState(st replica.State) {
	c.mu.Lock()
	c.state = st
	c.mu.Unlock()
	c.metrics.observe(st)
}

// OpenDB opens a replica file for its single writer: WAL mode, so readers
// never block it, synchronous=NORMAL, and one connection. Updates land on
// random rows, so the default 2 MB page cache misses on nearly every one and
// each miss is a pread: a 64 MB cache, memory-mapped reads and in-memory
// sorts (index builds after the initial copy) keep that off the syscall path.
// The writer never checkpoints: Run checkpoints from a second connection.
func OpenDB(file string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+file+
		"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(30000)&_txlock=immediate"+
		"&_pragma=cache_size(-65536)&_pragma=mmap_size(1073741824)&_pragma=temp_store(MEMORY)&_pragma=wal_autocheckpoint(0)")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", file, err)
	}
	db.SetMaxOpenConns(1)
	if err := replica.Init(context.Background(), db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", file, err)
	}
	return db, nil
}

// checkpointInterval is how often Run checkpoints the WAL from a connection
// of its own. Left to the writer, SQLite checkpoints inside commits, and their
// fsyncs spread start-to-ready over 1.8-3.4 s instead of 1.8-1.9 s.
const checkpointInterval = 500 * time.Millisecond

// checkpoints copies the WAL into the database file until ctx ends. PASSIVE
// never blocks the writer or readers; it does what they allow.
func (c *Consumer) checkpoints(ctx context.Context) {
	db, err := sql.Open("sqlite", "file:"+c.cfg.File+"?_pragma=busy_timeout(1000)")
	if err != nil {
		c.log.Warn("no background checkpoints", "err", err)
		return
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	t := time.NewTicker(checkpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil && ctx.Err() == nil {
			c.log.Debug("checkpoint", "err", err)
		}
	}
}

// Run follows the change stream until ctx is done, then returns nil.
func (c *Consumer) Run(ctx context.Context) error {
	db, st, err := c.open(ctx)
	if err != nil || db == nil {
		return err
	}
	defer db.Close()
	c.proc = newProcessor(db, st)
	c.proc.newBatch = func() *changeBatch {
		if !c.hasSubscribers() {
			return nil
		}
		return &changeBatch{cap: c.cfg.SubscriptionCap}
	}
	c.setState(st)
	c.log.Info("replica consumer starting", "file", c.cfg.File, logkey.Seq, st.StreamSeq, logkey.Watermark, st.Watermark)

	cctx, stopCheckpoints := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.checkpoints(cctx) })
	// The watermark publisher outlives ctx until follow has returned, so
	// that it publishes the last commit's watermark.
	c.wmWake = make(chan struct{}, 1)
	wctx, stopWatermarks := context.WithCancel(context.WithoutCancel(ctx))
	wg.Go(func() { c.publishWatermarks(wctx) })
	defer wg.Wait()
	defer stopCheckpoints()
	defer stopWatermarks()

	stream, err := c.waitStream(ctx)
	if err != nil || stream == nil {
		return err
	}
	pullRetry := minPullRetry
	for {
		err := c.follow(ctx, stream)
		if isDiskFull(err) {
			// Rolled back and not acked: following again redelivers it.
			if ctx.Err() != nil {
				c.log.Warn("replica disk full at shutdown: the batch in hand is rolled back, to be delivered again", "err", err)
				return nil
			}
			if !c.waitForSpace(ctx, err) {
				return nil
			}
			c.last = nil
			continue
		}
		if lostPull(err) && ctx.Err() == nil {
			// The server stopped answering the pull (a cluster electing
			// a consumer leader, a node restarting): the batch in hand was
			// rolled back unacked, and following again recreates the
			// consumer at the replica's position.
			c.log.Warn("change stream pull lost; following again", "err", err, "in", pullRetry)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(pullRetry):
			}
			c.last = nil
			pullRetry = min(2*pullRetry, maxPullRetry)
			continue
		}
		pullRetry = minPullRetry
		var gap *GapError
		if !errors.As(err, &gap) {
			if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
				return nil
			}
			var de *DecodeError
			if errors.As(err, &de) {
				// Never skipped: a message nobody can read breaks every
				// replica built from the stream.
				c.log.Error("undecodable change message; stopping", logkey.Seq, de.Seq, "err", de.Err)
			}
			return err
		}
		if c.rereadFirst(gap) {
			continue
		}
		c.log.Error("replica missed history; rebuilding it", logkey.Seq, gap.Seq, "reason", gap.Reason)
		if c.rebuiltFrom != 0 && (c.proc.st.ReplicaVersion == "" || gap.Seq == c.lastGapSeq) {
			// Rebuilding from this reset ran into a gap too.
			c.badReset = c.rebuiltFrom
		}
		c.lastGapSeq = gap.Seq
		c.commitMu.Lock()
		err = c.whileFull(ctx, func() error { return c.proc.wipe(context.WithoutCancel(ctx)) })
		if err == nil {
			c.publish(c.proc.st, outcome{reset: true})
		}
		c.commitMu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// waitStream returns the change stream once it exists, or nil when ctx
// ends first.
func (c *Consumer) waitStream(ctx context.Context) (jetstream.Stream, error) {
	logged := false
	// Poll briskly at first: in one process the producer creates the stream
	// a moment after this starts, and start-to-ready time counts.
	wait := 10 * time.Millisecond
	for {
		s, err := c.js.Stream(ctx, c.cfg.Shard.ChangesStream())
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("stream %s: %w", c.cfg.Shard.ChangesStream(), err)
		}
		if !logged {
			c.log.Info("waiting for the change stream")
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// follow consumes from where the replica stands until ctx ends or an error
// (a *GapError asks for a rebuild).
func (c *Consumer) follow(ctx context.Context, stream jetstream.Stream) error {
	start, resync, err := c.start(ctx, stream)
	if err != nil {
		return err
	}
	cons, err := c.ensureConsumer(ctx, stream, start)
	if err != nil {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(c.cfg.BatchSize, pullBytes))
	if err != nil {
		return fmt.Errorf("consume %s: %w", c.cfg.DurableName(), err)
	}
	defer it.Stop()
	c.resyncAt = time.Time{}
	if resync != "" {
		c.requestResync(ctx, resync)
	}
	c.log.Info("following the change stream", logkey.Seq, start, "waiting_for_reset", c.proc.waiting)
	// SQLite work is local and bounded: finish it even when ctx ends, so
	// that a batch in hand is committed and acked.
	sctx := context.WithoutCancel(ctx)
	p := c.proc
	for {
		var msg jetstream.Msg
		var err error
		switch {
		case p.committable():
			msg, err = poll(ctx, it)
		case p.waiting && !c.resyncAt.IsZero():
			msg, err = next(ctx, it, max(time.Until(c.resyncAt), time.Millisecond))
		default:
			msg, err = next(ctx, it, 0)
		}
		if err != nil {
			if ctx.Err() != nil {
				return c.stop(sctx)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				if p.committable() {
					if err := c.commit(sctx); err != nil {
						return err
					}
				} else if p.waiting && !c.resyncAt.IsZero() {
					c.requestResync(ctx, "still waiting for a new initial sync")
				}
				continue
			}
			p.rollback()
			return fmt.Errorf("next message: %w", err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			p.rollback()
			return fmt.Errorf("message metadata: %w", err)
		}
		seq := meta.Sequence.Stream
		c.metrics.pending.Set(float64(meta.NumPending))
		if seq <= p.pending.StreamSeq || seq < start {
			// A redelivery: already applied, or in the batch in hand.
			if p.tx == nil {
				c.ack(msg)
			}
			continue
		}
		m, err := streams.Decode(msg.Data())
		if err != nil {
			p.rollback()
			return &DecodeError{Seq: seq, Err: err}
		}
		if telemetry.Tracing() && len(c.traced) < maxTraces {
			if sc, ok := telemetry.Extract(msg.Headers()); ok {
				c.traced = append(c.traced, tracedMsg{parent: sc, received: time.Now(), seq: seq})
			}
		}
		if p.committable() && len(m.Parts) > 0 && !m.Parts[len(m.Parts)-1].Last {
			// A transaction that spans messages stays uncommitted until
			// its last part, which can take seconds: commit the ones in
			// hand first, so that they don't wait behind it.
			if err := c.commit(sctx); err != nil {
				return err
			}
		}
		if err := p.handle(sctx, seq, m); err != nil {
			p.rollback()
			return err
		}
		c.last = msg
		if p.tx == nil {
			// Skipped while waiting for a reset.
			c.ack(msg)
			continue
		}
		if !p.waiting {
			c.resyncAt = time.Time{}
		}
		if p.committable() && p.msgs >= c.cfg.BatchSize {
			if err := c.commit(sctx); err != nil {
				return err
			}
		}
	}
}

// stop ends follow on cancellation: it commits the complete transactions in
// hand and drops a half-applied one, which will be redelivered.
func (c *Consumer) stop(ctx context.Context) error {
	p := c.proc
	if p.tx == nil {
		return nil
	}
	if err := p.abortOpen(ctx); err != nil {
		p.rollback()
		return err
	}
	if p.tx == nil || p.msgs == 0 || p.pending.StreamSeq == p.st.StreamSeq {
		p.rollback()
		return nil
	}
	// The last message handled may belong to the dropped transaction; ack
	// only what is committed.
	if p.pending.StreamSeq != lastSeq(c.last) {
		c.last = nil
	}
	return c.commit(ctx)
}

func lastSeq(m jetstream.Msg) uint64 {
	if m == nil {
		return 0
	}
	meta, err := m.Metadata()
	if err != nil {
		return 0
	}
	return meta.Sequence.Stream
}

// next waits for a message, at most wait when it is positive.
func next(ctx context.Context, it jetstream.MessagesContext, wait time.Duration) (jetstream.Msg, error) {
	if wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	return it.Next(jetstream.NextContext(ctx))
}

// poll returns a message already pulled, or context.DeadlineExceeded when
// none is (see pollTries).
func poll(ctx context.Context, it jetstream.MessagesContext) (jetstream.Msg, error) {
	ctx, cancel := context.WithDeadline(ctx, time.Time{})
	defer cancel()
	for i := 1; ; i++ {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err == nil || i == pollTries || !errors.Is(err, context.DeadlineExceeded) {
			return msg, err
		}
	}
}

// commit commits the batch in hand, acks it, and tells the world.
func (c *Consumer) commit(ctx context.Context) error {
	p := c.proc
	c.commitMu.Lock()
	o, err := p.commit(ctx, time.Now())
	if err != nil {
		c.commitMu.Unlock()
		return err
	}
	if c.last != nil {
		c.ack(c.last)
	}
	c.wrote()
	o.traces = c.traceApplies(p.st.StreamSeq)
	c.metrics.txns.Add(float64(o.txns))
	c.metrics.changes.Add(float64(o.changes))
	c.metrics.observeLag(time.Now(), o.commitTimes)
	c.publish(p.st, o)
	c.commitMu.Unlock()
	p.keepStatements(ctx)
	c.noteWatermark(p.st.Watermark)
	if o.initialSync {
		// The copy and its index builds leave the writer's page cache full,
		// up to its 64 MB, of pages written once: resident for the life of
		// the process, and none of them the updates' working set, which
		// refills the cache as it needs.
		if _, err := p.db.ExecContext(ctx, "PRAGMA shrink_memory"); err != nil {
			c.log.Debug("shrink the page cache", "err", err)
		}
		c.log.Info("initial sync applied", logkey.ReplicaVersion, p.st.ReplicaVersion, logkey.Seq, p.st.StreamSeq, "changes", o.changes)
	}
	c.log.Debug("committed", logkey.Seq, p.st.StreamSeq, logkey.Watermark, p.st.Watermark, "transactions", o.txns, "changes", o.changes)
	return nil
}

// traceApplies ends the apply spans of the traced messages committed, up
// to seq, and returns them; a traced message not committed (a rollback
// that it will be redelivered after) is dropped.
func (c *Consumer) traceApplies(seq uint64) []trace.SpanContext {
	if len(c.traced) == 0 {
		return nil
	}
	now := time.Now()
	var out []trace.SpanContext
	for _, t := range c.traced {
		if t.seq > seq {
			continue
		}
		_, span := telemetry.Tracer().Start(trace.ContextWithRemoteSpanContext(context.Background(), t.parent), "replica apply",
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(t.received),
			trace.WithAttributes(attribute.String("jetsync.consumer", c.cfg.DurableName()), attribute.Int64("jetsync.stream_seq", int64(t.seq))))
		span.End(trace.WithTimestamp(now))
		out = append(out, span.SpanContext())
	}
	c.traced = c.traced[:0]
	return out
}

// ack acks msg and, the policy being AckAll, everything before it. A lost
// ack only means a harmless redelivery.
func (c *Consumer) ack(msg jetstream.Msg) {
	if err := msg.Ack(); err != nil {
		c.log.Debug("ack failed", "err", err)
	}
}

// start decides where to read from. With a replica, that is the message
// after its last; without, the reset the producer recorded in the state
// bucket. resync, when set, says why that reset cannot serve and a new one
// must be asked for.
func (c *Consumer) start(ctx context.Context, stream jetstream.Stream) (seq uint64, resync string, err error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("stream info: %w", err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	p := c.proc
	if st := p.st; st.ReplicaVersion != "" {
		next := st.StreamSeq + 1
		switch {
		case last < st.StreamSeq:
			return 0, "", &GapError{next, fmt.Sprintf("the stream ends at seq %d, before the replica's %d: it was recreated", last, st.StreamSeq)}
		case first > next:
			return 0, "", &GapError{next, fmt.Sprintf("the stream now starts at seq %d: history was purged past the replica", first)}
		}
		c.rebuiltFrom = 0
		return next, "", nil
	}
	p.waiting = true
	up, err := c.upstream(ctx)
	if err != nil {
		return 0, "", err
	}
	c.rebuiltFrom = 0
	switch {
	case up.ResetSeq == 0:
		return max(first, 1), "", nil
	case up.ResetSeq == c.badReset:
		resync = fmt.Sprintf("the history after the reset at seq %d has a gap", up.ResetSeq)
	case up.ResetSeq < first || up.ResetSeq > last:
		resync = fmt.Sprintf("the reset at seq %d is no longer in the stream", up.ResetSeq)
	default:
		c.rebuiltFrom = up.ResetSeq
		return up.ResetSeq, "", nil
	}
	// The new reset will come after everything in the stream now.
	return last + 1, resync, nil
}

// upstream reads the producer's Upstream record; a missing one is the zero
// record.
func (c *Consumer) upstream(ctx context.Context) (streams.Upstream, error) {
	var up streams.Upstream
	kv := c.bucket.get(ctx, c)
	if kv == nil {
		return up, nil
	}
	e, err := kv.Get(ctx, streams.KeyUpstream)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return up, nil
	}
	if err != nil {
		return up, fmt.Errorf("read %s: %w", streams.KeyUpstream, err)
	}
	if err := json.Unmarshal(e.Value(), &up); err != nil {
		return up, fmt.Errorf("read %s: %w", streams.KeyUpstream, err)
	}
	return up, nil
}

// stateBucket finds the shard's state bucket, looking again at most every
// 10 s while it does not exist (yet). Each goroutine keeps its own.
type stateBucket struct {
	kv    jetstream.KeyValue
	retry time.Time
}

// get returns the state bucket, or nil.
func (b *stateBucket) get(ctx context.Context, c *Consumer) jetstream.KeyValue {
	if b.kv != nil || time.Now().Before(b.retry) {
		return b.kv
	}
	kv, err := c.js.KeyValue(ctx, c.cfg.Shard.StateBucket())
	if err != nil {
		b.retry = time.Now().Add(10 * time.Second)
		c.log.Debug("no state bucket", "err", err)
		return nil
	}
	b.kv = kv
	return kv
}

// noteWatermark hands a committed watermark to publishWatermarks.
func (c *Consumer) noteWatermark(wm string) {
	c.wmMu.Lock()
	c.wmLatest = wm
	c.wmMu.Unlock()
	select {
	case c.wmWake <- struct{}{}:
	default:
	}
}

// publishWatermarks puts a copy of the latest watermark in the state
// bucket, for monitoring, until ctx ends, and once more then so that the
// final one is there. Only operators and tests read it, so it runs off the
// commit path, where waiting for the bucket's fsync held up the next
// message; watermarks that come while a put is in flight coalesce into
// one. It is best effort: the truth is in SQLite.
func (c *Consumer) publishWatermarks(ctx context.Context) {
	key := streams.KeyWatermark(sanitize(c.cfg.TaskID), sanitize(c.cfg.Name))
	var state stateBucket
	published := ""
	put := func() {
		c.wmMu.Lock()
		wm := c.wmLatest
		c.wmMu.Unlock()
		if wm == "" || wm == published {
			return
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		kv := state.get(pctx, c)
		if kv == nil {
			return
		}
		if _, err := kv.PutString(pctx, key, wm); err != nil {
			c.log.Debug("publish watermark", "err", err)
			return
		}
		published = wm
	}
	for {
		select {
		case <-ctx.Done():
			put()
			return
		case <-c.wmWake:
			put()
		}
	}
}

// requestResync asks the producer for a new initial sync, and schedules a
// repeat in case nobody was listening.
func (c *Consumer) requestResync(ctx context.Context, reason string) {
	c.resyncAt = time.Now().Add(c.cfg.ResyncInterval)
	body, _ := json.Marshal(streams.ResyncRequest{TaskID: c.cfg.TaskID, Consumer: c.cfg.Name, Reason: reason, Watermark: c.proc.st.Watermark})
	subj := c.cfg.Shard.ResyncSubject()
	c.log.Warn("requesting a resync from the producer", logkey.Subject, subj, "reason", reason)
	rctx, cancel := context.WithTimeout(ctx, min(2*time.Second, c.cfg.ResyncInterval))
	defer cancel()
	if _, err := c.js.Conn().RequestWithContext(rctx, subj, body); err != nil && ctx.Err() == nil {
		c.log.Warn("resync request unanswered; will repeat", logkey.Subject, subj, "err", err, "in", c.cfg.ResyncInterval)
	}
}

// ensureConsumer returns the durable consumer, created or recreated so
// that it delivers from start.
func (c *Consumer) ensureConsumer(ctx context.Context, stream jetstream.Stream, start uint64) (jetstream.Consumer, error) {
	name := c.cfg.DurableName()
	filter := c.cfg.Shard.ChangesFilter()
	cons, err := stream.Consumer(ctx, name)
	switch {
	case err == nil:
		info := cons.CachedInfo()
		if info.Delivered.Stream == start-1 && info.AckFloor.Stream == start-1 &&
			info.Config.FilterSubject == filter && info.Config.AckPolicy == jetstream.AckAllPolicy &&
			info.Config.Metadata[streams.MetaReplica] == "true" {
			return cons, nil
		}
		c.log.Info("recreating the durable consumer at the replica's position", logkey.Seq, start,
			"delivered", info.Delivered.Stream, "ack_floor", info.AckFloor.Stream)
		if err := stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("delete consumer %s: %w", name, err)
		}
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("consumer %s: %w", name, err)
	}
	cons, err = stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "jetsync SQLite replica " + c.cfg.File,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   start,
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       DefaultAckWait,
		MaxAckPending: DefaultMaxAckPending,
		MaxDeliver:    -1,
		FilterSubject: filter,
		Metadata:      map[string]string{streams.MetaReplica: "true"},
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", name, err)
	}
	return cons, nil
}
