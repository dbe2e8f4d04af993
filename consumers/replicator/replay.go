package replicator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// ReplayConfig configures Replay.
type ReplayConfig struct {
	// File is the replica to build or extend.
	File  string
	Shard streams.Shard
	// FromSeq is the first stream sequence to read; 0 means the one after
	// the replica's last, or for a new file the reset the producer
	// recorded (else the stream's first message).
	FromSeq uint64
	// ToSeq is the last; 0 means the stream's end when Replay starts. A
	// transaction that runs past it is left out.
	ToSeq uint64
	// Table, if set, is the one replica table (as TableName names it) whose
	// changes are applied.
	Table string
	// BatchSize defaults to DefaultBatchSize.
	BatchSize int
	Logger    *slog.Logger
}

// Replay builds or extends a replica file from the change stream's
// messages FromSeq to ToSeq, with an ordered consumer that leaves no state
// on the server. It stops at the first gap with a *GapError.
func Replay(ctx context.Context, js jetstream.JetStream, cfg ReplayConfig) (replica.State, error) {
	if cfg.File == "" {
		return replica.State{}, errors.New("replica file is required")
	}
	if err := cfg.Shard.Validate(); err != nil {
		return replica.State{}, err
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	db, err := OpenDB(cfg.File)
	if err != nil {
		return replica.State{}, err
	}
	defer db.Close()
	st, err := replica.LoadState(ctx, db)
	if err != nil {
		return replica.State{}, err
	}
	p := newProcessor(db, st)
	p.table = cfg.Table
	name := cfg.Shard.ChangesStream()
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return st, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return st, fmt.Errorf("stream %s: %w", name, err)
	}
	first, last := max(info.State.FirstSeq, 1), info.State.LastSeq
	to := last
	if cfg.ToSeq != 0 {
		to = min(cfg.ToSeq, last)
	}
	from := cfg.FromSeq
	if from == 0 {
		from = first
		if st.ReplicaVersion != "" {
			from = st.StreamSeq + 1
		} else if up, err := readUpstream(ctx, js, cfg.Shard); err != nil {
			return st, err
		} else if up.ResetSeq >= first {
			from = up.ResetSeq
		}
	}
	if from > to {
		return st, nil
	}
	oc, err := js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{cfg.Shard.ChangesFilter()},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    from,
	})
	if err != nil {
		return st, fmt.Errorf("replay %s: %w", name, err)
	}
	it, err := oc.Messages()
	if err != nil {
		return st, fmt.Errorf("replay %s: %w", name, err)
	}
	defer it.Stop()
	cfg.Logger.Info("replaying", logkey.Stream, name, "from", from, "to", to, "file", cfg.File, logkey.Table, cfg.Table)
	sctx := context.WithoutCancel(ctx)
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			p.rollback()
			return p.st, fmt.Errorf("replay %s: %w", name, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			p.rollback()
			return p.st, fmt.Errorf("replay %s: %w", name, err)
		}
		seq := meta.Sequence.Stream
		if seq > to {
			break
		}
		if seq > p.pending.StreamSeq {
			m, err := streams.Decode(msg.Data())
			if err != nil {
				p.rollback()
				return p.st, &DecodeError{Seq: seq, Err: err}
			}
			if err := p.handle(sctx, seq, m); err != nil {
				p.rollback()
				return p.st, err
			}
			if p.committable() && p.msgs >= cfg.BatchSize {
				if _, err := p.commit(sctx, time.Now()); err != nil {
					return p.st, err
				}
				p.keepStatements(sctx)
			}
		}
		if seq >= to {
			break
		}
	}
	if p.tx != nil {
		if err := p.abortOpen(sctx); err != nil {
			p.rollback()
			return p.st, err
		}
	}
	if p.tx != nil {
		if _, err := p.commit(sctx, time.Now()); err != nil {
			return p.st, err
		}
	}
	return p.st, nil
}

func readUpstream(ctx context.Context, js jetstream.JetStream, shard streams.Shard) (streams.Upstream, error) {
	c := &Consumer{js: js, cfg: Config{Shard: shard}, log: slog.New(slog.DiscardHandler)}
	return c.upstream(ctx)
}
