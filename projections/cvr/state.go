package cvr

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/jetsync/jetsync/streams"
)

// State is a group's whole CVR.
type State struct {
	GroupID  string
	Progress Progress
	// Instance.Version is the CVR version: the cookie of the last complete
	// update ("" for a group never written).
	Instance     streams.CVRInstance
	ClientSchema json.RawMessage
	Clients      map[string]streams.CVRClient
	Queries      map[string]streams.CVRQuery
	Desires      map[DesireKey]streams.CVRDesire
	Rows         map[RowKey]streams.CVRRow
}

// DesireKey identifies a desire.
type DesireKey struct{ ClientID, Hash string }

// RowKey identifies a row record: its table and its key's JSON in the
// stream's form.
type RowKey struct{ Table, Key string }

// Key is r's identity.
func Key(r *streams.CVRRow) RowKey {
	k, _ := rawText(r.Key).(string)
	return RowKey{Table: r.Table, Key: k}
}

func newState(groupID string) *State {
	return &State{
		GroupID:  groupID,
		Progress: Progress{Last: true},
		Clients:  map[string]streams.CVRClient{},
		Queries:  map[string]streams.CVRQuery{},
		Desires:  map[DesireKey]streams.CVRDesire{},
		Rows:     map[RowKey]streams.CVRRow{},
	}
}

// Load reads a group's whole state. A group the projection does not know
// gives an empty State whose Progress.Seq is 0.
func Load(ctx context.Context, q Querier, groupID string) (*State, error) {
	st := newState(groupID)
	var seq, prev int64
	var schema sql.NullString
	in := &st.Instance
	err := q.QueryRowContext(ctx, `SELECT seq, prev, part, last, sinceSnapshot, version, replicaVersion, ttlClockMs,
		lastActiveMs, owner, grantedAtMs, profileID, userID, deleted, clientSchema FROM instances WHERE groupID = ?`, groupID).
		Scan(&seq, &prev, &st.Progress.Part, &st.Progress.Last, &st.Progress.SinceSnapshot, &in.Version, &in.ReplicaVersion,
			&in.TTLClockMs, &in.LastActiveMs, &in.Owner, &in.GrantedAtMs, &in.ProfileID, &in.UserID, &in.Deleted, &schema)
	if errors.Is(err, sql.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load cvr instance: %w", err)
	}
	st.Progress.Seq, st.Progress.Prev = uint64(seq), uint64(prev)
	if schema.Valid {
		st.ClientSchema = json.RawMessage(schema.String)
	}
	err = each(ctx, q, `SELECT clientID, deleted FROM clients WHERE groupID = ?`, []any{groupID}, func(r *sql.Rows) error {
		var c streams.CVRClient
		if err := r.Scan(&c.ID, &c.Deleted); err != nil {
			return err
		}
		st.Clients[c.ID] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load cvr clients: %w", err)
	}
	if err := queries(ctx, q, groupID, func(qr streams.CVRQuery) { st.Queries[qr.Hash] = qr }); err != nil {
		return nil, err
	}
	if err := desires(ctx, q, groupID, func(d streams.CVRDesire) { st.Desires[DesireKey{d.ClientID, d.Hash}] = d }); err != nil {
		return nil, err
	}
	if err := rows(ctx, q, groupID, func(r streams.CVRRow) { st.Rows[Key(&r)] = r }); err != nil {
		return nil, err
	}
	return st, nil
}

// The readers below read every record of a group, in key order.

func queries(ctx context.Context, q Querier, groupID string, f func(streams.CVRQuery)) error {
	query, args := filtered(`SELECT hash, ast, name, args, transformationHash, transformationVersion, internal, got, patchVersion
		FROM queries WHERE groupID = ?`, groupID, "hash")
	err := each(ctx, q, query, args, func(r *sql.Rows) error {
		var qr streams.CVRQuery
		var ast, qargs sql.NullString
		if err := r.Scan(&qr.Hash, &ast, &qr.Name, &qargs, &qr.TransformationHash, &qr.TransformationVersion,
			&qr.Internal, &qr.Got, &qr.PatchVersion); err != nil {
			return err
		}
		qr.AST, qr.Args = raw(ast), raw(qargs)
		f(qr)
		return nil
	})
	if err != nil {
		return fmt.Errorf("load cvr queries: %w", err)
	}
	return nil
}

func desires(ctx context.Context, q Querier, groupID string, f func(streams.CVRDesire)) error {
	query, args := filtered(`SELECT clientID, hash, ttlMs, inactivatedAtMs, cleared, patchVersion
		FROM desires WHERE groupID = ?`, groupID, "clientID, hash")
	err := each(ctx, q, query, args, func(r *sql.Rows) error {
		var d streams.CVRDesire
		var inact sql.NullFloat64
		if err := r.Scan(&d.ClientID, &d.Hash, &d.TTLMs, &inact, &d.Cleared, &d.PatchVersion); err != nil {
			return err
		}
		if inact.Valid {
			d.InactivatedAtMs = &inact.Float64
		}
		f(d)
		return nil
	})
	if err != nil {
		return fmt.Errorf("load cvr desires: %w", err)
	}
	return nil
}

func rows(ctx context.Context, q Querier, groupID string, f func(streams.CVRRow)) error {
	query, args := filtered(`SELECT tbl, key, rowVersion, patchVersion, refs FROM rows WHERE groupID = ?`, groupID, "tbl, key")
	err := each(ctx, q, query, args, func(r *sql.Rows) error {
		var row streams.CVRRow
		var key string
		var refs sql.NullString
		if err := r.Scan(&row.Table, &key, &row.RowVersion, &row.PatchVersion, &refs); err != nil {
			return err
		}
		row.Key = json.RawMessage(key)
		if refs.Valid {
			if err := json.Unmarshal([]byte(refs.String), &row.Refs); err != nil {
				return fmt.Errorf("refs of %s %s: %w", row.Table, key, err)
			}
		}
		f(row)
		return nil
	})
	if err != nil {
		return fmt.Errorf("load cvr rows: %w", err)
	}
	return nil
}

func filtered(query, groupID, order string) (string, []any) {
	return query + " ORDER BY " + order, []any{groupID}
}

func each(ctx context.Context, q Querier, query string, args []any, f func(*sql.Rows) error) error {
	rs, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rs.Close()
	for rs.Next() {
		if err := f(rs); err != nil {
			return err
		}
	}
	return rs.Err()
}

func raw(s sql.NullString) json.RawMessage {
	if !s.Valid {
		return nil
	}
	return json.RawMessage(s.String)
}

// SnapshotEvents is st as the events of a snapshot: applied to any state,
// they leave st (progress aside).
func SnapshotEvents(st *State) []streams.CVREvent {
	in := st.Instance
	evs := []streams.CVREvent{
		{Op: streams.CVROpSnapshot, Snapshot: &streams.CVRSnapshot{Version: in.Version}},
		{Op: streams.CVROpInstance, Instance: &in},
	}
	if st.ClientSchema != nil {
		evs = append(evs, streams.CVREvent{Op: streams.CVROpClientSchema, ClientSchema: st.ClientSchema})
	}
	for _, id := range sortedKeys(st.Clients, func(a, b string) bool { return a < b }) {
		c := st.Clients[id]
		evs = append(evs, streams.CVREvent{Op: streams.CVROpPutClient, Client: &c})
	}
	for _, h := range sortedKeys(st.Queries, func(a, b string) bool { return a < b }) {
		q := st.Queries[h]
		evs = append(evs, streams.CVREvent{Op: streams.CVROpPutQuery, Query: &q})
	}
	for _, k := range sortedKeys(st.Desires, func(a, b DesireKey) bool {
		return a.ClientID < b.ClientID || a.ClientID == b.ClientID && a.Hash < b.Hash
	}) {
		d := st.Desires[k]
		evs = append(evs, streams.CVREvent{Op: streams.CVROpPutDesire, Desire: &d})
	}
	var rows streams.CVRRowEvents
	for _, k := range sortedKeys(st.Rows, func(a, b RowKey) bool { return a.Table < b.Table || a.Table == b.Table && a.Key < b.Key }) {
		rows.Add(st.Rows[k])
	}
	return append(evs, rows.Events()...)
}

func sortedKeys[K comparable, V any](m map[K]V, less func(a, b K) bool) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return less(ks[i], ks[j]) })
	return ks
}
