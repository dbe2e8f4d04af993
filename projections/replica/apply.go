package replica

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/jetsync/jetsync/streams"
)

// DefaultBackfillRows is how many rows one backfill INSERT carries: enough
// to amortise statement overhead, few enough that a wide table stays under
// SQLite's bind-variable limit.
const DefaultBackfillRows = 256

// maxVariables is SQLite's default SQLITE_MAX_VARIABLE_NUMBER.
const maxVariables = 32766

// ErrUnknownTable reports a change to a table the replica does not have.
var ErrUnknownTable = errors.New("unknown table")

// RowChange is one row's change, with values as the replica stores them
// (int64, float64, string or nil). Old is nil for an insert and New is nil
// for a delete. An update that changes the key is reported as a delete of
// the old key and an insert of the new one.
//
// New always holds _0_version. Old holds it when the old row was read from
// the replica; an update or delete whose change carried the whole old row
// (REPLICA IDENTITY FULL) reports that image, which has no version.
type RowChange struct {
	Table string
	Key   map[string]any
	Old   map[string]any
	New   map[string]any
}

// Collector is told what an Applier changed.
type Collector interface {
	// RowChanged reports a change to one row of a table with a primary
	// key (rows of tables without one cannot be synced).
	RowChanged(RowChange)
	// TableChanged reports that any row of table may have changed: a
	// truncate, a backfill or a schema change.
	TableChanged(table string)
}

// Applier applies parts to a replica, one SQLite transaction at a time. It
// caches table specs and prepared statements, so after a rollback the
// caller must call Discard, and commits through Commit, which keeps the
// statements for the next transactions. It is not safe for concurrent use.
type Applier struct {
	// Collector, when set, is told of every change. The old row of an
	// update or delete comes from the change where it carries the whole
	// row, and otherwise from a read of the replica before the write.
	Collector Collector
	// OldRowReads counts the rows read only to report their old image.
	OldRowReads int

	tables map[string]*table
	tx     *sql.Tx
	stmts  *stmtCache
	// Buffers of insertRun, kept between calls.
	batch []pendingInsert
	args  []any
}

// NewApplier returns an Applier with empty caches, for transactions of
// db. With db nil, statements are prepared again in each transaction.
func NewApplier(db *sql.DB) *Applier {
	return &Applier{tables: map[string]*table{}, stmts: newStmtCache(db, DefaultStmtCacheSize)}
}

// Discard drops the caches, which may describe what a rolled-back
// transaction created.
func (a *Applier) Discard() {
	a.stmts.invalidate()
	a.tables = map[string]*table{}
	a.tx = nil
}

// Commit commits tx. KeepStatements then keeps the statements it prepared
// for the transactions after it.
func (a *Applier) Commit(tx *sql.Tx) error {
	if err := tx.Commit(); err != nil {
		return err
	}
	a.stmts.commit(tx)
	if a.tx == tx {
		a.tx = nil
	}
	return nil
}

// KeepStatements keeps, for the transactions to come, the statements the
// last committed transaction prepared for itself. The caller calls it
// once the commit's news is out, since preparing takes a while after DDL
// or a new shape of multi-row insert; a transaction begun before it
// prepares them for itself again.
func (a *Applier) KeepStatements(ctx context.Context) { a.stmts.keep(ctx) }

// Exec runs query in tx as a prepared statement, kept as the Applier's
// own are: for the statements a caller runs in every transaction, such as
// savepoints and SaveProgress's.
func (a *Applier) Exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	a.use(tx)
	st, err := a.stmts.stmt(ctx, tx, query, true)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// Execer returns an Execer that runs tx's statements through Exec.
func (a *Applier) Execer(tx *sql.Tx) Execer { return applierExecer{a: a, tx: tx} }

type applierExecer struct {
	a  *Applier
	tx *sql.Tx
}

func (e applierExecer) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return e.a.Exec(ctx, e.tx, query, args...)
}

// KeptStatements is how many prepared statements the Applier keeps for
// its next transactions.
func (a *Applier) KeptStatements() int { return len(a.stmts.bySQL) }

// use binds the Applier to tx: statements bound to an earlier transaction
// died with it.
func (a *Applier) use(tx *sql.Tx) {
	if tx != a.tx {
		a.stmts.use(tx)
		a.tx = tx
	}
}

// stmt returns t's statement cached under key, whose SQL build makes.
func (a *Applier) stmt(ctx context.Context, t *table, key string, build func() string) (*sql.Stmt, error) {
	q, ok := t.sqls[key]
	if !ok {
		q = build()
		t.sqls[key] = q
	}
	s, err := a.stmts.stmt(ctx, a.tx, q, true)
	if err != nil {
		return nil, fmt.Errorf("prepare for %s: %w", t.name, err)
	}
	return s, nil
}

// schemaChanged drops the prepared statements before a change to the
// replica's schema: they are kept only against the schema they were
// prepared for.
func (a *Applier) schemaChanged() { a.stmts.invalidate() }

// isSchemaChange reports whether op changes the replica's schema.
func isSchemaChange(op streams.Op) bool {
	switch op {
	case streams.OpReset, streams.OpCreateTable, streams.OpCreateIndex, streams.OpDropTable,
		streams.OpRenameTable, streams.OpAddColumn, streams.OpUpdateColumn, streams.OpDropColumn, streams.OpDropIndex:
		return true
	}
	return false
}

// Apply applies p, which belongs to table (schema, name) or, for the tx
// subject, to none.
func (a *Applier) Apply(ctx context.Context, tx *sql.Tx, schema, name string, p *streams.Part) error {
	a.use(tx)
	for i := 0; i < len(p.Changes); {
		c := &p.Changes[i]
		if c.Op == streams.OpInsert {
			n, err := a.insertRun(ctx, tx, schema, name, p.Watermark, p.Changes[i:])
			if err != nil {
				return fmt.Errorf("apply %s part %d change %d (%s): %w", p.Watermark, p.Num, i+n, c.Op, err)
			}
			i += n
			continue
		}
		if err := a.apply(ctx, tx, schema, name, p, c); err != nil {
			return fmt.Errorf("apply %s part %d change %d (%s): %w", p.Watermark, p.Num, i, c.Op, err)
		}
		i++
	}
	return nil
}

func (a *Applier) apply(ctx context.Context, tx *sql.Tx, schema, name string, p *streams.Part, c *streams.Change) error {
	if isSchemaChange(c.Op) {
		a.schemaChanged()
	}
	switch c.Op {
	case streams.OpReset:
		return a.reset(ctx, tx, c.Reset, p.CommitTimeMs)
	case streams.OpCreateTable:
		return a.createTable(ctx, tx, c.Spec, p.Watermark)
	case streams.OpCreateIndex:
		return a.createIndex(ctx, tx, c.Index)
	case streams.OpDropTable:
		return a.dropTable(ctx, tx, schema, name)
	}
	t, err := a.table(ctx, tx, TableName(schema, name))
	if err != nil {
		return err
	}
	switch c.Op {
	case streams.OpRenameTable:
		return a.renameTable(ctx, tx, t, c.Spec, p.Watermark)
	case streams.OpAddColumn:
		return a.addColumn(ctx, tx, t, c, p.Watermark)
	case streams.OpUpdateColumn:
		return a.updateColumn(ctx, tx, t, c, p.Watermark)
	case streams.OpDropColumn:
		return a.dropColumn(ctx, tx, t, c, p.Watermark)
	case streams.OpDropIndex:
		return a.dropIndex(ctx, tx, t, c.Index)
	case streams.OpBackfill:
		return a.backfill(ctx, tx, t, c, p.Watermark)
	case streams.OpTruncate:
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+quoteIdent(t.name)); err != nil {
			return err
		}
		if a.Collector != nil {
			a.Collector.TableChanged(t.name)
		}
		return nil
	}
	if err := a.ensurePK(ctx, tx, t); err != nil {
		return err
	}
	switch c.Op {
	case streams.OpUpdate:
		return a.update(ctx, t, c, p.Watermark)
	case streams.OpDelete:
		return a.delete(ctx, t, c.Old)
	}
	return fmt.Errorf("%w: unknown op %q", streams.ErrMalformed, c.Op)
}

// Flush creates the primary-key indexes that backfills put off. Call it
// before committing.
func (a *Applier) Flush(ctx context.Context, tx *sql.Tx) error {
	a.use(tx)
	for _, t := range a.tables {
		if err := a.ensurePK(ctx, tx, t); err != nil {
			return err
		}
	}
	return nil
}

func (a *Applier) reset(ctx context.Context, tx *sql.Tx, r *streams.Reset, commitTimeMs float64) error {
	a.tables = map[string]*table{}
	if err := dropUserTables(ctx, tx); err != nil {
		return err
	}
	pubs := slices.Clone(r.Publications)
	sort.Strings(pubs)
	if pubs == nil {
		pubs = []string{}
	}
	pj, _ := json.Marshal(pubs)
	if _, err := tx.ExecContext(ctx,
		`INSERT OR REPLACE INTO "_zero.replicationConfig" (replicaVersion, publications, lock) VALUES (?, ?, 1)`,
		r.ReplicaVersion, string(pj)); err != nil {
		return fmt.Errorf("write replication config: %w", err)
	}
	if err := SaveProgress(ctx, tx, State{Watermark: r.ReplicaVersion, WriteTimeMs: int64(commitTimeMs)}); err != nil {
		return err
	}
	return nil
}

// column is a user column and how its values are stored.
type column struct {
	name   string
	quoted string
	// json columns store the value's JSON text, so that a JSON string
	// keeps its quotes, as zero-cache stores JSON.stringify(value).
	json   bool
	number bool
	aff    affinity
}

func (c *column) value(raw json.RawMessage) (any, error) {
	if len(raw) == 0 || raw[0] == 'n' {
		return nil, nil
	}
	if c.json {
		return string(raw), nil
	}
	if raw[0] == '"' {
		if c.number {
			// JSON has no NaN or infinities; the stream spells them as
			// strings. SQLite stores NaN as NULL.
			switch string(raw) {
			case `"NaN"`:
				return nil, nil
			case `"Infinity"`:
				return math.Inf(1), nil
			case `"-Infinity"`:
				return math.Inf(-1), nil
			}
		}
		if bytes.IndexByte(raw, '\\') < 0 {
			// Nothing to unescape: skip the reflection in json.Unmarshal.
			return string(raw[1 : len(raw)-1]), nil
		}
	}
	return streams.Value(raw)
}

// table is a cached user table.
type table struct {
	name    string
	spec    streams.TableSpec
	cols    []column
	byName  map[string]int
	pk      []int
	pkIndex string // "" while a backfill has put it off
	// sqls memoises the SQL of the table's statements, by a key of their
	// shape, so that finding a cached statement builds no SQL.
	sqls map[string]string
}

func newTable(spec streams.TableSpec, pkIndex string) (*table, error) {
	spec.Columns = slices.Clone(spec.Columns)
	sort.SliceStable(spec.Columns, func(i, j int) bool { return spec.Columns[i].Pos < spec.Columns[j].Pos })
	t := &table{
		name:    TableName(spec.Schema, spec.Name),
		spec:    spec,
		byName:  make(map[string]int, len(spec.Columns)),
		pkIndex: pkIndex,
		sqls:    map[string]string{},
	}
	for i, c := range spec.Columns {
		if c.Name == VersionColumn {
			return nil, fmt.Errorf("table %s: column %s is reserved", t.name, VersionColumn)
		}
		if _, dup := t.byName[c.Name]; dup {
			return nil, fmt.Errorf("table %s: duplicate column %s", t.name, c.Name)
		}
		t.byName[c.Name] = i
		t.cols = append(t.cols, column{
			name:   c.Name,
			quoted: quoteIdent(c.Name),
			json:   c.Kind == streams.KindJSON || c.Array,
			number: c.Kind == streams.KindNumber,
			aff:    affinityOf(declaredType(c)),
		})
	}
	for _, k := range spec.PrimaryKey {
		i, ok := t.byName[k]
		if !ok {
			return nil, fmt.Errorf("table %s: primary key column %s not in table", t.name, k)
		}
		t.pk = append(t.pk, i)
	}
	return t, nil
}

// table returns the cached table, loading it from TablesTable.
func (a *Applier) table(ctx context.Context, tx *sql.Tx, name string) (*table, error) {
	t, err := a.lookup(ctx, tx, name)
	if err == nil && t == nil {
		err = fmt.Errorf("%w %q", ErrUnknownTable, name)
	}
	return t, err
}

func (a *Applier) lookup(ctx context.Context, tx *sql.Tx, name string) (*table, error) {
	if t, ok := a.tables[name]; ok {
		return t, nil
	}
	var spec string
	var pk sql.NullString
	err := tx.QueryRowContext(ctx, `SELECT spec, pkIndex FROM "_jetsync.tables" WHERE name = ?`, name).Scan(&spec, &pk)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load table %s: %w", name, err)
	}
	var ts streams.TableSpec
	if err := json.Unmarshal([]byte(spec), &ts); err != nil {
		return nil, fmt.Errorf("load table %s: %w", name, err)
	}
	t, err := newTable(ts, pk.String)
	if err != nil {
		return nil, err
	}
	a.tables[name] = t
	return t, nil
}

func (a *Applier) createTable(ctx context.Context, tx *sql.Tx, spec *streams.TableSpec, version string) error {
	t, err := newTable(*spec, "")
	if err != nil {
		return err
	}
	old, err := a.lookup(ctx, tx, t.name)
	if err != nil {
		return err
	}
	if old != nil {
		if err := a.alterTable(ctx, tx, old, t, version); err != nil {
			return err
		}
	} else {
		var b strings.Builder
		b.WriteString("CREATE TABLE " + quoteIdent(t.name) + " (")
		for i, c := range t.spec.Columns {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(columnDef(c))
		}
		b.WriteString(", " + quoteIdent(VersionColumn) + " TEXT)")
		if _, err := tx.ExecContext(ctx, b.String()); err != nil {
			return fmt.Errorf("create table %s: %w", t.name, err)
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT OR REPLACE INTO "_zero.tableMetadata" ("schema", "table", minRowVersion) VALUES (?, ?, '00')`,
			schemaName(spec.Schema), spec.Name); err != nil {
			return fmt.Errorf("create table %s: metadata: %w", t.name, err)
		}
	}
	if err := a.saveTable(ctx, tx, t); err != nil {
		return err
	}
	a.tables[t.name] = t
	if a.Collector != nil {
		a.Collector.TableChanged(t.name)
	}
	return nil
}

func schemaName(s string) string {
	if s == "" {
		return "public"
	}
	return s
}

func columnDef(c streams.ColumnSpec) string {
	def := quoteIdent(c.Name) + " " + quoteIdent(LiteType(c))
	if c.CharacterMaximumLength > 0 {
		def += fmt.Sprintf("(%d)", c.CharacterMaximumLength)
	}
	return def
}

// alterTable brings table old to t's spec, for a create-table of a table
// the replica has (DDL). Columns are added and dropped in place; every row's
// version is raised to version, so that clients get the new shape.
func (a *Applier) alterTable(ctx context.Context, tx *sql.Tx, old, t *table, version string) error {
	for _, c := range old.spec.Columns {
		if _, ok := t.byName[c.Name]; ok {
			continue
		}
		// SQLite refuses to drop an indexed column.
		dropped, err := dropIndexesOn(ctx, tx, old.name, c.Name)
		if err != nil {
			return err
		}
		if slices.Contains(dropped, old.pkIndex) {
			old.pkIndex = ""
		}
		if _, err := tx.ExecContext(ctx, "ALTER TABLE "+quoteIdent(old.name)+" DROP COLUMN "+quoteIdent(c.Name)); err != nil {
			return fmt.Errorf("alter table %s: drop %s: %w", old.name, c.Name, err)
		}
	}
	for _, c := range t.spec.Columns {
		if _, ok := old.byName[c.Name]; ok {
			continue
		}
		if _, err := tx.ExecContext(ctx, "ALTER TABLE "+quoteIdent(old.name)+" ADD COLUMN "+columnDef(c)); err != nil {
			return fmt.Errorf("alter table %s: add %s: %w", old.name, c.Name, err)
		}
	}
	if slices.Equal(old.spec.PrimaryKey, t.spec.PrimaryKey) {
		t.pkIndex = old.pkIndex
	} else if old.pkIndex != "" {
		if _, err := tx.ExecContext(ctx, "DROP INDEX IF EXISTS "+quoteIdent(old.pkIndex)); err != nil {
			return fmt.Errorf("alter table %s: drop primary key index: %w", old.name, err)
		}
	}
	return bumpVersions(ctx, tx, &t.spec, version)
}

// bumpVersions raises the version of every row of the table to version, so
// that clients are sent them again (docs/replica.md §5).
func bumpVersions(ctx context.Context, tx *sql.Tx, spec *streams.TableSpec, version string) error {
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO "_zero.tableMetadata" ("schema", "table", minRowVersion) VALUES (?, ?, ?)
		 ON CONFLICT ("schema", "table") DO UPDATE SET minRowVersion = excluded.minRowVersion`,
		schemaName(spec.Schema), spec.Name, version); err != nil {
		return fmt.Errorf("table %s: metadata: %w", TableName(spec.Schema, spec.Name), err)
	}
	return nil
}

// dropIndexesOn drops the indexes that use column col, which SQLite would
// not let go of it, and returns their names.
func dropIndexesOn(ctx context.Context, tx *sql.Tx, tableName, col string) ([]string, error) {
	rows, err := tx.QueryContext(ctx,
		`SELECT DISTINCT il.name FROM pragma_index_list(?) AS il, pragma_index_info(il.name) AS ii WHERE ii.name = ?`,
		tableName, col)
	if err != nil {
		return nil, fmt.Errorf("list indexes of %s: %w", tableName, err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list indexes of %s: %w", tableName, err)
	}
	for _, n := range names {
		if _, err := tx.ExecContext(ctx, "DROP INDEX IF EXISTS "+quoteIdent(n)); err != nil {
			return nil, fmt.Errorf("drop index %s: %w", n, err)
		}
	}
	return names, nil
}

// saveTable records t's spec and column metadata.
func (a *Applier) saveTable(ctx context.Context, tx *sql.Tx, t *table) error {
	spec, err := json.Marshal(t.spec)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO "_jetsync.tables" (name, spec, pkIndex) VALUES (?, ?, ?)`,
		t.name, string(spec), nullString(t.pkIndex)); err != nil {
		return fmt.Errorf("save table %s: %w", t.name, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM "_zero.column_metadata" WHERE table_name = ?`, t.name); err != nil {
		return fmt.Errorf("save table %s: column metadata: %w", t.name, err)
	}
	for _, c := range t.spec.Columns {
		var maxLen any
		if c.CharacterMaximumLength > 0 {
			maxLen = c.CharacterMaximumLength
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO "_zero.column_metadata" (table_name, column_name, upstream_type, is_not_null, is_enum, is_array, character_max_length)
			 VALUES (?, ?, ?, ?, ?, ?, ?)`,
			t.name, c.Name, c.DataType, c.NotNull, c.Enum, c.Array, maxLen); err != nil {
			return fmt.Errorf("save table %s: column metadata: %w", t.name, err)
		}
	}
	return nil
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// ensurePK creates t's primary-key index if a backfill put it off. Loading
// rows before indexing them is what makes an initial sync fast.
func (a *Applier) ensurePK(ctx context.Context, tx *sql.Tx, t *table) error {
	if t.pkIndex != "" || len(t.pk) == 0 {
		return nil
	}
	name := t.name + "_pkey"
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?`, name).Scan(&n); err != nil {
		return fmt.Errorf("primary key index of %s: %w", t.name, err)
	}
	if n > 0 {
		name = t.name + "_jetsync_pkey"
	}
	return a.createPK(ctx, tx, t, name)
}

func (a *Applier) createPK(ctx context.Context, tx *sql.Tx, t *table, name string) error {
	a.schemaChanged()
	cols := make([]string, len(t.pk))
	for i, c := range t.pk {
		cols[i] = t.cols[c].quoted
	}
	if _, err := tx.ExecContext(ctx, "CREATE UNIQUE INDEX IF NOT EXISTS "+quoteIdent(name)+" ON "+quoteIdent(t.name)+" ("+strings.Join(cols, ", ")+")"); err != nil {
		return fmt.Errorf("create primary key index of %s: %w", t.name, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE "_jetsync.tables" SET pkIndex = ? WHERE name = ?`, name, t.name); err != nil {
		return fmt.Errorf("create primary key index of %s: %w", t.name, err)
	}
	t.pkIndex = name
	return nil
}

func (a *Applier) createIndex(ctx context.Context, tx *sql.Tx, idx *streams.IndexSpec) error {
	t, err := a.table(ctx, tx, TableName(idx.Schema, idx.TableName))
	if err != nil {
		return err
	}
	name := TableName(idx.Schema, idx.Name)
	if idx.Unique && len(t.pk) > 0 && sameSet(idx.Columns, t.spec.PrimaryKey) {
		if t.pkIndex != "" {
			// The primary-key index exists; a second identical one would
			// only slow writes.
			return nil
		}
		return a.createPK(ctx, tx, t, name)
	}
	cols := make([]string, len(idx.Columns))
	for i, c := range idx.Columns {
		if _, ok := t.byName[c]; !ok {
			return fmt.Errorf("index %s: column %s not in table %s", name, c, t.name)
		}
		dir := " ASC"
		if i < len(idx.Desc) && idx.Desc[i] {
			dir = " DESC"
		}
		cols[i] = quoteIdent(c) + dir
	}
	if name == t.pkIndex {
		t.pkIndex = ""
	}
	if _, err := tx.ExecContext(ctx, "DROP INDEX IF EXISTS "+quoteIdent(name)); err != nil {
		return fmt.Errorf("create index %s: %w", name, err)
	}
	unique := ""
	if idx.Unique {
		unique = "UNIQUE "
	}
	if _, err := tx.ExecContext(ctx, "CREATE "+unique+"INDEX "+quoteIdent(name)+" ON "+quoteIdent(t.name)+" ("+strings.Join(cols, ", ")+")"); err != nil {
		return fmt.Errorf("create index %s: %w", name, err)
	}
	return nil
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// backfill writes whole rows at version: the replica version in an initial
// sync, the schema change's transaction after one.
func (a *Applier) backfill(ctx context.Context, tx *sql.Tx, t *table, c *streams.Change, version string) error {
	if len(c.Rows) == 0 {
		return nil
	}
	cols := make([]*column, len(c.Columns))
	names := make([]string, len(c.Columns)+1)
	for i, n := range c.Columns {
		j, ok := t.byName[n]
		if !ok {
			return fmt.Errorf("backfill: column %s not in table %s", n, t.name)
		}
		cols[i] = &t.cols[j]
		names[i] = cols[i].quoted
	}
	names[len(c.Columns)] = quoteIdent(VersionColumn)
	width := len(c.Columns)
	per := min(DefaultBackfillRows, maxVariables/max(width, 1))
	head := "INSERT OR REPLACE INTO " + quoteIdent(t.name) + " (" + strings.Join(names, ", ") + ") VALUES "
	// Every row has the same version: a literal spares a bind per row.
	tuple := "(" + strings.Repeat("?, ", width) + sqlLiteral(version) + ")"
	args := make([]any, 0, per*width)
	var st *sql.Stmt
	for rows := c.Rows; len(rows) > 0; {
		n := min(per, len(rows))
		if st == nil || n < per {
			// The version literal changes with the transaction: not worth
			// keeping past it.
			var err error
			if st, err = a.stmts.stmt(ctx, tx, head+strings.Repeat(tuple+", ", n-1)+tuple, false); err != nil {
				return fmt.Errorf("prepare for %s: %w", t.name, err)
			}
		}
		args = args[:0]
		for _, r := range rows[:n] {
			for i, raw := range r {
				v, err := cols[i].value(raw)
				if err != nil {
					return fmt.Errorf("backfill %s.%s: %w", t.name, cols[i].name, err)
				}
				args = append(args, v)
			}
		}
		if _, err := st.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("backfill %s: %w", t.name, err)
		}
		rows = rows[n:]
	}
	if a.Collector != nil {
		a.Collector.TableChanged(t.name)
	}
	return nil
}

// rowValues converts row into one value per column, nil where absent. It
// reports which columns were present.
func (t *table) rowValues(row streams.Row) ([]any, []bool, error) {
	vals := make([]any, len(t.cols))
	present := make([]bool, len(t.cols))
	for name, raw := range row {
		i, ok := t.byName[name]
		if !ok {
			return nil, nil, fmt.Errorf("column %s not in table %s", name, t.name)
		}
		v, err := t.cols[i].value(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("%s.%s: %w", t.name, name, err)
		}
		vals[i], present[i] = v, true
	}
	return vals, present, nil
}

// keyOf picks the key columns of row: the primary key, or for a table
// without one every column given (REPLICA IDENTITY FULL).
func (t *table) keyOf(vals []any, present []bool) ([]int, []any, error) {
	cols := t.pk
	if len(cols) == 0 {
		for i, p := range present {
			if p {
				cols = append(cols, i)
			}
		}
	}
	kv := make([]any, len(cols))
	for j, i := range cols {
		if !present[i] {
			return nil, nil, fmt.Errorf("key column %s missing", t.cols[i].name)
		}
		kv[j] = vals[i]
	}
	return cols, kv, nil
}

func (t *table) keyMap(cols []int, kv []any) map[string]any {
	m := make(map[string]any, len(cols))
	for j, i := range cols {
		m[t.cols[i].name] = kv[j]
	}
	return m
}

func maskKey(op string, mask []bool) string {
	b := make([]byte, 0, len(op)+len(mask))
	b = append(b, op...)
	for _, p := range mask {
		if p {
			b = append(b, '1')
		} else {
			b = append(b, '0')
		}
	}
	return string(b)
}

func colsMask(n int, cols []int) []bool {
	m := make([]bool, n)
	for _, i := range cols {
		m[i] = true
	}
	return m
}

func (t *table) allColumns() string {
	s := make([]string, 0, len(t.cols)+1)
	for _, c := range t.cols {
		s = append(s, c.quoted)
	}
	return strings.Join(append(s, quoteIdent(VersionColumn)), ", ")
}

func (t *table) where(cols []int) string {
	s := make([]string, len(cols))
	for j, i := range cols {
		// IS matches NULLs in a full-row identity and still uses indexes.
		s[j] = t.cols[i].quoted + " IS ?"
	}
	return " WHERE " + strings.Join(s, " AND ")
}

// scan reads one row of allColumns into a map.
func (t *table) scan(r *sql.Row) (map[string]any, error) {
	vals := make([]any, len(t.cols)+1)
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := r.Scan(ptrs...); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		return nil, err
	}
	m := make(map[string]any, len(vals))
	for i, c := range t.cols {
		m[c.name] = vals[i]
	}
	m[VersionColumn] = vals[len(t.cols)]
	return m, nil
}

func (a *Applier) selectRow(ctx context.Context, t *table, cols []int, kv []any) (map[string]any, error) {
	st, err := a.stmt(ctx, t, maskKey("s", colsMask(len(t.cols), cols)), func() string {
		return "SELECT " + t.allColumns() + " FROM " + quoteIdent(t.name) + t.where(cols)
	})
	if err != nil {
		return nil, err
	}
	a.OldRowReads++
	m, err := t.scan(st.QueryRowContext(ctx, kv...))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", t.name, err)
	}
	return m, nil
}

func (a *Applier) collecting(t *table) bool { return a.Collector != nil && len(t.pk) > 0 }

// upsert writes a whole row, replacing any row with its key, and reports
// the change.
func (a *Applier) upsert(ctx context.Context, t *table, vals []any, present []bool, version string) (map[string]any, error) {
	collect := a.collecting(t)
	op := "i"
	if collect {
		op = "ir"
	}
	st, err := a.stmt(ctx, t, op, func() string {
		q := "INSERT OR REPLACE INTO " + quoteIdent(t.name) + " (" + t.allColumns() + ") VALUES (" +
			strings.Repeat("?, ", len(t.cols)) + "?)"
		if collect {
			q += " RETURNING " + t.allColumns()
		}
		return q
	})
	if err != nil {
		return nil, err
	}
	args := append(vals, version)
	if !collect {
		if _, err := st.ExecContext(ctx, args...); err != nil {
			return nil, fmt.Errorf("insert into %s: %w", t.name, err)
		}
		return nil, nil
	}
	cols, kv, err := t.keyOf(vals, present)
	if err != nil {
		return nil, err
	}
	// Most inserts replace nothing: a plain insert that succeeds shows
	// there was no old row, without reading for it.
	fresh, err := a.stmt(ctx, t, "in", func() string {
		return "INSERT INTO " + quoteIdent(t.name) + " (" + t.allColumns() + ") VALUES (" +
			strings.Repeat("?, ", len(t.cols)) + "?) ON CONFLICT DO NOTHING RETURNING " + t.allColumns()
	})
	if err != nil {
		return nil, err
	}
	row, err := t.scan(fresh.QueryRowContext(ctx, args...))
	if err != nil {
		return nil, fmt.Errorf("insert into %s: %w", t.name, err)
	}
	if row != nil {
		a.Collector.RowChanged(RowChange{Table: t.name, Key: t.keyMap(cols, kv), New: row})
		return row, nil
	}
	return a.replaceRow(ctx, t, cols, kv, args, t.keyMap(cols, kv))
}

// replaceRow writes a whole row (args: every column, then the version)
// over the row with key kv, and reports the change, with the row replaced
// read first. It needs a collector.
func (a *Applier) replaceRow(ctx context.Context, t *table, cols []int, kv, args []any, key map[string]any) (map[string]any, error) {
	old, err := a.selectRow(ctx, t, cols, kv)
	if err != nil {
		return nil, err
	}
	st, err := a.stmt(ctx, t, "ir", func() string {
		return "INSERT OR REPLACE INTO " + quoteIdent(t.name) + " (" + t.allColumns() + ") VALUES (" +
			strings.Repeat("?, ", len(t.cols)) + "?) RETURNING " + t.allColumns()
	})
	if err != nil {
		return nil, err
	}
	row, err := t.scan(st.QueryRowContext(ctx, args...))
	if err != nil {
		return nil, fmt.Errorf("insert into %s: %w", t.name, err)
	}
	a.Collector.RowChanged(RowChange{Table: t.name, Key: key, Old: old, New: row})
	return row, nil
}

func (a *Applier) update(ctx context.Context, t *table, c *streams.Change, version string) error {
	vals, present, err := t.rowValues(c.New)
	if err != nil {
		return err
	}
	var (
		keyCols []int
		oldKey  []any
		image   map[string]any // the old row, when the change carries it whole
	)
	switch {
	case c.Old != nil:
		ov, op, err := t.rowValues(c.Old)
		if err != nil {
			return err
		}
		if keyCols, oldKey, err = t.keyOf(ov, op); err != nil {
			return err
		}
		if a.collecting(t) {
			image = t.storedImage(ov, op)
		}
	case len(t.pk) > 0:
		if keyCols, oldKey, err = t.keyOf(vals, present); err != nil {
			return err
		}
	default:
		// Without a key or an old row there is nothing to find.
		_, err := a.upsert(ctx, t, vals, present, version)
		return err
	}
	collect := a.collecting(t)
	var newKey []any
	keyChanged := false
	if collect {
		if _, newKey, err = t.keyOf(vals, present); err != nil {
			return err
		}
		keyChanged = !slices.Equal(oldKey, newKey)
	}
	old, displaced := image, map[string]any(nil)
	if collect {
		if old == nil {
			if old, err = a.selectRow(ctx, t, keyCols, oldKey); err != nil {
				return err
			}
		}
		if keyChanged {
			if displaced, err = a.selectRow(ctx, t, t.pk, newKey); err != nil {
				return err
			}
		}
	}
	// With every column given and its stored form certain, the new row is
	// known without RETURNING, which costs more than the write.
	var known map[string]any
	if collect {
		if known = t.storedImage(vals, present); known != nil {
			known[VersionColumn] = version
		}
	}
	returning := collect && known == nil
	op := "u"
	if returning {
		op = "ur"
	}
	k := maskKey(op, present) + "/" + maskKey("", colsMask(len(t.cols), keyCols))
	st, err := a.stmt(ctx, t, k, func() string {
		var b strings.Builder
		b.WriteString("UPDATE OR REPLACE " + quoteIdent(t.name) + " SET ")
		for i, p := range present {
			if p {
				b.WriteString(t.cols[i].quoted + " = ?, ")
			}
		}
		b.WriteString(quoteIdent(VersionColumn) + " = ?" + t.where(keyCols))
		if returning {
			b.WriteString(" RETURNING " + t.allColumns())
		}
		return b.String()
	})
	if err != nil {
		return err
	}
	args := make([]any, 0, len(vals)+1+len(oldKey))
	for i, p := range present {
		if p {
			args = append(args, vals[i])
		}
	}
	args = append(args, version)
	args = append(args, oldKey...)
	var row map[string]any
	if returning {
		if row, err = t.scan(st.QueryRowContext(ctx, args...)); err != nil {
			return fmt.Errorf("update %s: %w", t.name, err)
		}
	} else {
		res, err := st.ExecContext(ctx, args...)
		if err != nil {
			return fmt.Errorf("update %s: %w", t.name, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("update %s: %w", t.name, err)
		}
		if n > 0 {
			if !collect {
				return nil
			}
			row = known
		}
	}
	if row == nil {
		// No row had the key, as when a table joins a publication:
		// upstream has the row, so write what we have of it.
		_, err := a.upsert(ctx, t, vals, present, version)
		return err
	}
	if !keyChanged {
		a.Collector.RowChanged(RowChange{Table: t.name, Key: t.keyMap(t.pk, newKey), Old: old, New: row})
		return nil
	}
	a.Collector.RowChanged(RowChange{Table: t.name, Key: t.keyMap(keyCols, oldKey), Old: old})
	a.Collector.RowChanged(RowChange{Table: t.name, Key: t.keyMap(t.pk, newKey), Old: displaced, New: row})
	return nil
}

func (a *Applier) delete(ctx context.Context, t *table, oldRow streams.Row) error {
	vals, present, err := t.rowValues(oldRow)
	if err != nil {
		return err
	}
	cols, kv, err := t.keyOf(vals, present)
	if err != nil {
		return err
	}
	var old map[string]any
	image := false
	if a.collecting(t) {
		// A whole old row (REPLICA IDENTITY FULL) spares the read. (DELETE
		// ... RETURNING would too, under any identity, but measured slower
		// than a read and a plain delete.)
		old = t.storedImage(vals, present)
		image = old != nil
		if !image {
			if old, err = a.selectRow(ctx, t, cols, kv); err != nil {
				return err
			}
		}
	}
	st, err := a.stmt(ctx, t, maskKey("d", colsMask(len(t.cols), cols)), func() string {
		return "DELETE FROM " + quoteIdent(t.name) + t.where(cols)
	})
	if err != nil {
		return err
	}
	res, err := st.ExecContext(ctx, kv...)
	if err != nil {
		return fmt.Errorf("delete from %s: %w", t.name, err)
	}
	if old == nil {
		return nil
	}
	if image {
		// The image says nothing of whether the replica had the row.
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("delete from %s: %w", t.name, err)
		} else if n == 0 {
			return nil
		}
	}
	a.Collector.RowChanged(RowChange{Table: t.name, Key: t.keyMap(cols, kv), Old: old})
	return nil
}
