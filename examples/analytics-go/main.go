// Command analytics-go is an analytics consumer of jetsync's change stream:
// it keeps per-table insert, update and delete counts and a rolling rate,
// prints them, and resumes exactly where it stopped after a restart or a
// crash. It uses only nats.go and the contract package, streams.
//
// It owns its position, as streams/README.md ("Resuming") prescribes: the
// counts, the stream sequence and the watermark of the last complete
// transaction are written to one state file together, at a transaction
// boundary, and only then is the stream acked up to that sequence. On start
// it reads the file and (re)creates its durable consumer at the message after
// it, so a crash between the write and the ack costs a redelivery, never a
// double count. Part 0's prev must equal the watermark it holds: anything
// else is history it missed, and it stops rather than count around a gap.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/streams"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "analytics-go:", err)
		os.Exit(1)
	}
}

type config struct {
	natsURL  string
	shard    streams.Shard
	durable  string
	state    string
	every    time.Duration
	window   time.Duration
	json     bool
	protect  bool
	maxBatch int
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

func parseFlags() (config, error) {
	var c config
	fs := flag.NewFlagSet("analytics-go", flag.ContinueOnError)
	fs.StringVar(&c.natsURL, "nats", envOr("NATS_URL", nats.DefaultURL), "NATS server URL (env NATS_URL)")
	fs.StringVar(&c.shard.App, "app", envOr("ZERO_APP_ID", "zero"), "app ID (env ZERO_APP_ID)")
	shardNum := fs.Int("shard", 0, "shard number")
	fs.StringVar(&c.durable, "durable", "analytics", "durable consumer name")
	fs.StringVar(&c.state, "state", "analytics-state.json", "state file: counts and position")
	fs.DurationVar(&c.every, "every", 5*time.Second, "report interval")
	fs.DurationVar(&c.window, "window", time.Minute, "rolling rate window")
	fs.BoolVar(&c.json, "json", false, "print reports as JSON lines")
	fs.BoolVar(&c.protect, "protect", true, "keep the stream from purging what this consumer has not acked (metadata "+streams.MetaProtect+")")
	fs.IntVar(&c.maxBatch, "batch", 256, "messages per pull")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return c, err
	}
	c.shard.Num = *shardNum
	if err := c.shard.Validate(); err != nil {
		return c, err
	}
	if c.window < time.Second {
		return c, errors.New("-window must be at least 1s")
	}
	return c, nil
}

func run() error {
	cfg, err := parseFlags()
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	st, err := loadState(cfg.state)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(cfg.natsURL, nats.Name("analytics-go"), nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return fmt.Errorf("connect %s: %w", cfg.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	a := &analytics{cfg: cfg, js: js, log: log, st: st, rate: newRate(cfg.window)}
	log.Info("analytics consumer starting", "stream", cfg.shard.ChangesStream(), "consumer", cfg.durable,
		"seq", st.Seq, "watermark", st.Watermark)
	err = a.run(ctx)
	if perr := a.persist(); perr != nil && err == nil {
		err = perr
	}
	a.report()
	return err
}

// counts are one table's changes. Backfill counts rows of initial copies
// and re-copies, which are not changes made upstream.
type counts struct {
	Insert   int64 `json:"insert"`
	Update   int64 `json:"update"`
	Delete   int64 `json:"delete"`
	Truncate int64 `json:"truncate,omitempty"`
	Backfill int64 `json:"backfill,omitempty"`
}

func (c *counts) add(o *counts) {
	c.Insert += o.Insert
	c.Update += o.Update
	c.Delete += o.Delete
	c.Truncate += o.Truncate
	c.Backfill += o.Backfill
}

// state is what the state file holds: the counts of every complete
// transaction up to and including stream message Seq, whose last complete
// transaction is Watermark.
type state struct {
	Seq            uint64             `json:"seq"`
	Watermark      string             `json:"watermark"`
	ReplicaVersion string             `json:"replicaVersion,omitempty"`
	Transactions   int64              `json:"transactions"`
	Resets         int64              `json:"resets,omitempty"`
	Tables         map[string]*counts `json:"tables"`
}

func loadState(file string) (*state, error) {
	st := &state{Tables: map[string]*counts{}}
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("state file %s: %w", file, err)
	}
	if st.Tables == nil {
		st.Tables = map[string]*counts{}
	}
	return st, nil
}

// save writes the state to a temporary file and renames it over the old
// one, so that a crash leaves either the old state or the new.
func (st *state) save(file string) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(file)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// GapError is history the consumer cannot count without a gap or a
// duplicate.
type GapError struct {
	Seq    uint64
	Reason string
}

func (e *GapError) Error() string { return fmt.Sprintf("gap at stream seq %d: %s", e.Seq, e.Reason) }

type analytics struct {
	cfg  config
	js   jetstream.JetStream
	log  *slog.Logger
	st   *state // complete transactions only
	rate *rate

	// The transaction in hand, counted apart until its last part.
	open     bool
	openWM   string
	nextPart int
	pending  map[string]*counts
	reset    string // the replica version, when it is a reset
	frag     streams.Assembler

	seen     uint64        // the last message handled, complete or not
	dirty    bool          // st is ahead of the file
	ackable  jetstream.Msg // the message st.Seq names, not yet acked
	saved    time.Time
	reported time.Time
}

// run consumes until ctx ends. Any NATS trouble (jetsync restarting, a
// failover, the consumer deleted) starts over from the position in hand.
func (a *analytics) run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := a.consume(ctx)
		var gap *GapError
		switch {
		case ctx.Err() != nil:
		case errors.As(err, &gap):
			return err
		case err != nil:
			a.log.Warn("consumer interrupted; resuming", "err", err, "seq", a.st.Seq)
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

func (a *analytics) consume(ctx context.Context) error {
	// A transaction left open is read again from its first message.
	a.dropOpen()
	if err := a.persist(); err != nil {
		return err
	}
	a.seen = a.st.Seq
	stream, err := a.js.Stream(ctx, a.cfg.shard.ChangesStream())
	if err != nil {
		return fmt.Errorf("stream %s: %w", a.cfg.shard.ChangesStream(), err)
	}
	start, err := a.start(stream)
	if err != nil {
		return err
	}
	cons, err := a.ensureConsumer(ctx, stream, start)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(a.cfg.maxBatch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		for msg := range batch.Messages() {
			if err := a.handle(msg); err != nil {
				return err
			}
			if !a.open && a.dirty && time.Since(a.saved) > time.Second {
				if err := a.persist(); err != nil {
					return err
				}
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("fetch: %w", err)
		}
		// Caught up, or a pause: store the progress.
		if !a.open {
			if err := a.persist(); err != nil {
				return err
			}
		}
		if time.Since(a.reported) >= a.cfg.every {
			a.report()
		}
	}
	return nil
}

// start is the stream sequence to read from: the message after the state's,
// or the stream's first when there is no state.
func (a *analytics) start(stream jetstream.Stream) (uint64, error) {
	info := stream.CachedInfo()
	first, last := info.State.FirstSeq, info.State.LastSeq
	if a.st.Seq == 0 {
		return max(first, 1), nil
	}
	next := a.st.Seq + 1
	switch {
	case last < a.st.Seq:
		return 0, &GapError{next, fmt.Sprintf("the stream ends at seq %d, before this consumer's %d: it was recreated", last, a.st.Seq)}
	case first > next:
		return 0, &GapError{next, fmt.Sprintf("the stream now starts at seq %d: history was purged past this consumer", first)}
	}
	return next, nil
}

// ensureConsumer returns the durable consumer, recreated unless it would
// deliver from start with nothing in flight.
func (a *analytics) ensureConsumer(ctx context.Context, stream jetstream.Stream, start uint64) (jetstream.Consumer, error) {
	filter := a.cfg.shard.ChangesFilter()
	cons, err := stream.Consumer(ctx, a.cfg.durable)
	switch {
	case err == nil:
		info := cons.CachedInfo()
		if info.Delivered.Stream == start-1 && info.AckFloor.Stream == start-1 && info.Config.FilterSubject == filter {
			return cons, nil
		}
		a.log.Info("recreating the durable consumer at this consumer's position", "seq", start,
			"delivered", info.Delivered.Stream, "ack_floor", info.AckFloor.Stream)
		if err := stream.DeleteConsumer(ctx, a.cfg.durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("delete consumer %s: %w", a.cfg.durable, err)
		}
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("consumer %s: %w", a.cfg.durable, err)
	}
	var meta map[string]string
	if a.cfg.protect {
		meta = map[string]string{streams.MetaProtect: "true"}
	}
	cons, err = stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       a.cfg.durable,
		Description:   "analytics-go counts per table",
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   start,
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       time.Minute,
		MaxDeliver:    -1,
		FilterSubject: filter,
		Metadata:      meta,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", a.cfg.durable, err)
	}
	return cons, nil
}

func isReset(p *streams.Part) bool {
	return p.Num == 0 && len(p.Changes) > 0 && p.Changes[0].Op == streams.OpReset
}

// handle counts one message's parts.
func (a *analytics) handle(msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("message metadata: %w", err)
	}
	seq := meta.Sequence.Stream
	if seq <= a.seen {
		return nil // a redelivery of what is counted or in hand
	}
	m, err := streams.Decode(msg.Data())
	if err != nil {
		// Never skipped: the stream's integrity is broken.
		return &GapError{seq, fmt.Sprintf("undecodable message: %v", err)}
	}
	if err := a.apply(seq, m); err != nil {
		return err
	}
	if !a.open {
		a.ackable = msg
	}
	return nil
}

// apply counts message seq, checking that it follows what came before.
func (a *analytics) apply(seq uint64, m *streams.Message) error {
	if seq <= a.seen {
		return nil
	}
	table := m.Schema + "." + m.Table
	for i := range m.Parts {
		p := &m.Parts[i]
		switch {
		case isReset(p):
			// A new initial sync: the history before it is superseded,
			// and so is a transaction in hand.
			a.dropOpen()
			a.begin(p.Watermark)
		case !a.open:
			if p.Num != 0 {
				if a.st.Watermark == "" {
					continue // the stream was purged mid-transaction before a first start
				}
				return &GapError{seq, fmt.Sprintf("part %s:%d without the parts before it", p.Watermark, p.Num)}
			}
			if a.st.Watermark != "" && p.Prev != a.st.Watermark {
				return &GapError{seq, fmt.Sprintf("transaction %s follows %q, but this consumer is at %s", p.Watermark, p.Prev, a.st.Watermark)}
			}
			a.begin(p.Watermark)
		case p.Watermark != a.openWM || p.Num != a.nextPart:
			return &GapError{seq, fmt.Sprintf("part %s:%d where %s:%d was due", p.Watermark, p.Num, a.openWM, a.nextPart)}
		}
		changes, err := a.frag.Part(m.Schema, m.Table, p)
		if err != nil {
			return &GapError{seq, err.Error()}
		}
		for j := range changes {
			a.count(table, &changes[j])
		}
		a.nextPart++
		if p.Last {
			a.commit(p)
		}
	}
	a.seen = seq
	if !a.open {
		a.st.Seq = seq
		a.dirty = true
	}
	return nil
}

func (a *analytics) begin(wm string) {
	a.open, a.openWM, a.nextPart = true, wm, 0
	a.pending = map[string]*counts{}
}

func (a *analytics) dropOpen() {
	a.open, a.openWM, a.nextPart, a.pending, a.reset = false, "", 0, nil, ""
	a.frag.Reset()
}

func (a *analytics) count(table string, c *streams.Change) {
	p := a.pending[table]
	if p == nil {
		p = &counts{}
		a.pending[table] = p
	}
	switch c.Op {
	case streams.OpInsert:
		p.Insert++
	case streams.OpUpdate:
		p.Update++
	case streams.OpDelete:
		p.Delete++
	case streams.OpTruncate:
		p.Truncate++
	case streams.OpBackfill:
		p.Backfill += int64(len(c.Rows))
	case streams.OpReset:
		a.reset = c.Reset.ReplicaVersion
	}
}

// commit folds the transaction in hand into the state.
func (a *analytics) commit(p *streams.Part) {
	var changes int64
	for table, c := range a.pending {
		if *c == (counts{}) {
			continue
		}
		t := a.st.Tables[table]
		if t == nil {
			t = &counts{}
			a.st.Tables[table] = t
		}
		t.add(c)
		changes += c.Insert + c.Update + c.Delete
	}
	if a.reset != "" {
		a.st.ReplicaVersion = a.reset
		a.st.Resets++
	}
	a.st.Watermark = p.Watermark
	a.st.Transactions++
	if p.CommitTimeMs > 0 {
		a.rate.add(time.UnixMilli(int64(p.CommitTimeMs)), changes)
	}
	a.dropOpen()
}

// persist writes the state, then acks the stream up to it.
func (a *analytics) persist() error {
	if !a.dirty {
		return nil
	}
	if err := a.st.save(a.cfg.state); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	a.dirty = false
	a.saved = time.Now()
	if a.ackable != nil {
		// A lost ack only means a redelivery, which handle skips.
		_ = a.ackable.Ack()
		a.ackable = nil
	}
	return nil
}

// report is one printed reading of the counts.
type report struct {
	Time         time.Time          `json:"time"`
	Seq          uint64             `json:"seq"`
	Watermark    string             `json:"watermark"`
	Transactions int64              `json:"transactions"`
	Tables       map[string]*counts `json:"tables"`
	RatePerSec   float64            `json:"ratePerSec"`
	WindowSec    float64            `json:"windowSec"`
}

func (a *analytics) report() {
	a.reported = time.Now()
	r := report{Time: a.reported.UTC(), Seq: a.st.Seq, Watermark: a.st.Watermark, Transactions: a.st.Transactions,
		Tables: a.st.Tables, RatePerSec: a.rate.perSec(a.reported), WindowSec: a.cfg.window.Seconds()}
	if a.cfg.json {
		data, _ := json.Marshal(r)
		fmt.Println(string(data))
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s seq=%d watermark=%s transactions=%d rate=%.1f/s (last %s)\n",
		r.Time.Format(time.RFC3339), r.Seq, r.Watermark, r.Transactions, r.RatePerSec, a.cfg.window)
	names := make([]string, 0, len(r.Tables))
	for n := range r.Tables {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := r.Tables[n]
		fmt.Fprintf(&b, "  %-30s insert=%d update=%d delete=%d", n, c.Insert, c.Update, c.Delete)
		if c.Truncate > 0 {
			b.WriteString(" truncate=" + strconv.FormatInt(c.Truncate, 10))
		}
		if c.Backfill > 0 {
			b.WriteString(" backfill=" + strconv.FormatInt(c.Backfill, 10))
		}
		b.WriteByte('\n')
	}
	fmt.Print(b.String())
}

// rate counts row changes per second of upstream commit time over a
// rolling window. It lives in memory only: after a restart it fills again.
type rate struct {
	window  time.Duration
	buckets map[int64]int64 // unix second → changes
}

func newRate(window time.Duration) *rate {
	return &rate{window: window, buckets: map[int64]int64{}}
}

func (r *rate) add(at time.Time, n int64) {
	if n == 0 || at.Before(time.Now().Add(-r.window)) {
		return
	}
	r.buckets[at.Unix()] += n
}

func (r *rate) perSec(now time.Time) float64 {
	from := now.Add(-r.window).Unix()
	var sum int64
	for s, n := range r.buckets {
		if s <= from {
			delete(r.buckets, s)
			continue
		}
		sum += n
	}
	return float64(sum) / r.window.Seconds()
}
