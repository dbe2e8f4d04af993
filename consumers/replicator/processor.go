package replicator

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// GapError reports history the replica cannot follow: a transaction whose
// prev is not the replica's watermark, or parts that do not follow one
// another. Nothing past it is applied.
type GapError struct {
	Seq    uint64 // stream sequence of the offending message
	Reason string
}

func (e *GapError) Error() string {
	return fmt.Sprintf("gap in the change stream at seq %d: %s", e.Seq, e.Reason)
}

// DecodeError reports a message that is not a change message: the stream's
// integrity is broken, and no consumer may skip it.
type DecodeError struct {
	Seq uint64
	Err error
}

func (e *DecodeError) Error() string { return fmt.Sprintf("decode message seq %d: %v", e.Seq, e.Err) }
func (e *DecodeError) Unwrap() error { return e.Err }

// processor turns change messages into SQLite transactions. Upstream
// transactions accumulate in one SQLite transaction until the caller
// commits at a point where none is half applied. Each upstream transaction
// runs in a savepoint, so one left open (by a reset, or the end of a replay)
// can be dropped without losing the complete ones before it.
type processor struct {
	db      *sql.DB
	applier *replica.Applier
	// table, if set, limits which table's changes are applied (Replay).
	table string

	st      replica.State // committed
	pending replica.State // st plus what tx holds
	tx      *sql.Tx
	msgs    int // messages in tx
	// waiting is set while there is no replica: everything before a reset
	// is skipped.
	waiting bool

	open     bool // an upstream transaction is partly applied
	openWM   string
	nextPart int
	// openMidMsg is set when the open transaction began after a complete
	// one in the same message, so no message boundary precedes it.
	openMidMsg bool
	// clean is pending as of the last message that left no transaction
	// open, where an abort returns to.
	clean replica.State
	// frag joins the fragments of a change too big for one message; one
	// is partly joined only inside the open transaction.
	frag streams.Assembler

	// What tx holds, for metrics and subscribers.
	txns, changes int
	commitTimes   []float64 // upstream commit times (ms) of its transactions
	reset         bool
	batch         *changeBatch // nil when not collecting
	// newBatch, if set, starts collecting at begin; it returns nil when
	// nobody wants the changes.
	newBatch func() *changeBatch
}

// outcome is what a commit applied.
type outcome struct {
	txns, changes int
	// reset means subscribers must re-read: an initial sync, a table-wide
	// change, or changes not collected.
	reset bool
	rows  []RowChange
	// initialSync is set when the batch holds a reset.
	initialSync bool
	// commitTimes are the upstream commit times (ms since the epoch) of
	// the transactions applied, for the replication lag.
	commitTimes []float64
	// traces are the apply spans of the traced messages committed.
	traces []trace.SpanContext
}

func newProcessor(db *sql.DB, st replica.State) *processor {
	return &processor{db: db, applier: replica.NewApplier(db), st: st, pending: st, clean: st, waiting: st.ReplicaVersion == ""}
}

// committable reports whether tx holds complete transactions only.
func (p *processor) committable() bool { return p.tx != nil && !p.open }

func (p *processor) begin(ctx context.Context) error {
	if p.tx != nil {
		return nil
	}
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	p.tx = tx
	if p.newBatch != nil {
		p.batch = p.newBatch()
	}
	return nil
}

func isReset(pt *streams.Part) bool {
	return pt.Num == 0 && len(pt.Changes) > 0 && pt.Changes[0].Op == streams.OpReset
}

// handle applies message seq. It returns a *GapError for history it cannot
// follow, leaving the caller to roll back.
func (p *processor) handle(ctx context.Context, seq uint64, m *streams.Message) error {
	applied := false
	for i := range m.Parts {
		pt := &m.Parts[i]
		switch {
		case isReset(pt):
			if err := p.begin(ctx); err != nil {
				return err
			}
			if p.open {
				// A new initial sync supersedes the transaction in flight.
				if err := p.abortOpen(ctx); err != nil {
					return err
				}
			}
			r := pt.Changes[0].Reset
			pubs := slices.Clone(r.Publications)
			sort.Strings(pubs)
			p.pending = replica.State{ReplicaVersion: r.ReplicaVersion, Publications: pubs, Watermark: r.ReplicaVersion, ResetSeq: seq}
			p.waiting = false
			p.reset = true
			if p.batch != nil {
				p.batch.setReset()
			}
		case p.waiting:
			continue
		case !p.open:
			if pt.Num != 0 {
				return &GapError{seq, fmt.Sprintf("part %s:%d without the parts before it", pt.Watermark, pt.Num)}
			}
			if pt.Prev != p.pending.Watermark {
				return &GapError{seq, fmt.Sprintf("transaction %s follows %q, but the replica is at %s", pt.Watermark, pt.Prev, p.pending.Watermark)}
			}
			if pt.Watermark <= p.pending.Watermark {
				return &GapError{seq, fmt.Sprintf("transaction %s does not advance past %s", pt.Watermark, p.pending.Watermark)}
			}
		case pt.Watermark != p.openWM || pt.Num != p.nextPart:
			return &GapError{seq, fmt.Sprintf("part %s:%d where %s:%d was due", pt.Watermark, pt.Num, p.openWM, p.nextPart)}
		}
		if err := p.begin(ctx); err != nil {
			return err
		}
		if !p.open {
			if _, err := p.applier.Exec(ctx, p.tx, "SAVEPOINT upstream_tx"); err != nil {
				return fmt.Errorf("savepoint: %w", err)
			}
			p.open, p.openWM, p.nextPart, p.openMidMsg = true, pt.Watermark, 0, i > 0
		}
		// Fragments are joined whatever the table filter, so that a
		// broken sequence is caught in a replay too.
		changes, err := p.frag.Part(m.Schema, m.Table, pt)
		if err != nil {
			return &DecodeError{Seq: seq, Err: err}
		}
		if len(changes) != len(pt.Changes) || len(changes) > 0 && &changes[0] != &pt.Changes[0] {
			joined := *pt
			joined.Changes = changes
			pt = &joined
		}
		if p.table == "" || isReset(pt) || replica.TableName(m.Schema, m.Table) == p.table {
			if p.batch != nil && !p.batch.reset {
				p.applier.Collector = p.batch
			} else {
				p.applier.Collector = nil
			}
			if err := p.applier.Apply(ctx, p.tx, m.Schema, m.Table, pt); err != nil {
				return err
			}
			p.changes += countChanges(pt)
		}
		applied = true
		p.nextPart++
		if pt.Last {
			if _, err := p.applier.Exec(ctx, p.tx, "RELEASE upstream_tx"); err != nil {
				return fmt.Errorf("release savepoint: %w", err)
			}
			p.open = false
			p.pending.Watermark = pt.Watermark
			p.txns++
			if pt.CommitTimeMs > 0 {
				p.commitTimes = append(p.commitTimes, pt.CommitTimeMs)
			}
		}
	}
	if applied || p.tx != nil {
		p.msgs++
		p.pending.StreamSeq = seq
		if !p.open {
			p.clean = p.pending
		}
	}
	return nil
}

func countChanges(pt *streams.Part) int {
	n := 0
	for i := range pt.Changes {
		if c := &pt.Changes[i]; c.Op == streams.OpBackfill {
			n += len(c.Rows)
		} else {
			n++
		}
	}
	return n
}

// abortOpen drops the half-applied upstream transaction, keeping the
// complete ones before it. When they share its first message, which will be
// read again, it drops the whole batch instead (tx is then nil).
func (p *processor) abortOpen(ctx context.Context) error {
	if !p.open {
		return nil
	}
	if p.openMidMsg {
		p.rollback()
		return nil
	}
	if _, err := p.applier.Exec(ctx, p.tx, "ROLLBACK TO upstream_tx"); err != nil {
		return fmt.Errorf("roll back to savepoint: %w", err)
	}
	if _, err := p.applier.Exec(ctx, p.tx, "RELEASE upstream_tx"); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	// The applier may have cached tables the savepoint no longer holds.
	p.applier.Discard()
	p.frag.Reset()
	p.open = false
	p.pending = p.clean
	p.waiting = p.pending.ReplicaVersion == ""
	if p.batch != nil {
		p.batch.setReset()
	}
	return nil
}

// commit stores the progress and commits.
func (p *processor) commit(ctx context.Context, now time.Time) (outcome, error) {
	if p.open {
		return outcome{}, fmt.Errorf("commit inside transaction %s", p.openWM)
	}
	p.pending.WriteTimeMs = now.UnixMilli()
	if err := replica.SaveProgress(ctx, p.applier.Execer(p.tx), p.pending); err != nil {
		p.rollback()
		return outcome{}, err
	}
	if err := p.applier.Flush(ctx, p.tx); err != nil {
		p.rollback()
		return outcome{}, err
	}
	if err := p.applier.Commit(p.tx); err != nil {
		p.rollback()
		return outcome{}, fmt.Errorf("commit: %w", err)
	}
	o := outcome{txns: p.txns, changes: p.changes, reset: p.reset || p.batch == nil || p.batch.reset, initialSync: p.reset, commitTimes: p.commitTimes}
	if !o.reset {
		o.rows = p.batch.changes
	}
	p.tx = nil
	p.st, p.clean = p.pending, p.pending
	p.resetCounts()
	return o, nil
}

// keepStatements keeps the statements the last commit's transaction
// prepared for itself, for the transactions after it: a step of its own,
// so that the consumer takes it once its subscribers have the commit.
func (p *processor) keepStatements(ctx context.Context) {
	if testKeepHook != nil {
		testKeepHook(p.st.StreamSeq)
	}
	p.applier.KeepStatements(ctx)
}

// testKeepHook, when set by a test, is called with the committed sequence
// as its statements are kept.
var testKeepHook func(seq uint64)

// rollback drops everything since the last commit.
func (p *processor) rollback() {
	if p.tx != nil {
		p.tx.Rollback()
		p.tx = nil
	}
	p.applier.Discard()
	p.frag.Reset()
	p.pending, p.clean = p.st, p.st
	p.open = false
	p.waiting = p.st.ReplicaVersion == ""
	p.resetCounts()
}

func (p *processor) resetCounts() {
	p.msgs, p.txns, p.changes, p.reset, p.commitTimes = 0, 0, 0, false, nil
	p.batch = nil
}

// wipe empties the replica, which then waits for a reset.
func (p *processor) wipe(ctx context.Context) error {
	p.rollback()
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := replica.Wipe(ctx, tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit wipe: %w", err)
	}
	p.st = replica.State{}
	p.rollback()
	return nil
}
