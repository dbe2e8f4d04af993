// Package pgrepl is the change-streamer: it streams an upstream Postgres
// database's changes (pgoutput logical replication) into the JetStream
// change stream, exactly once, after an initial sync of the published
// tables.
package pgrepl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/internal/progress"
	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

// Source streams one upstream database into the change stream.
type Source struct {
	cfg   Config
	js    jetstream.JetStream
	log   *slog.Logger
	names names
	reg   *pgvalue.Registry
	m     *metrics
}

// New returns a Source; Run starts it.
func New(cfg Config, js jetstream.JetStream) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.CopyWorkers == 0 {
		cfg.CopyWorkers = DefaultCopyWorkers
	}
	if cfg.ProgressEvery == 0 {
		cfg.ProgressEvery = progress.DefaultInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Stream.Shard = cfg.Shard
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("pgrepl: register metrics: %w", err)
	}
	return &Source{
		cfg:   cfg,
		js:    js,
		log:   cfg.Logger.With(logkey.Component, "change-streamer", logkey.Shard, cfg.Shard.ID()),
		names: newNames(cfg.Shard),
		reg:   pgvalue.NewRegistry(),
		m:     m,
	}, nil
}

// errResync ends a session so that the next one resets.
var errResync = errors.New("resync requested")

// runState outlives sessions.
type runState struct {
	resync <-chan *nats.Msg
	// waiting are the resync requests the next completed reset answers.
	waiting []*nats.Msg
	// streamed is set once a session reaches streaming.
	streamed bool
	// resyncReason, when set, is why the stream can't go on: the next
	// session resets.
	resyncReason string
}

// Run streams until ctx is done, reconnecting after transient failures. It
// returns nil on cancellation, and an error only for an upstream that
// needs fixing (ConfigError).
func (s *Source) Run(ctx context.Context) error {
	resync := make(chan *nats.Msg, 16)
	sub, err := s.js.Conn().Subscribe(s.cfg.Shard.ResyncSubject(), func(m *nats.Msg) {
		select {
		case resync <- m:
		default: // enough requests queued: the reset they trigger answers this one too
		}
	})
	if err != nil {
		return fmt.Errorf("pgrepl: subscribe %s: %w", s.cfg.Shard.ResyncSubject(), err)
	}
	defer sub.Unsubscribe()

	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = 30 * time.Second
	bo.MaxElapsedTime = 0
	rs := &runState{resync: resync}
	for {
		rs.streamed = false
		started := time.Now()
		err := s.session(ctx, rs)
		if ctx.Err() != nil {
			return nil
		}
		var cfgErr *ConfigError
		var rsErr *ResyncError
		switch {
		case errors.Is(err, errResync):
			s.log.Info("resync requested")
			continue
		case errors.As(err, &rsErr):
			s.log.Warn("replication cannot continue; resyncing", "reason", rsErr.Reason)
			rs.resyncReason = rsErr.Reason
			continue
		case errors.As(err, &cfgErr):
			return fmt.Errorf("pgrepl: %w", err)
		}
		// Only a session that streamed for a while earns a fresh backoff: one
		// that fails each time soon after it starts streaming must not
		// become a tight retry loop.
		if rs.streamed && time.Since(started) >= healthySession {
			bo.Reset()
		}
		d := bo.NextBackOff()
		s.log.Warn("replication interrupted; retrying", "err", err, "in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// healthySession is how long a session must stream before its failure
// counts as new trouble rather than the same one again.
const healthySession = 10 * time.Second

// position is where streaming starts and what the stream already holds.
type position struct {
	slot           string
	replicaVersion string
	startLSN       pglogrepl.LSN
	// prev is the commit watermark of the last complete transaction in the
	// stream, when known.
	prev string
	// resumeWM and resumePart: transactions before resumeWM are in the
	// stream, and so are parts 0..resumePart of resumeWM.
	resumeWM   string
	resumePart int
	// initial, in degraded mode, is the schema the replica version was
	// built from.
	initial *initialSchema
}

const allParts = math.MaxInt

func (p *position) partial() bool { return p.resumePart != allParts }

// inStream reports whether the transaction committing at wm is wholly in
// the stream already, so that a resumed session skips it: every transaction
// before resumeWM is, and resumeWM itself unless partial (only some of its
// parts are; the rest are published again). Watermarks are Lexi strings,
// so they compare as strings. The decoder and the publish loop both ask.
func inStream(wm, resumeWM string, partial bool) bool {
	return wm < resumeWM || wm == resumeWM && !partial
}

// session runs one connection to Postgres and NATS until an error.
func (s *Source) session(ctx context.Context, rs *runState) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, kv, err := streams.Ensure(ctx, s.js, s.cfg.Stream)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, s.cfg.UpstreamURL)
	if err != nil {
		return fmt.Errorf("connect upstream: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	up, err := setup(ctx, conn, s.names, s.cfg.Publications)
	if err != nil {
		return err
	}
	if !up.ddlDetection {
		s.log.Warn("no privilege to create event triggers: proceeding in degraded mode, where any schema change " +
			"to a published table forces a new initial sync")
	}
	rec, err := readUpstream(ctx, kv)
	if err != nil {
		return err
	}
	tl, err := readTail(ctx, stream, s.cfg.Shard)
	if err != nil {
		return err
	}
	for len(rs.resync) > 0 {
		rs.waiting = append(rs.waiting, <-rs.resync)
	}
	reason, err := s.resetReason(ctx, conn, up, rec, tl, rs)
	if err != nil {
		return err
	}

	replConn, err := connectReplication(ctx, s.cfg.UpstreamURL)
	if err != nil {
		return err
	}
	defer replConn.Close(context.WithoutCancel(ctx))
	pjs, err := newJetStream(s.js, maxPending)
	if err != nil {
		return err
	}
	pub := &publisher{js: pjs, next: tl.lastSeq + 1, lastSeq: tl.lastSeq, onAck: s.acked, fence: s.cfg.Fence}

	var pos position
	if reason != "" {
		s.log.Warn("resetting the change stream", "reason", reason)
		if pos, err = s.reset(ctx, conn, replConn, stream, kv, pub, up, rec, tl, reason); err != nil {
			return err
		}
		s.answerResyncs(rs, pos)
		rs.resyncReason = ""
	} else {
		pos = position{slot: rec.Slot, replicaVersion: rec.ReplicaVersion, resumeWM: tl.wm, resumePart: allParts}
		if tl.complete {
			pos.prev = tl.wm
		} else {
			pos.resumePart = tl.part
		}
		lsn, _ := streams.ParseLexi(tl.wm)
		pos.startLSN = pglogrepl.LSN(lsn)
		pub.replicaVersion = rec.ReplicaVersion
	}
	if !up.ddlDetection {
		if reason != "" {
			// The reset rewrote the record: the new initial sync starts
			// at its ResetSeq.
			if rec, err = readUpstream(ctx, kv); err != nil {
				return err
			}
		}
		if rec == nil || rec.ReplicaVersion != pos.replicaVersion {
			return fmt.Errorf("upstream record does not describe replica version %s", pos.replicaVersion)
		}
		pos.initial = newInitialSchema(stream, s.cfg.Shard, rec.ResetSeq, pos.replicaVersion, up.publications)
	}
	s.m.lastSeq.Set(float64(pub.lastSeq))
	return s.stream(ctx, conn, replConn, up, pos, pub, rs)
}

// resetReason says why the stream can't resume, or "".
func (s *Source) resetReason(ctx context.Context, conn *pgx.Conn, up upstream, rec *streams.Upstream, tl tail, rs *runState) (string, error) {
	switch {
	case rs.resyncReason != "":
		return rs.resyncReason, nil
	case len(rs.waiting) > 0:
		return "resync requested", nil
	case rec == nil:
		return "no upstream recorded", nil
	case !rec.Complete:
		return "the last initial sync did not complete", nil
	case rec.SystemID != up.systemID:
		return fmt.Sprintf("upstream system identifier changed from %s to %s", rec.SystemID, up.systemID), nil
	case rec.Database != up.database:
		return fmt.Sprintf("upstream database changed from %s to %s", rec.Database, up.database), nil
	case !slices.Equal(rec.Publications, up.publications):
		return fmt.Sprintf("publications changed from %v to %v", rec.Publications, up.publications), nil
	case tl.empty:
		return "the change stream is empty", nil
	case tl.replicaVersion != rec.ReplicaVersion:
		return fmt.Sprintf("the change stream holds replica version %s, not %s", tl.replicaVersion, rec.ReplicaVersion), nil
	}
	var exists bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots
		WHERE slot_name = $1 AND database = current_database() AND plugin = 'pgoutput')`, rec.Slot).Scan(&exists)
	if err != nil {
		return "", fmt.Errorf("check slot %s: %w", rec.Slot, err)
	}
	if !exists {
		return fmt.Sprintf("replication slot %s is gone", rec.Slot), nil
	}
	return "", nil
}

func readUpstream(ctx context.Context, kv jetstream.KeyValue) (*streams.Upstream, error) {
	e, err := kv.Get(ctx, streams.KeyUpstream)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", streams.KeyUpstream, err)
	}
	var u streams.Upstream
	if err := json.Unmarshal(e.Value(), &u); err != nil {
		// Unreadable is as good as absent: the reset rewrites it.
		return nil, nil
	}
	return &u, nil
}

func writeUpstream(ctx context.Context, kv jetstream.KeyValue, u *streams.Upstream) error {
	b, err := json.Marshal(u)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, streams.KeyUpstream, b); err != nil {
		return fmt.Errorf("write %s: %w", streams.KeyUpstream, err)
	}
	return nil
}

func (s *Source) answerResyncs(rs *runState, pos position) {
	for len(rs.resync) > 0 {
		rs.waiting = append(rs.waiting, <-rs.resync)
	}
	b, _ := json.Marshal(map[string]string{"replicaVersion": pos.replicaVersion, "slot": pos.slot})
	for _, m := range rs.waiting {
		m.Respond(b)
	}
	rs.waiting = nil
}

func (s *Source) acked(m *outMsg, seq uint64) {
	s.m.transactions.Add(float64(m.txs))
	s.m.changes.Add(float64(m.changes))
	s.m.lastSeq.Set(float64(seq))
}

func connectReplication(ctx context.Context, url string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse upstream URL: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "jetsync-change-streamer"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect replication: %w", err)
	}
	return conn, nil
}

// publicationNames is the publication_names option of START_REPLICATION.
func publicationNames(pubs []string) string {
	q := make([]string, len(pubs))
	for i, p := range pubs {
		q[i] = ident(p)
	}
	return literal(strings.Join(q, ","))
}
