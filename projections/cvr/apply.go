package cvr

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jetsync/jetsync/streams"
)

// ErrGap reports a message that does not follow the last one applied to
// its group: messages in between were missed, so the group must be rebuilt
// from the start of its history.
var ErrGap = errors.New("gap in cvr history")

// Progress is where a group stands in the CVR stream.
type Progress struct {
	// Seq is the stream sequence of the last message applied; 0 means the
	// projection knows nothing of the group.
	Seq uint64
	// Prev, Part and Last are those of that message.
	Prev uint64
	Part int
	Last bool
	// SinceSnapshot counts the messages applied since the group's last
	// snapshot (or ever): what a rebuild would replay beyond it.
	SinceSnapshot int
}

// LoadProgress reads a group's progress; an unknown group has the zero
// Progress with Last set.
func LoadProgress(ctx context.Context, q Querier, groupID string) (Progress, error) {
	return scanProgress(q.QueryRowContext(ctx, progressSQL, groupID))
}

const progressSQL = `SELECT seq, prev, part, last, sinceSnapshot FROM instances WHERE groupID = ?`

func scanProgress(row *sql.Row) (Progress, error) {
	p := Progress{Last: true}
	var seq, prev int64
	err := row.Scan(&seq, &prev, &p.Part, &p.Last, &p.SinceSnapshot)
	if errors.Is(err, sql.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return Progress{}, fmt.Errorf("load cvr progress: %w", err)
	}
	p.Seq, p.Prev = uint64(seq), uint64(prev)
	return p, nil
}

// Apply applies m, the message at stream sequence seq, to its group within
// tx. It returns false, doing nothing, for a message at or below the
// group's last applied sequence, so redelivery is harmless. A message
// whose Prev is not the last applied sequence is a gap (ErrGap), unless it
// opens a snapshot: a snapshot replaces the group's whole state, which is
// how a reader skips history that compaction purged.
func Apply(ctx context.Context, tx *sql.Tx, seq uint64, m *streams.CVRMessage) (bool, error) {
	return (*Stmts)(nil).Apply(ctx, tx, seq, m)
}

// Apply is the package's Apply with the statements of s: tx must be a
// transaction of the *sql.DB that s was prepared on. A nil s prepares
// each statement in tx.
func (s *Stmts) Apply(ctx context.Context, tx *sql.Tx, seq uint64, m *streams.CVRMessage) (bool, error) {
	a := applier{ctx: ctx, tx: tx, group: m.Group, prep: s}
	defer a.close()
	ps, err := a.stmt(progressSQL)
	if err != nil {
		return false, fmt.Errorf("load cvr progress: %w", err)
	}
	p, err := scanProgress(ps.QueryRowContext(ctx, m.Group))
	if err != nil {
		return false, err
	}
	if seq <= p.Seq {
		return false, nil
	}
	snapshot := m.Part == 0 && len(m.Events) > 0 && m.Events[0].Op == streams.CVROpSnapshot
	switch {
	case snapshot:
	case m.Part == 0 && (m.Prev != p.Seq || !p.Last):
		return false, fmt.Errorf("%w: group %q at seq %d (part %d, last %v) got seq %d with prev %d",
			ErrGap, m.Group, p.Seq, p.Part, p.Last, seq, m.Prev)
	case m.Part > 0 && (p.Last || m.Part != p.Part+1 || m.Prev != p.Prev):
		return false, fmt.Errorf("%w: group %q at seq %d (part %d of update after %d) got part %d of update after %d",
			ErrGap, m.Group, p.Seq, p.Part, p.Prev, m.Part, m.Prev)
	}
	since := p.SinceSnapshot + 1
	if snapshot {
		if err := Drop(ctx, tx, m.Group); err != nil {
			return false, err
		}
		since = 1
	}
	if err := a.execArgs(insertInstanceSQL, []any{m.Group}); err != nil {
		return false, fmt.Errorf("apply cvr: %w", err)
	}
	for i := 0; i < len(m.Events); {
		// Runs of put-row events, nearly all of a hydration's update, go
		// in multi-row statements: one statement per row costs several
		// times more than the insert itself.
		if n := putRowRun(m.Events[i:]); n > 1 {
			if err := a.putRows(m.Events[i : i+n]); err != nil {
				return false, fmt.Errorf("apply cvr events %d to %d (put-row) of group %q: %w", i, i+n-1, m.Group, err)
			}
			i += n
			continue
		}
		if err := a.event(&m.Events[i]); err != nil {
			return false, fmt.Errorf("apply cvr event %d (%s) of group %q: %w", i, m.Events[i].Op, m.Group, err)
		}
		i++
	}
	// The update's version becomes the group's once it is complete, so that
	// an update needs no instance event to record it.
	q := progressUpdateSQL
	args := []any{int64(seq), int64(m.Prev), m.Part, m.Last, since, m.Group}
	if m.Last && m.Version != "" {
		q = progressVersionUpdateSQL
		args = []any{int64(seq), int64(m.Prev), m.Part, m.Last, since, m.Version, m.Group}
	}
	if err := a.execArgs(q, args); err != nil {
		return false, fmt.Errorf("apply cvr progress: %w", err)
	}
	return true, nil
}

// applier applies one message's events, each statement bound to the
// transaction once: prep's if it has it, else prepared in the transaction.
type applier struct {
	ctx   context.Context
	tx    *sql.Tx
	group string
	prep  *Stmts
	stmts map[string]*sql.Stmt
}

func (a *applier) close() {
	for _, s := range a.stmts {
		s.Close()
	}
}

// stmt is query's statement in the transaction.
func (a *applier) stmt(query string) (*sql.Stmt, error) {
	s := a.stmts[query]
	if s != nil {
		return s, nil
	}
	if p := a.prep.get(query); p != nil {
		// Reuses p's SQLite statement when p was prepared on the
		// transaction's connection, as it is on a single-connection pool;
		// on another connection, database/sql prepares it there and keeps
		// it for next time.
		s = a.tx.StmtContext(a.ctx, p)
	} else {
		var err error
		if s, err = a.tx.PrepareContext(a.ctx, query); err != nil {
			return nil, err
		}
	}
	if a.stmts == nil {
		a.stmts = map[string]*sql.Stmt{}
	}
	a.stmts[query] = s
	return s, nil
}

func (a *applier) exec(query string, args ...any) error {
	return a.execArgs(query, append([]any{a.group}, args...))
}

// execArgs runs query with args as they are.
func (a *applier) execArgs(query string, args []any) error {
	s, err := a.stmt(query)
	if err != nil {
		return err
	}
	_, err = s.ExecContext(a.ctx, args...)
	return err
}

func (a *applier) event(e *streams.CVREvent) error {
	switch e.Op {
	case streams.CVROpSnapshot:
		return nil // handled by Apply
	case streams.CVROpInstance:
		in := e.Instance
		return a.exec(instanceSQL,
			in.Version, in.ReplicaVersion, in.TTLClockMs, in.LastActiveMs, in.Owner, in.GrantedAtMs, in.ProfileID, in.UserID, in.Deleted)
	case streams.CVROpClientSchema:
		return a.exec(clientSchemaSQL, rawText(e.ClientSchema))
	case streams.CVROpPutClient:
		return a.exec(putClientSQL, e.Client.ID, e.Client.Deleted)
	case streams.CVROpDelClient:
		return a.exec(delClientSQL, e.Client.ID)
	case streams.CVROpPutQuery:
		q := e.Query
		return a.exec(putQuerySQL,
			q.Hash, rawText(q.AST), q.Name, rawText(q.Args), q.TransformationHash, q.TransformationVersion, q.Internal, q.Got, q.PatchVersion)
	case streams.CVROpGot:
		g := e.Got
		return a.exec(gotSQL,
			g.Hash, g.Got, g.PatchVersion)
	case streams.CVROpDelQuery:
		return a.exec(delQuerySQL, e.Query.Hash)
	case streams.CVROpPutDesire:
		d := e.Desire
		var inact sql.NullFloat64
		if d.InactivatedAtMs != nil {
			inact = sql.NullFloat64{Float64: *d.InactivatedAtMs, Valid: true}
		}
		return a.exec(putDesireSQL, d.ClientID, d.Hash, d.TTLMs, inact, d.Cleared, d.PatchVersion)
	case streams.CVROpDelDesire:
		return a.exec(delDesireSQL, e.Desire.ClientID, e.Desire.Hash)
	case streams.CVROpPutRow:
		return a.putRows([]streams.CVREvent{*e})
	case streams.CVROpPutRows:
		return a.putRowsShared(e.Rows)
	case streams.CVROpDelRow:
		return a.exec(delRowSQL, e.Row.Table, rawText(e.Row.Key))
	}
	return fmt.Errorf("%w: unknown cvr op %q", streams.ErrMalformed, e.Op)
}

// putRowsMax is how many rows one statement of putRows writes: 6
// parameters each, well under SQLite's limit of 32,766.
const putRowsMax = 200

// putRowRun counts the put-row events that open evs.
func putRowRun(evs []streams.CVREvent) int {
	n := 0
	for n < len(evs) && evs[n].Op == streams.CVROpPutRow {
		n++
	}
	return n
}

// putRows applies put-row events, putRowsMax rows per statement.
func (a *applier) putRows(evs []streams.CVREvent) error {
	var args []any
	for len(evs) > 0 {
		n := min(len(evs), putRowsMax)
		args = args[:0]
		for _, e := range evs[:n] {
			r := e.Row
			refs, err := refsArg(r.Refs)
			if err != nil {
				return err
			}
			args = append(args, a.group, r.Table, rawText(r.Key), r.RowVersion, r.PatchVersion, refs)
		}
		if err := a.execArgs(putRowsSQL(n), args); err != nil {
			return err
		}
		evs = evs[n:]
	}
	return nil
}

// putRowsShared applies a put-rows event, putRowsMax rows per statement.
func (a *applier) putRowsShared(r *streams.CVRRows) error {
	refs, err := refsArg(r.Refs)
	if err != nil {
		return err
	}
	args := make([]any, 0, 6*min(len(r.Keys), putRowsMax))
	for from := 0; from < len(r.Keys); from += putRowsMax {
		to := min(from+putRowsMax, len(r.Keys))
		args = args[:0]
		for i := from; i < to; i++ {
			args = append(args, a.group, r.Table, rawText(r.Keys[i]), r.RowVersions[i], r.PatchVersion, refs)
		}
		if err := a.execArgs(putRowsSQL(to-from), args); err != nil {
			return err
		}
	}
	return nil
}

var putRowsSQLs sync.Map // int → string

// putRowsSQL is the statement that puts n rows. Its parameters are
// anonymous: the driver looks each numbered one up by name, in time
// proportional to their number.
func putRowsSQL(n int) string {
	if s, ok := putRowsSQLs.Load(n); ok {
		return s.(string)
	}
	var b strings.Builder
	b.WriteString(`INSERT OR REPLACE INTO rows (groupID, tbl, key, rowVersion, patchVersion, refs) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?, ?, ?, ?, ?, ?)")
	}
	putRowsSQLs.Store(n, b.String())
	return b.String()
}

// refsArg is the refs column's value: NULL for a tombstone.
func refsArg(refs map[string]int) (any, error) {
	if refs == nil {
		return nil, nil
	}
	return refsJSON(refs)
}

// refsJSON is refs as encoding/json writes it (keys sorted), by hand for
// the common keys that need no escaping.
func refsJSON(refs map[string]int) (string, error) {
	if len(refs) == 1 {
		for k, v := range refs {
			if plain(k) {
				return `{"` + k + `":` + strconv.Itoa(v) + `}`, nil
			}
		}
	}
	b, err := json.Marshal(refs)
	return string(b), err
}

// plain reports whether encoding/json writes s between quotes unchanged.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// rawText is raw JSON in the form the stream carries it (compact, HTML
// escaped, as encoding/json writes a RawMessage), so that a record reads
// the same whether it was applied from the writer's events or decoded
// from the stream; nil is NULL.
func rawText(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	if plainJSON(b) {
		return string(b) // already compact, nothing to escape
	}
	n, err := json.Marshal(b)
	if err != nil {
		return string(b) // invalid JSON is stored as given; the decoder rejects it first
	}
	return string(n)
}

// plainJSON reports whether rawText may store b as it is: encoding/json
// writes valid JSON with no whitespace, nothing HTML-escaped and nothing
// beyond ASCII unchanged, and stores invalid JSON as given anyway.
func plainJSON(b []byte) bool {
	for _, c := range b {
		if c <= 0x20 || c >= 0x7f || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
