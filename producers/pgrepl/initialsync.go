package pgrepl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/internal/progress"
	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

// reset replaces the slot and publishes a new initial sync: one stream
// transaction at watermark replicaVersion = Lexi(the new slot's consistent
// point - 1). It returns where streaming continues.
func (s *Source) reset(ctx context.Context, conn *pgx.Conn, replConn *pgconn.PgConn, stream jetstream.Stream,
	kv jetstream.KeyValue, pub *publisher, up upstream, rec *streams.Upstream, tl tail, reason string,
) (position, error) {
	var pos position
	if rec != nil && !rec.Complete && rec.ResetSeq > 0 && rec.ResetSeq <= tl.lastSeq {
		// No consumer starting later may see half an initial sync.
		if err := deleteRange(ctx, stream, rec.ResetSeq, tl.lastSeq); err != nil {
			return pos, err
		}
		s.log.Info("deleted an incomplete initial sync", "from", rec.ResetSeq, "to", tl.lastSeq)
	}

	slot, res, err := s.createSlot(ctx, conn, replConn)
	if err != nil {
		return pos, err
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return pos, fmt.Errorf("slot %s: consistent point: %w", slot, err)
	}
	// A transaction in flight when the slot became consistent is in neither
	// the snapshot nor the history before it, and its commit record may
	// start exactly at the consistent point: the replica version sits one
	// below, so that such a transaction orders after the initial sync.
	rv := streams.Lexi(uint64(lsn) - 1)
	log := s.log.With(logkey.Slot, slot, logkey.ReplicaVersion, rv)
	log.Info("initial sync started")
	started := time.Now()

	_, err = conn.Exec(ctx, fmt.Sprintf(`
		WITH del AS (DELETE FROM %[1]s.replicas WHERE id <> $1)
		INSERT INTO %[1]s.replicas (id, slot, version) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET slot = excluded.slot, version = excluded.version`, ident(s.names.shard)),
		slot+":"+rv, slot, rv)
	if err != nil {
		return pos, fmt.Errorf("record replica: %w", err)
	}

	// The record goes first, so that a crash from here on finds the
	// incomplete sync and where it starts in the stream.
	u := &streams.Upstream{
		SystemID: up.systemID, Database: up.database, Slot: slot, ReplicaVersion: rv,
		Publications: up.publications, ResetSeq: pub.next,
	}
	if err := writeUpstream(ctx, kv, u); err != nil {
		return pos, err
	}
	pub.replicaVersion = rv
	err = pub.publish(&outMsg{subject: s.cfg.Shard.TxSubject(), msg: streams.Message{Parts: []streams.Part{{
		Watermark: rv, Num: 0,
		Changes: []streams.Change{{Op: streams.OpReset, Reset: &streams.Reset{
			ReplicaVersion: rv, Publications: up.publications, SystemID: up.systemID, Slot: slot, Reason: reason,
		}}},
	}}}})
	if err != nil {
		return pos, err
	}
	n, rows, err := s.copyTables(ctx, conn, res.SnapshotName, up.publications, rv, pub)
	if err != nil {
		return pos, err
	}
	err = pub.publish(&outMsg{subject: s.cfg.Shard.TxSubject(), msg: streams.Message{Parts: []streams.Part{{
		Watermark: rv, Num: n, Last: true, Changes: []streams.Change{},
	}}}})
	if err != nil {
		return pos, err
	}
	if err := pub.wait(ctx); err != nil {
		return pos, err
	}
	u.Complete = true
	if err := writeUpstream(ctx, kv, u); err != nil {
		return pos, err
	}
	log.Info("initial sync done", "rows", rows, "messages", pub.next-u.ResetSeq, "took", time.Since(started).Round(time.Millisecond))
	// History before the reset describes another replica version, perhaps
	// another upstream whose LSNs don't even order after ours: no consumer
	// can use it (each rebuilds from the reset), so it goes.
	if u.ResetSeq > 1 {
		if err := stream.Purge(ctx, jetstream.WithPurgeSequence(u.ResetSeq)); err != nil {
			return pos, fmt.Errorf("purge history before the reset at seq %d: %w", u.ResetSeq, err)
		}
		log.Info("purged history before the reset", logkey.Seq, u.ResetSeq)
	}
	return position{
		slot: slot, replicaVersion: rv, startLSN: lsn, prev: rv, resumeWM: rv, resumePart: allParts,
	}, nil
}

func deleteRange(ctx context.Context, stream jetstream.Stream, from, to uint64) error {
	for seq := from; seq <= to; seq++ {
		if err := stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("delete seq %d: %w", seq, err)
		}
	}
	return nil
}

// createSlot drops this shard's slots in this database and creates the
// lowest free <app>_<shard>_<suffix>, exporting its snapshot. The snapshot
// lasts while replConn stays idle.
func (s *Source) createSlot(ctx context.Context, conn *pgx.Conn, replConn *pgconn.PgConn) (string, pglogrepl.CreateReplicationSlotResult, error) {
	var res pglogrepl.CreateReplicationSlotResult
	lockKey := "replication-slot-management:" + s.names.shard
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, lockKey); err != nil {
		return "", res, fmt.Errorf("lock slots: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtext($1))`, lockKey)

	ours := regexp.MustCompile(`^` + regexp.QuoteMeta(s.names.slotPrefix()) + `[a-z]+$`)
	rows, err := conn.Query(ctx, `SELECT slot_name::text, database IS NOT DISTINCT FROM current_database() FROM pg_replication_slots`)
	if err != nil {
		return "", res, fmt.Errorf("list slots: %w", err)
	}
	taken := map[string]bool{}
	var drop []string
	for rows.Next() {
		var name string
		var here bool
		if err := rows.Scan(&name, &here); err != nil {
			return "", res, fmt.Errorf("list slots: %w", err)
		}
		taken[name] = true
		if here && ours.MatchString(name) {
			drop = append(drop, name)
		}
	}
	if err := rows.Err(); err != nil {
		return "", res, fmt.Errorf("list slots: %w", err)
	}
	for _, name := range drop {
		if err := dropSlot(ctx, conn, name); err != nil {
			return "", res, err
		}
		s.log.Info("dropped replication slot", logkey.Slot, name)
		delete(taken, name)
	}
	var slot string
	for i := 0; ; i++ {
		slot = s.names.slotPrefix() + slotSuffix(i)
		if !taken[slot] {
			break
		}
	}
	res, err = pglogrepl.CreateReplicationSlot(ctx, replConn, slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	if err != nil {
		return "", res, fmt.Errorf("create slot %s: %w", slot, err)
	}
	return slot, res, nil
}

// slotSuffix is a, b, ..., z, aa, ab, ...
func slotSuffix(i int) string {
	var b []byte
	for i++; i > 0; i = (i - 1) / 26 {
		b = append([]byte{byte('a' + (i-1)%26)}, b...)
	}
	return string(b)
}

// dropSlot drops a slot, ending the session that holds it, if any (a
// previous session of ours that has not noticed it is over).
func dropSlot(ctx context.Context, conn *pgx.Conn, name string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
			WHERE slot_name = $1 AND active_pid IS NOT NULL`, name)
		if err != nil {
			return fmt.Errorf("drop slot %s: %w", name, err)
		}
		_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" || time.Now().After(deadline) { // object_in_use
			return fmt.Errorf("drop slot %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// copyTables publishes the published tables as of the snapshot, as parts
// 1..n-1 of the initial sync at watermark rv. It returns n and the rows
// copied. conn, outside the snapshot, reads Postgres's size estimates.
func (s *Source) copyTables(ctx context.Context, conn *pgx.Conn, snapshot string, pubs []string, rv string, pub *publisher) (int, int, error) {
	first, err := snapshotConn(ctx, s.cfg.UpstreamURL, snapshot)
	if err != nil {
		return 0, 0, err
	}
	conns := []*pgx.Conn{first}
	defer func() {
		for _, c := range conns {
			c.Close(context.WithoutCancel(ctx))
		}
	}()
	tables, err := readSchema(ctx, first, s.reg, pubs)
	if err != nil {
		return 0, 0, err
	}
	s.m.initialSync.Forget() // a new initial sync replaces every table
	prog := progress.NewCopy(s.log, s.m.initialSync, "initial sync", s.cfg.ProgressEvery)
	est := readEstimates(ctx, conn, s.log, tables...)
	for _, t := range tables {
		e := est[t.oid]
		t.progress = prog.Add(t.spec.Schema+"."+t.spec.Name, e.rows, e.bytes)
	}
	prog.Start()
	defer prog.End()
	for len(conns) < min(s.cfg.CopyWorkers, len(tables)) {
		c, err := snapshotConn(ctx, s.cfg.UpstreamURL, snapshot)
		if err != nil {
			return 0, 0, err
		}
		conns = append(conns, c)
	}

	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(gctx)
	todo := make(chan *publishedTable, len(tables))
	for _, t := range tables {
		todo <- t
	}
	close(todo)
	// A worker hands over a change's fragments at once, so that no other
	// table's message falls between them.
	out := make(chan []*outMsg, 2*len(conns))
	rowCounts := make([]int, len(conns))
	for i, c := range conns {
		g.Go(func() error {
			for t := range todo {
				n, err := s.copyTable(gctx, c, t, out)
				if err != nil {
					return err
				}
				rowCounts[i] += n
			}
			return nil
		})
	}
	done := make(chan error, 1)
	go func() {
		done <- g.Wait()
		close(out)
	}()

	num := 1
	var pubErr error
	for ms := range out {
		for _, m := range ms {
			if pubErr != nil {
				break // drain, so the workers can exit
			}
			p := &m.msg.Parts[0]
			p.Watermark, p.Num = rv, num
			num++
			if pubErr = pub.publish(m); pubErr == nil {
				pubErr = pub.poll()
			}
			if pubErr != nil {
				cancel()
			}
		}
	}
	if err := <-done; err != nil && pubErr == nil {
		return 0, 0, err
	}
	if pubErr != nil {
		return 0, 0, pubErr
	}
	rows := 0
	for _, n := range rowCounts {
		rows += n
	}
	return num, rows, nil
}

func snapshotConn(ctx context.Context, url, snapshot string) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect upstream: %w", err)
	}
	_, err = c.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT "+literal(snapshot)+
		"; SET LOCAL jit = off") // catalog queries get JIT-compiled for nothing
	if err != nil {
		c.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("import snapshot %s: %w", snapshot, err)
	}
	return c, nil
}

// copyTable sends t's create-table, backfill and create-index messages, and
// returns the rows copied.
func (s *Source) copyTable(ctx context.Context, conn *pgx.Conn, t *publishedTable, out chan<- []*outMsg) (int, error) {
	ref := &tableRef{Schema: t.spec.Schema, Name: t.spec.Name, subject: s.cfg.Shard.TableSubject(t.spec.Schema, t.spec.Name)}
	msg := func(changes ...streams.Change) *outMsg {
		return &outMsg{subject: ref.subject, msg: streams.Message{
			Schema: ref.Schema, Table: ref.Name, Parts: []streams.Part{{Changes: changes}},
		}}
	}
	sendAll := func(ms ...*outMsg) error {
		select {
		case out <- ms:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	send := func(changes ...streams.Change) error { return sendAll(msg(changes...)) }
	spec := t.spec
	if err := send(streams.Change{Op: streams.OpCreateTable, Spec: &spec}); err != nil {
		return 0, err
	}
	cols := make([]string, len(t.spec.Columns))
	colSize := 0
	for i, c := range t.spec.Columns {
		cols[i] = c.Name
		colSize += jsonStringSize(c.Name) + 1
	}
	limit := msgLimit - partOverhead - changeOverhead - colSize
	t.progress.Begin()
	w := &backfillWriter{
		table: t, cols: cols, limit: limit, progress: t.progress,
		flush: func(rows [][]json.RawMessage) error {
			c := streams.Change{Op: streams.OpBackfill, Columns: cols, Rows: rows}
			if len(rows) > 1 || backfillRowSize(rows[0]) <= limit {
				return send(c)
			}
			// One row too big for a message: its fragments, one a message.
			frags, err := streams.Fragment(&c, fragmentBytes)
			if err != nil {
				return fmt.Errorf("fragment a row of %s.%s: %w", t.spec.Schema, t.spec.Name, err)
			}
			if len(frags) == 1 {
				return send(c)
			}
			ms := make([]*outMsg, len(frags))
			for i := range frags {
				ms[i] = msg(frags[i])
			}
			return sendAll(ms...)
		},
	}
	if _, err := conn.PgConn().CopyTo(ctx, w, t.copyQuery()); err != nil {
		if w.err != nil {
			err = w.err
		}
		return 0, fmt.Errorf("copy %s.%s: %w", t.spec.Schema, t.spec.Name, err)
	}
	if err := w.close(); err != nil {
		return 0, err
	}
	if len(t.indexes) > 0 {
		changes := make([]streams.Change, len(t.indexes))
		for i := range t.indexes {
			changes[i] = streams.Change{Op: streams.OpCreateIndex, Index: &t.indexes[i]}
		}
		if err := send(changes...); err != nil {
			return 0, err
		}
	}
	t.progress.Done("table copied")
	return w.total, nil
}

// backfillWriter receives COPY text output and cuts it into backfill
// changes.
type backfillWriter struct {
	table *publishedTable
	cols  []string
	limit int
	flush func([][]json.RawMessage) error
	// progress, if set, counts the rows and bytes read.
	progress *progress.Table

	partial []byte // an incomplete line carried to the next Write
	fields  [][]byte
	buf     []byte
	arena   arena
	rows    [][]json.RawMessage
	size    int
	total   int
	err     error
}

func (w *backfillWriter) Write(p []byte) (int, error) {
	n := len(p)
	if w.progress != nil {
		defer func(rows int) { w.progress.Add(int64(w.total-rows), int64(n)) }(w.total)
	}
	if len(w.partial) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.partial = append(w.partial, p...)
			return n, nil
		}
		w.partial = append(w.partial, p[:i]...)
		if err := w.line(w.partial); err != nil {
			return 0, err
		}
		w.partial = w.partial[:0]
		p = p[i+1:]
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.partial = append(w.partial, p...)
			break
		}
		if err := w.line(p[:i]); err != nil {
			return 0, err
		}
		p = p[i+1:]
	}
	return n, nil
}

// backfillRowSize bounds a backfill row's encoded size, as line counts it.
func backfillRowSize(row []json.RawMessage) int {
	size := 2
	for _, v := range row {
		size += rawSize(v)
	}
	return size
}

func (w *backfillWriter) line(line []byte) error {
	var err error
	w.fields, w.buf, err = pgvalue.CopyFields(line, w.fields[:0], w.buf[:0])
	if err == nil && len(w.fields) != len(w.cols) {
		err = fmt.Errorf("copy row has %d fields, want %d", len(w.fields), len(w.cols))
	}
	if err != nil {
		w.err = fmt.Errorf("%s.%s: %w", w.table.spec.Schema, w.table.spec.Name, err)
		return w.err
	}
	row := make([]json.RawMessage, len(w.fields))
	size := 2
	for i, f := range w.fields {
		if f == nil {
			row[i] = jsonNull
		} else if row[i], err = w.arena.appendJSON(w.table.types[i], f); err != nil {
			w.err = fmt.Errorf("%s.%s.%s: %w", w.table.spec.Schema, w.table.spec.Name, w.cols[i], err)
			return w.err
		}
		size += rawSize(row[i])
	}
	if len(w.rows) > 0 && (w.size+size > w.limit || len(w.rows) >= streams.MaxChangesPerMessage) {
		if err := w.emit(); err != nil {
			return err
		}
	}
	w.rows = append(w.rows, row)
	w.size += size
	w.total++
	return nil
}

func (w *backfillWriter) emit() error {
	rows := w.rows
	w.rows, w.size = nil, 0
	if err := w.flush(rows); err != nil {
		w.err = err
		return err
	}
	return nil
}

func (w *backfillWriter) close() error {
	if len(w.partial) > 0 {
		return fmt.Errorf("%s.%s: copy output ends mid-line", w.table.spec.Schema, w.table.spec.Name)
	}
	if len(w.rows) > 0 {
		return w.emit()
	}
	return nil
}

// estimate is Postgres's idea of a table's rows and size on disk, summed
// over its partitions (or children); zero where it has none (a table never
// analyzed).
type estimate struct{ rows, bytes int64 }

// readEstimates reads the estimates of tables on conn, which must not be in
// a transaction that a failure would abort. They only feed progress
// reports: a failure is logged, and the copy goes on without them.
func readEstimates(ctx context.Context, conn *pgx.Conn, log *slog.Logger, tables ...*publishedTable) map[uint32]estimate {
	oids := make([]int64, len(tables))
	for i, t := range tables {
		oids[i] = int64(t.oid)
	}
	out := make(map[uint32]estimate, len(tables))
	rows, err := conn.Query(ctx, `WITH RECURSIVE tree (root, rel) AS (
			SELECT id::oid, id::oid FROM unnest($1::int8[]) AS id
			UNION ALL
			SELECT tree.root, i.inhrelid FROM tree JOIN pg_inherits i ON i.inhparent = tree.rel)
		SELECT tree.root::int8,
			COALESCE(SUM(GREATEST(c.reltuples, 0)) FILTER (WHERE c.relkind = 'r'), 0)::int8,
			COALESCE(SUM(pg_table_size(c.oid)) FILTER (WHERE c.relkind = 'r'), 0)::int8
		FROM tree JOIN pg_class c ON c.oid = tree.rel
		GROUP BY tree.root`, oids)
	if err == nil {
		for rows.Next() {
			var oid, n, size int64
			if err = rows.Scan(&oid, &n, &size); err != nil {
				break
			}
			out[uint32(oid)] = estimate{n, size}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil && ctx.Err() == nil {
		log.Warn("no row and size estimates for progress reports", "err", err)
	}
	return out
}
