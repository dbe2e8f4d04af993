// Package mutagen applies the Zero client's legacy CRUD mutations upstream,
// as zero-cache's mutagen does: one serializable Postgres transaction per
// mutation, which checks the deployed write rules (<app>.permissions) and
// advances the client's lastMutationID in <app>_<shard>.clients.
//
// It differs from zero-cache in one way: the rows the rules see before and
// after the mutation are read from Postgres inside the transaction, not from
// the replica, so a write on a row inserted a moment earlier finds it.
package mutagen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetsync/jetsync/consumers/zql"
	"github.com/jetsync/jetsync/consumers/zql/permissions"
	"github.com/jetsync/jetsync/internal/logkey"
)

// Error kinds of a mutation's answer (zero-protocol's ErrorKind).
const (
	KindMutationFailed      = "MutationFailed"
	KindMutationRateLimited = "MutationRateLimited"
	KindInvalidPush         = "InvalidPush"
)

// Op is one CRUD operation of a mutation's args[0].ops.
type Op struct {
	Op         string         `json:"op"`
	TableName  string         `json:"tableName"`
	PrimaryKey []string       `json:"primaryKey"`
	Value      map[string]any `json:"value"`
}

// Mutation is a crud push mutation.
type Mutation struct {
	ID       int64
	ClientID string
	Args     json.RawMessage
}

// MutationError is a mutation's answer when it is not applied: sent to the
// client as a transient error; later mutations go on.
type MutationError struct {
	Kind, Message string
}

// PushError is an error that stops the push: the client's connection gets
// it (an out-of-order mutation id is InvalidPush).
type PushError struct {
	Kind, Message string
}

func (e *PushError) Error() string { return e.Kind + ": " + e.Message }

// Config configures a Mutagen.
type Config struct {
	AppID string
	Shard int
	// LimitMax, when above zero, caps a client group's mutations within
	// LimitWindow (ZERO_PER_USER_MUTATION_LIMIT_MAX / _WINDOW_MS).
	LimitMax    int
	LimitWindow time.Duration
	// Timeout bounds each attempt at a mutation's transaction, the wait
	// for a pool connection included: a row lock held upstream, or a hung
	// upstream, then fails that mutation (MutationFailed) instead of
	// holding its connection and a pool connection for good. zero-cache
	// has no bound. Zero means DefaultTimeout.
	Timeout time.Duration
	Log     *slog.Logger
}

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 30 * time.Second

// Mutagen writes CRUD mutations upstream through a connection pool.
type Mutagen struct {
	pool *pgxpool.Pool
	cfg  Config

	mu       sync.Mutex
	rules    *permissions.Rules
	limiters map[string]*limiter
}

// New returns a Mutagen writing through pool.
func New(pool *pgxpool.Pool, cfg Config) *Mutagen {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.LimitWindow <= 0 {
		cfg.LimitWindow = time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &Mutagen{pool: pool, cfg: cfg, limiters: map[string]*limiter{}}
}

const maxSerializationAttempts = 10

// errAlreadyApplied marks a mutation whose id the client already got past.
var errAlreadyApplied = errors.New("mutation already applied")

// Process applies one mutation. It returns a MutationError for a mutation
// that was not applied but whose id was consumed (a failed write, a rate
// limit), or a *PushError that stops the push. A mutation denied by the
// write rules is not an error: its id is consumed and nothing is written,
// as in zero-cache.
//
// With custom mutators configured too, an out-of-order id is retried twice
// after 100 ms, as zero-cache does: the API server may not have committed
// the client's custom mutation before it yet.
func (m *Mutagen) Process(ctx context.Context, clientGroupID string, mut Mutation, authData map[string]any, customEnabled bool) (*MutationError, error) {
	if !m.allow(clientGroupID) {
		return &MutationError{KindMutationRateLimited, "Rate limit exceeded"}, nil
	}
	// zero-cache retries every failed mutation once in error mode, which
	// only advances lastMutationID: if that works the failure was the
	// app's, and the client hears of it.
	var result *MutationError
	errorMode := false
	for i := 0; i < maxSerializationAttempts; i++ {
		err := m.attempt(ctx, clientGroupID, mut, authData, errorMode)
		if err == nil {
			break
		}
		if errors.Is(err, errAlreadyApplied) {
			return nil, nil
		}
		var pe *PushError
		if errors.As(err, &pe) {
			if !errorMode && customEnabled && i < 2 {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			return nil, pe
		}
		if errorMode || ctx.Err() != nil {
			return nil, err
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40001" {
			continue
		}
		m.cfg.Log.Warn("crud mutation failed, re-running in error mode", logkey.ClientGroup, clientGroupID, logkey.Client, mut.ClientID, "mutation_id", mut.ID, "err", err)
		result = &MutationError{KindMutationFailed, errorString(err)}
		errorMode = true
		i--
	}
	return result, nil
}

// attempt runs the mutation's transaction once, within the timeout. A
// timeout is worded as such: the context's own error would say only that
// a deadline passed.
func (m *Mutagen) attempt(ctx context.Context, cgid string, mut Mutation, authData map[string]any, errorMode bool) error {
	actx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	err := pgx.BeginTxFunc(actx, m.pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
		return m.processTx(actx, tx, cgid, mut, authData, errorMode)
	})
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		return fmt.Errorf("mutation timed out after %v", m.cfg.Timeout)
	}
	return err
}

// errorString words an error as zero-cache's String(e) does.
func errorString(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return "PostgresError: " + pgErr.Message
	}
	return "Error: " + err.Error()
}

func (m *Mutagen) processTx(ctx context.Context, tx pgx.Tx, cgid string, mut Mutation, authData map[string]any, errorMode bool) error {
	if err := m.advance(ctx, tx, cgid, mut); err != nil {
		return err
	}
	if errorMode {
		return nil
	}
	ops, err := decodeOps(mut.Args)
	if err != nil {
		return err
	}
	rules, err := m.loadRules(ctx, tx)
	if err != nil {
		return err
	}
	for i := range ops {
		if err := checkTable(ctx, tx, &ops[i]); err != nil {
			return err
		}
	}
	// Upserts are checked as the insert or update they turn out to be.
	for i := range ops {
		if ops[i].Op.Op == "upsert" {
			found, err := exists(ctx, tx, &ops[i])
			if err != nil {
				return err
			}
			if found {
				ops[i].check = "update"
			} else {
				ops[i].check = "insert"
			}
		}
	}
	for i := range ops {
		if ok, err := m.can(ctx, tx, rules, &ops[i], permissions.PreMutation, authData); err != nil || !ok {
			return err
		}
	}
	// The writes go under a savepoint: if a postMutation rule denies, they
	// are undone while the lastMutationID advance stays.
	if _, err := tx.Exec(ctx, "SAVEPOINT crud_ops"); err != nil {
		return err
	}
	for i := range ops {
		if err := write(ctx, tx, &ops[i]); err != nil {
			return err
		}
	}
	for i := range ops {
		ok, err := m.can(ctx, tx, rules, &ops[i], permissions.PostMutation, authData)
		if err != nil {
			return err
		}
		if !ok {
			_, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT crud_ops")
			return err
		}
	}
	return nil
}

// advance bumps the client's lastMutationID and checks the mutation is the
// next one (zero-cache's checkSchemaVersionAndIncrementLastMutationID).
func (m *Mutagen) advance(ctx context.Context, tx pgx.Tx, cgid string, mut Mutation) error {
	schema := ident(m.cfg.AppID + "_" + strconv.Itoa(m.cfg.Shard))
	var last int64
	err := tx.QueryRow(ctx, `INSERT INTO `+schema+`.clients AS current ("clientGroupID", "clientID", "lastMutationID")
		VALUES ($1, $2, 1)
		ON CONFLICT ("clientGroupID", "clientID")
		DO UPDATE SET "lastMutationID" = current."lastMutationID" + 1
		RETURNING "lastMutationID"`, cgid, mut.ClientID).Scan(&last)
	if err != nil {
		return err
	}
	switch {
	case mut.ID < last:
		return errAlreadyApplied
	case mut.ID > last:
		return &PushError{KindInvalidPush, fmt.Sprintf("Push contains unexpected mutation id %d for client %s. Expected mutation id %d.", mut.ID, mut.ClientID, last)}
	}
	return nil
}

// loadRules reads <app>.permissions in tx, reusing the last parse while the
// text is unchanged.
func (m *Mutagen) loadRules(ctx context.Context, tx pgx.Tx) (*permissions.Rules, error) {
	var raw *string
	err := tx.QueryRow(ctx, `SELECT "permissions"::text FROM `+ident(m.cfg.AppID)+`."permissions" LIMIT 1`).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && (raw == nil || *raw == "null")) {
		return permissions.None, nil
	}
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	prev := m.rules
	m.mu.Unlock()
	if prev != nil && prev.Raw() == *raw {
		return prev, nil
	}
	r, err := permissions.Parse(*raw)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.rules = r
	m.mu.Unlock()
	return r, nil
}

// crudOp is an Op with what its checks need.
type crudOp struct {
	Op
	// check is the action the rules see: the op, or for an upsert the
	// insert or update it is.
	check string
	pk    map[string]any
}

func decodeOps(args json.RawMessage) ([]crudOp, error) {
	var a []struct {
		Ops []Op `json:"ops"`
	}
	if err := json.Unmarshal(args, &a); err != nil || len(a) != 1 {
		return nil, fmt.Errorf("invalid CRUD mutation args")
	}
	out := make([]crudOp, len(a[0].Ops))
	for i, op := range a[0].Ops {
		switch op.Op {
		case "insert", "upsert", "update", "delete":
		default:
			return nil, fmt.Errorf("unknown CRUD op %q", op.Op)
		}
		if op.TableName == "" || len(op.PrimaryKey) == 0 {
			return nil, fmt.Errorf("CRUD op without a table or primary key")
		}
		pk := map[string]any{}
		for _, col := range op.PrimaryKey {
			v, ok := op.Value[col]
			if !ok || v == nil {
				return nil, fmt.Errorf("Primary key column '%s' is missing from operation value for table %s", col, op.TableName)
			}
			pk[col] = v
		}
		out[i] = crudOp{Op: op, check: op.Op, pk: pk}
	}
	return out, nil
}

// checkTable refuses a table that is not upstream, as zero-cache refuses
// one its replica lacks.
func checkTable(ctx context.Context, tx pgx.Tx, op *crudOp) error {
	schema, table := splitTable(op.TableName)
	var ok bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = $2)`, schema, table).Scan(&ok)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("Table '%s' is not a valid table.", op.TableName)
	}
	return nil
}

func exists(ctx context.Context, tx pgx.Tx, op *crudOp) (bool, error) {
	q := &query{}
	q.b.WriteString("SELECT EXISTS (SELECT 1 FROM " + qualified(op.TableName) + " WHERE ")
	q.pkWhere(op.pk, "")
	q.b.WriteString(")")
	var ok bool
	err := tx.QueryRow(ctx, q.b.String(), q.args...).Scan(&ok)
	return ok, err
}

// can checks op against the rules of phase: the row with op's key, as it
// is in tx, must match a condition of every applicable policy.
func (m *Mutagen) can(ctx context.Context, tx pgx.Tx, rules *permissions.Rules, op *crudOp, phase string, authData map[string]any) (bool, error) {
	switch {
	case op.check == "insert" && phase == permissions.PreMutation,
		op.check == "delete" && phase == permissions.PostMutation:
		return true, nil
	}
	if op.check == "update" || op.check == "delete" {
		// zero-cache fails an update or delete of a row it cannot find.
		if phase == permissions.PreMutation {
			found, err := exists(ctx, tx, op)
			if err != nil {
				return false, err
			}
			if !found {
				b, _ := json.Marshal(op.Value)
				return false, fmt.Errorf("Pre-mutation row not found for %s", b)
			}
		}
	}
	sets := func(col string) bool { _, ok := op.Value[col]; return ok }
	for _, pol := range rules.WritePolicies(op.TableName, op.check, phase, sets, authData) {
		ok, err := matches(ctx, tx, op, pol)
		if err != nil || !ok {
			if err == nil {
				m.cfg.Log.Info("CRUD write denied by the write rules", logkey.Table, op.TableName, "action", op.check, "phase", phase)
			}
			return false, err
		}
	}
	return true, nil
}

func matches(ctx context.Context, tx pgx.Tx, op *crudOp, pol []zql.Condition) (bool, error) {
	if len(pol) == 0 {
		return false, nil
	}
	stmt, args, err := rowMatchesSQL(op.TableName, op.pk, pol)
	if err != nil {
		return false, err
	}
	var one int
	err = tx.QueryRow(ctx, stmt, args...).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// write runs op's statement, as zero-cache words each.
func write(ctx context.Context, tx pgx.Tx, op *crudOp) error {
	types, err := columnTypes(ctx, tx, op.TableName)
	if err != nil {
		return err
	}
	q := &query{}
	cols := sortedKeys(op.Value)
	table := qualified(op.TableName)
	// A value is a parameter, except a time given as epoch milliseconds,
	// as the client sends timestamps.
	value := func(col string) string {
		v := param(op.Value[col])
		ms, ok := v.(float64)
		if !ok {
			return q.arg(v)
		}
		switch types[col] {
		case "timestamptz":
			return "to_timestamp(" + q.arg(ms) + "::float8 / 1000)"
		case "timestamp":
			return "(to_timestamp(" + q.arg(ms) + "::float8 / 1000) AT TIME ZONE 'UTC')"
		case "date":
			return "(to_timestamp(" + q.arg(ms) + "::float8 / 1000) AT TIME ZONE 'UTC')::date"
		}
		return q.arg(v)
	}
	switch op.Op.Op {
	case "insert", "upsert":
		names := make([]string, len(cols))
		vals := make([]string, len(cols))
		for i, c := range cols {
			names[i] = ident(c)
			vals[i] = value(c)
		}
		pks := make([]string, len(op.PrimaryKey))
		for i, c := range op.PrimaryKey {
			pks[i] = ident(c)
		}
		q.b.WriteString("INSERT INTO " + table + " (" + join(names) + ") VALUES (" + join(vals) + ") ON CONFLICT (" + join(pks) + ")")
		if op.Op.Op == "insert" {
			q.b.WriteString(" DO NOTHING")
		} else {
			sets := make([]string, len(cols))
			for i, c := range cols {
				sets[i] = ident(c) + " = EXCLUDED." + ident(c)
			}
			q.b.WriteString(" DO UPDATE SET " + join(sets))
		}
	case "update":
		sets := make([]string, len(cols))
		for i, c := range cols {
			sets[i] = ident(c) + " = " + value(c)
		}
		q.b.WriteString("UPDATE " + table + " SET " + join(sets) + " WHERE ")
		q.pkWhere(op.pk, "")
	case "delete":
		q.b.WriteString("DELETE FROM " + table + " WHERE ")
		q.pkWhere(op.pk, "")
	}
	_, err = tx.Exec(ctx, q.b.String(), q.args...)
	return err
}

// columnTypes maps table's columns to their type names.
func columnTypes(ctx context.Context, tx pgx.Tx, table string) (map[string]string, error) {
	rows, err := tx.Query(ctx, `SELECT a.attname, t.typname FROM pg_catalog.pg_attribute a
		JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, qualified(table))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			rows.Close()
			return nil, err
		}
		out[name] = typ
	}
	return out, rows.Err()
}

// param passes a JSON value for Postgres to parse in the column's type:
// objects and arrays as their JSON text (json and jsonb columns).
func param(v any) any {
	switch v.(type) {
	case map[string]any, []any:
		b, _ := json.Marshal(v)
		return string(b)
	}
	return v
}

func (q *query) pkWhere(pk map[string]any, alias string) {
	for i, col := range sortedKeys(pk) {
		if i > 0 {
			q.b.WriteString(" AND ")
		}
		name := ident(col)
		if alias != "" {
			name = alias + "." + name
		}
		q.b.WriteString(name + " = " + q.arg(pk[col]))
	}
}

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}

// limiter is a sliding window of a client group's recent mutations.
type limiter struct{ times []time.Time }

func (m *Mutagen) allow(cgid string) bool {
	if m.cfg.LimitMax <= 0 {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.limiters[cgid]
	if l == nil {
		l = &limiter{}
		m.limiters[cgid] = l
	}
	now := time.Now()
	if len(m.limiters) > 1024 {
		// Groups come and go: forget those with nothing in their window.
		for id, o := range m.limiters {
			if n := len(o.times); n == 0 || now.Sub(o.times[n-1]) >= m.cfg.LimitWindow {
				delete(m.limiters, id)
			}
		}
	}
	cut := 0
	for cut < len(l.times) && now.Sub(l.times[cut]) >= m.cfg.LimitWindow {
		cut++
	}
	l.times = l.times[cut:]
	if len(l.times) >= m.cfg.LimitMax {
		return false
	}
	l.times = append(l.times, now)
	return true
}
