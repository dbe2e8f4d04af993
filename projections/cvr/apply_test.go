package cvr

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	_ "modernc.org/sqlite"

	"github.com/jetsync/jetsync/streams"
)

func openDB(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "cvr.db")+"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=temp_store(MEMORY)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	if err := Init(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

// apply applies m at seq in its own transaction.
func apply(t testing.TB, db *sql.DB, seq uint64, m *streams.CVRMessage) (bool, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := Apply(ctx, tx, seq, m)
	if err != nil {
		tx.Rollback()
		return false, err
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ok, nil
}

func mustApply(t testing.TB, db *sql.DB, seq uint64, m *streams.CVRMessage) {
	t.Helper()
	if _, err := apply(t, db, seq, m); err != nil {
		t.Fatalf("Apply(seq %d) = %v", seq, err)
	}
}

func load(t testing.TB, db *sql.DB, group string) *State {
	t.Helper()
	st, err := Load(context.Background(), db, group)
	if err != nil {
		t.Fatalf("Load(%q) = %v", group, err)
	}
	return st
}

func ptr[T any](v T) *T { return &v }

var ignoreProgress = cmpopts.IgnoreFields(State{}, "Progress")

func TestApply_EveryEvent(t *testing.T) {
	db := openDB(t)
	in := streams.CVRInstance{Version: "ignored", ReplicaVersion: "4gc000", TTLClockMs: 1234.5, LastActiveMs: 1764504000123,
		Owner: "vs1", GrantedAtMs: 1764504000000, ProfileID: "pA1", UserID: "u1"}
	evs := []streams.CVREvent{
		{Op: streams.CVROpInstance, Instance: &in},
		{Op: streams.CVROpClientSchema, ClientSchema: json.RawMessage(`{"tables": {"t<": {}}}`)},
		{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: "c1"}},
		{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: "c2", Deleted: true}},
		{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: "c3"}},
		{Op: streams.CVROpDelClient, Client: &streams.CVRClient{ID: "c3"}},
		{Op: streams.CVROpPutQuery, Query: &streams.CVRQuery{Hash: "h1", AST: json.RawMessage(`{"table":"issue"}`),
			TransformationHash: "t1", TransformationVersion: "01", PatchVersion: "01"}},
		{Op: streams.CVROpGot, Got: &streams.CVRGot{Hash: "h1", Got: true, PatchVersion: "02"}},
		{Op: streams.CVROpGot, Got: &streams.CVRGot{Hash: "h4", Got: true, PatchVersion: "02"}},
		{Op: streams.CVROpPutQuery, Query: &streams.CVRQuery{Hash: "h2", Name: "byStatus", Args: json.RawMessage(`["open"]`)}},
		{Op: streams.CVROpPutQuery, Query: &streams.CVRQuery{Hash: "lmids", AST: json.RawMessage(`{}`), Internal: true}},
		{Op: streams.CVROpPutQuery, Query: &streams.CVRQuery{Hash: "h3"}},
		{Op: streams.CVROpDelQuery, Query: &streams.CVRQuery{Hash: "h3"}},
		{Op: streams.CVROpPutDesire, Desire: &streams.CVRDesire{ClientID: "c1", Hash: "h1", TTLMs: 300000, PatchVersion: "01"}},
		{Op: streams.CVROpPutDesire, Desire: &streams.CVRDesire{ClientID: "c2", Hash: "h2", TTLMs: 1, InactivatedAtMs: ptr(99.5),
			Cleared: true, PatchVersion: "02"}},
		{Op: streams.CVROpPutDesire, Desire: &streams.CVRDesire{ClientID: "c2", Hash: "h3"}},
		{Op: streams.CVROpDelDesire, Desire: &streams.CVRDesire{ClientID: "c2", Hash: "h3"}},
		{Op: streams.CVROpPutRow, Row: &streams.CVRRow{Table: "issue", Key: json.RawMessage(`{"id": "i1"}`), RowVersion: "01",
			PatchVersion: "02", Refs: map[string]int{"h1": 1, "lmids": 2}}},
		{Op: streams.CVROpPutRow, Row: &streams.CVRRow{Table: "issue", Key: json.RawMessage(`{"id":"i2"}`), RowVersion: "01", PatchVersion: "02"}},
		{Op: streams.CVROpPutRow, Row: &streams.CVRRow{Table: "issue", Key: json.RawMessage(`{"id":"i3"}`), Refs: map[string]int{}}},
		{Op: streams.CVROpPutRow, Row: &streams.CVRRow{Table: "issue", Key: json.RawMessage(`{"id":"i4"}`)}},
		{Op: streams.CVROpDelRow, Row: &streams.CVRRow{Table: "issue", Key: json.RawMessage(`{"id" : "i4"}`)}},
		// i2 again: a later event wins.
		{Op: streams.CVROpPutRows, Rows: &streams.CVRRows{Table: "issue", PatchVersion: "02", Refs: map[string]int{"h1": 1},
			Keys:        []json.RawMessage{json.RawMessage(`{"id":"i5"}`), json.RawMessage(`{"id": "i2"}`)},
			RowVersions: []string{"01", "02"}}},
		{Op: streams.CVROpPutRows, Rows: &streams.CVRRows{Table: "comment", PatchVersion: "02",
			Keys: []json.RawMessage{json.RawMessage(`{"id":"c9"}`)}, RowVersions: []string{"01"}}},
	}
	mustApply(t, db, 5, &streams.CVRMessage{Group: "g", Version: "02", Last: true, Events: evs})
	in.Version = "02" // the message's version wins
	want := &State{
		GroupID:      "g",
		Progress:     Progress{Seq: 5, Last: true, SinceSnapshot: 1},
		Instance:     in,
		ClientSchema: json.RawMessage(`{"tables":{"t\u003c":{}}}`),
		Clients:      map[string]streams.CVRClient{"c1": {ID: "c1"}, "c2": {ID: "c2", Deleted: true}},
		Queries: map[string]streams.CVRQuery{
			"h1":    {Hash: "h1", AST: json.RawMessage(`{"table":"issue"}`), TransformationHash: "t1", TransformationVersion: "01", Got: true, PatchVersion: "02"},
			"h2":    {Hash: "h2", Name: "byStatus", Args: json.RawMessage(`["open"]`)},
			"h4":    {Hash: "h4", Got: true, PatchVersion: "02"},
			"lmids": {Hash: "lmids", AST: json.RawMessage(`{}`), Internal: true},
		},
		Desires: map[DesireKey]streams.CVRDesire{
			{"c1", "h1"}: {ClientID: "c1", Hash: "h1", TTLMs: 300000, PatchVersion: "01"},
			{"c2", "h2"}: {ClientID: "c2", Hash: "h2", TTLMs: 1, InactivatedAtMs: ptr(99.5), Cleared: true, PatchVersion: "02"},
		},
		Rows: map[RowKey]streams.CVRRow{
			{"issue", `{"id":"i1"}`}:   {Table: "issue", Key: json.RawMessage(`{"id":"i1"}`), RowVersion: "01", PatchVersion: "02", Refs: map[string]int{"h1": 1, "lmids": 2}},
			{"issue", `{"id":"i2"}`}:   {Table: "issue", Key: json.RawMessage(`{"id":"i2"}`), RowVersion: "02", PatchVersion: "02", Refs: map[string]int{"h1": 1}},
			{"issue", `{"id":"i5"}`}:   {Table: "issue", Key: json.RawMessage(`{"id":"i5"}`), RowVersion: "01", PatchVersion: "02", Refs: map[string]int{"h1": 1}},
			{"comment", `{"id":"c9"}`}: {Table: "comment", Key: json.RawMessage(`{"id":"c9"}`), RowVersion: "01", PatchVersion: "02"},
			{"issue", `{"id":"i3"}`}:   {Table: "issue", Key: json.RawMessage(`{"id":"i3"}`), Refs: map[string]int{}},
		},
	}
	if d := cmp.Diff(want, load(t, db, "g")); d != "" {
		t.Errorf("Load (-want +got):\n%s", d)
	}
	if d := cmp.Diff(newState("other"), load(t, db, "other")); d != "" {
		t.Errorf("Load(unknown group) (-want +got):\n%s", d)
	}
}

func TestApply_Idempotent(t *testing.T) {
	db := openDB(t)
	w := newWorkload(1)
	w.stride = 2
	msgs := w.messages(40)
	for i, m := range msgs {
		mustApply(t, db, uint64(i+1)*2, m) // other groups' messages sit between
	}
	want := load(t, db, "g")
	for _, i := range []int{0, 17, 39} {
		ok, err := apply(t, db, uint64(i+1)*2, msgs[i])
		if ok || err != nil {
			t.Errorf("redelivered Apply(seq %d) = %v, %v; want false, nil", (i+1)*2, ok, err)
		}
	}
	if d := cmp.Diff(want, load(t, db, "g")); d != "" {
		t.Errorf("state changed by redelivery (-want +got):\n%s", d)
	}
}

func TestApply_Gap(t *testing.T) {
	db := openDB(t)
	put := func(id string) []streams.CVREvent {
		return []streams.CVREvent{{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: id}}}
	}
	mustApply(t, db, 3, &streams.CVRMessage{Group: "g", Version: "01", Last: true, Events: put("a")})
	for _, tc := range []struct {
		name string
		m    streams.CVRMessage
	}{
		{"WrongPrev", streams.CVRMessage{Group: "g", Prev: 2, Last: true, Events: put("b")}},
		{"NoPart0", streams.CVRMessage{Group: "g", Prev: 3, Part: 1, Last: true, Events: put("b")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := apply(t, db, 9, &tc.m); !errors.Is(err, ErrGap) {
				t.Errorf("Apply = %v; want ErrGap", err)
			}
		})
	}
	// A multi-part update: parts must follow one another.
	mustApply(t, db, 10, &streams.CVRMessage{Group: "g", Prev: 3, Part: 0, Events: put("b")})
	if _, err := apply(t, db, 11, &streams.CVRMessage{Group: "g", Prev: 10, Part: 0, Last: true, Events: put("c")}); !errors.Is(err, ErrGap) {
		t.Errorf("new update inside an open one: %v; want ErrGap", err)
	}
	if _, err := apply(t, db, 11, &streams.CVRMessage{Group: "g", Prev: 3, Part: 2, Last: true, Events: put("c")}); !errors.Is(err, ErrGap) {
		t.Errorf("skipped part: %v; want ErrGap", err)
	}
	mustApply(t, db, 12, &streams.CVRMessage{Group: "g", Version: "02", Prev: 3, Part: 1, Last: true, Events: put("c")})
	if st := load(t, db, "g"); len(st.Clients) != 3 || st.Instance.Version != "02" {
		t.Errorf("after the update: clients %v, version %q", st.Clients, st.Instance.Version)
	}
	// A snapshot after a gap replaces everything.
	snap := []streams.CVREvent{{Op: streams.CVROpSnapshot, Snapshot: &streams.CVRSnapshot{Version: "05"}}, put("z")[0]}
	mustApply(t, db, 40, &streams.CVRMessage{Group: "g", Version: "05", Prev: 30, Last: true, Events: snap})
	st := load(t, db, "g")
	if len(st.Clients) != 1 || st.Instance.Version != "05" || st.Progress != (Progress{Seq: 40, Prev: 30, Last: true, SinceSnapshot: 1}) {
		t.Errorf("after the snapshot: clients %v, version %q, progress %+v", st.Clients, st.Instance.Version, st.Progress)
	}
}

// TestSnapshot checks that a snapshot of any state reproduces it, applied
// both on top of it (compaction) and to an empty projection (rebuild), and
// that the workload applied one message per transaction equals a simple
// model of it.
func TestSnapshot(t *testing.T) {
	db := openDB(t)
	w := newWorkload(2)
	msgs := w.messages(120)
	for i, m := range msgs {
		mustApply(t, db, uint64(i+1), m)
	}
	got := load(t, db, "g")
	if d := cmp.Diff(w.model, got, ignoreProgress); d != "" {
		t.Fatalf("projection differs from the model (-model +projection):\n%s", d)
	}
	snap := &streams.CVRMessage{Group: "g", Version: got.Instance.Version, Prev: got.Progress.Seq, Last: true, Events: SnapshotEvents(got)}
	mustApply(t, db, 500, snap)
	after := load(t, db, "g")
	if d := cmp.Diff(got, after, ignoreProgress); d != "" {
		t.Errorf("snapshot on top changed the state (-before +after):\n%s", d)
	}
	if after.Progress.SinceSnapshot != 1 {
		t.Errorf("SinceSnapshot = %d; want 1", after.Progress.SinceSnapshot)
	}
	fresh := openDB(t)
	snap.Prev = 499 // purged history before it
	mustApply(t, fresh, 500, snap)
	if d := cmp.Diff(got, load(t, fresh, "g"), ignoreProgress); d != "" {
		t.Errorf("snapshot rebuild differs (-want +got):\n%s", d)
	}
}

// workload makes a deterministic random history of one group's updates
// and keeps a model of the state they describe.
type workload struct {
	r    *rand.Rand
	n    int
	prev uint64
	// stride spaces the sequences of the group's messages, as other
	// groups' messages would.
	stride uint64
	model  *State
}

func newWorkload(seed uint64) *workload {
	m := newState("g")
	m.Progress = Progress{}
	return &workload{r: rand.New(rand.NewPCG(seed, seed)), stride: 1, model: m}
}

// messages makes n single-message updates, the k-th at sequence k*stride.
func (w *workload) messages(n int) []*streams.CVRMessage {
	var out []*streams.CVRMessage
	for range n {
		w.n++
		v := fmt.Sprintf("v%04d", w.n)
		evs := w.update(v)
		out = append(out, &streams.CVRMessage{Group: "g", Owner: "vs1", Version: v, Prev: w.prev, Last: true, Events: evs})
		w.prev = uint64(w.n) * w.stride
		w.model.Instance.Version = v
	}
	return out
}

func (w *workload) update(v string) []streams.CVREvent {
	var evs []streams.CVREvent
	add := func(e streams.CVREvent) { evs = append(evs, e) }
	if w.n == 1 {
		in := streams.CVRInstance{Version: v, ReplicaVersion: "r1", Owner: "vs1"}
		add(streams.CVREvent{Op: streams.CVROpInstance, Instance: &in})
		w.model.Instance = in
		add(streams.CVREvent{Op: streams.CVROpClientSchema, ClientSchema: json.RawMessage(`{"tables":{}}`)})
		w.model.ClientSchema = json.RawMessage(`{"tables":{}}`)
	}
	for range 1 + w.r.IntN(6) {
		c, h := fmt.Sprintf("c%d", w.r.IntN(3)), fmt.Sprintf("h%d", w.r.IntN(5))
		switch k := w.r.IntN(10); {
		case k == 0:
			in := w.model.Instance
			in.TTLClockMs += 1000.25
			in.LastActiveMs = int64(w.n) * 1000
			add(streams.CVREvent{Op: streams.CVROpInstance, Instance: &in})
			w.model.Instance = in
		case k == 1:
			cl := streams.CVRClient{ID: c, Deleted: w.r.IntN(4) == 0}
			add(streams.CVREvent{Op: streams.CVROpPutClient, Client: &cl})
			w.model.Clients[c] = cl
		case k == 2:
			q := streams.CVRQuery{Hash: h, AST: json.RawMessage(`{"table":"t"}`), TransformationHash: "x" + h}
			if old, ok := w.model.Queries[h]; ok {
				q.Got, q.PatchVersion = old.Got, old.PatchVersion
			}
			add(streams.CVREvent{Op: streams.CVROpPutQuery, Query: &q})
			w.model.Queries[h] = q
		case k == 3:
			g := streams.CVRGot{Hash: h, Got: w.r.IntN(3) > 0, PatchVersion: v}
			add(streams.CVREvent{Op: streams.CVROpGot, Got: &g})
			q := w.model.Queries[h]
			q.Hash, q.Got, q.PatchVersion = h, g.Got, g.PatchVersion
			w.model.Queries[h] = q
		case k == 4:
			d := streams.CVRDesire{ClientID: c, Hash: h, TTLMs: 300000, PatchVersion: v}
			if w.r.IntN(2) == 0 {
				d.InactivatedAtMs = ptr(float64(w.n))
			}
			add(streams.CVREvent{Op: streams.CVROpPutDesire, Desire: &d})
			w.model.Desires[DesireKey{c, h}] = d
		case k == 5 && w.r.IntN(3) == 0:
			add(streams.CVREvent{Op: streams.CVROpDelDesire, Desire: &streams.CVRDesire{ClientID: c, Hash: h}})
			delete(w.model.Desires, DesireKey{c, h})
		case k == 5:
			add(streams.CVREvent{Op: streams.CVROpDelQuery, Query: &streams.CVRQuery{Hash: h}})
			delete(w.model.Queries, h)
		default:
			id := w.r.IntN(30)
			r := streams.CVRRow{Table: "issue", Key: json.RawMessage(fmt.Sprintf(`{"id":"i%02d"}`, id)), RowVersion: v, PatchVersion: v}
			switch w.r.IntN(4) {
			case 0: // tombstone
			case 1:
				add(streams.CVREvent{Op: streams.CVROpDelRow, Row: &streams.CVRRow{Table: r.Table, Key: r.Key}})
				delete(w.model.Rows, Key(&r))
				continue
			default:
				r.Refs = map[string]int{h: 1 + w.r.IntN(2)}
			}
			add(streams.CVREvent{Op: streams.CVROpPutRow, Row: &r})
			w.model.Rows[Key(&r)] = r
		}
	}
	return evs
}
