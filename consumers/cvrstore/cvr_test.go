package cvrstore

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/jetsync/jetsync/projections/cvr"
	"github.com/jetsync/jetsync/streams"
)

func TestClampTTL(t *testing.T) {
	ms := func(v float64) *float64 { return &v }
	tests := []struct {
		in   *float64
		want time.Duration
	}{
		{nil, DefaultTTL},
		{ms(0), 0},
		{ms(1500), 1500 * time.Millisecond},
		{ms(600_000), MaxTTL},
		{ms(600_001), MaxTTL},
		{ms(-1), MaxTTL},
	}
	for _, tt := range tests {
		if got := ClampTTL(tt.in); got != tt.want {
			t.Errorf("ClampTTL(%v) = %v; want %v", tt.in, got, tt.want)
		}
	}
}

func TestDesire_Expiry(t *testing.T) {
	tests := []struct {
		name     string
		d        Desire
		clock    float64
		expires  float64
		expired  bool
		inactive bool
	}{
		{"Active", Desire{TTL: time.Second}, 1e9, 1000, false, false},
		{"RunningTTL", Desire{TTL: time.Second, Inactive: true, InactiveAt: 500}, 1499, 1500, false, true},
		{"TTLOut", Desire{TTL: time.Second, Inactive: true, InactiveAt: 500}, 1500, 1500, true, true},
		{"Cleared", Desire{TTL: time.Minute, Inactive: true, InactiveAt: 500, Cleared: true}, 500, 500, true, true},
		{"ZeroTTL", Desire{Inactive: true, InactiveAt: 7}, 7, 7, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.inactive {
				if got := tt.d.ExpiresAt(); got != tt.expires {
					t.Errorf("ExpiresAt = %v; want %v", got, tt.expires)
				}
			}
			if got := tt.d.Expired(tt.clock); got != tt.expired {
				t.Errorf("Expired(%v) = %v; want %v", tt.clock, got, tt.expired)
			}
		})
	}
}

// TestUpdate_RefsShared checks that the rows one query alone holds share
// one refs map, which is what keeps a 100k-row query's CVR small, and that
// a map is replaced, never changed, when another query joins or leaves.
func TestUpdate_RefsShared(t *testing.T) {
	rs := newRowSource(t)
	c := New("g")
	c.Queries["q1"], c.Queries["q2"] = &Query{Hash: "q1"}, &Query{Hash: "q2"}
	u := c.BeginQuery("01")
	a := u.Hold(rowIDOf("a"), `{"id":"a"}`, "q1", rs.row("a", "01", ""))
	b := u.Hold(rowIDOf("b"), `{"id":"b"}`, "q1", rs.row("b", "01", ""))
	same := func(x, y map[string]int) bool { return reflect.ValueOf(x).Pointer() == reflect.ValueOf(y).Pointer() }
	if !same(a.Refs, b.Refs) {
		t.Fatal("rows held by one query do not share their refs")
	}
	shared := a.Refs
	u.Hold(rowIDOf("a"), `{"id":"a"}`, "q1", rs.row("a", "01", ""))
	if !same(a.Refs, shared) {
		t.Error("holding a row again replaced its refs")
	}
	u.Hold(rowIDOf("b"), `{"id":"b"}`, "q2", rs.row("b", "01", ""))
	if same(b.Refs, shared) || !reflect.DeepEqual(b.Refs, map[string]int{"q1": 1, "q2": 1}) {
		t.Errorf("b's refs = %v (shared %v); want a new map of q1 and q2", b.Refs, same(b.Refs, shared))
	}
	if !reflect.DeepEqual(shared, map[string]int{"q1": 1}) {
		t.Errorf("the shared refs changed: %v", shared)
	}
	u.Release(rowIDOf("a"), "q1")
	if len(a.Refs) != 0 || a.Refs == nil || !reflect.DeepEqual(shared, map[string]int{"q1": 1}) {
		t.Errorf("after release: a's refs %v, shared %v", a.Refs, shared)
	}
	if err := u.Finish(nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Rows[rowIDOf("a")]; ok {
		t.Error("a row never sent is still in the CVR")
	}
	if !reflect.DeepEqual(b.Refs, map[string]int{"q1": 1, "q2": 1}) || b.PatchVersion != "01" {
		t.Errorf("b = %+v", b)
	}
}

// TestUpdate_ReleaseShares checks that dropping a query makes no map per
// row: rows left with no query share one empty refs map, a row left with
// one query that query's shared map; and that an update which does not
// compare values keeps none of the rows it found.
func TestUpdate_ReleaseShares(t *testing.T) {
	rs := newRowSource(t)
	same := func(x, y map[string]int) bool { return reflect.ValueOf(x).Pointer() == reflect.ValueOf(y).Pointer() }
	for _, compare := range []bool{false, true} {
		c := New("g")
		c.Queries["q1"], c.Queries["q2"] = &Query{Hash: "q1"}, &Query{Hash: "q2"}
		u := c.BeginQuery("01")
		a := u.Hold(rowIDOf("a"), `{"id":"a"}`, "q1", rs.row("a", "01", ""))
		b := u.Hold(rowIDOf("b"), `{"id":"b"}`, "q1", rs.row("b", "01", ""))
		x := u.Hold(rowIDOf("x"), `{"id":"x"}`, "q1", rs.row("x", "01", ""))
		u.Hold(rowIDOf("x"), `{"id":"x"}`, "q2", rs.row("x", "01", ""))
		only := u.Hold(rowIDOf("y"), `{"id":"y"}`, "q2", rs.row("y", "01", ""))
		if err := u.Finish(nil); err != nil {
			t.Fatal(err)
		}
		u = c.BeginQuery("02")
		u.Compare = compare
		for _, id := range []string{"a", "b", "x"} {
			u.Release(rowIDOf(id), "q1")
		}
		if len(a.Refs) != 0 || a.Refs == nil || !same(a.Refs, b.Refs) {
			t.Errorf("compare=%v: released rows' refs %v and %v; want one shared empty map", compare, a.Refs, b.Refs)
		}
		if !reflect.DeepEqual(x.Refs, map[string]int{"q2": 1}) || !same(x.Refs, only.Refs) {
			t.Errorf("compare=%v: x's refs %v; want q2's shared map", compare, x.Refs)
		}
		for i, st := range u.starts {
			if st.value.IsZero() == compare {
				t.Errorf("compare=%v: start %d keeps a value: %v", compare, i, !st.value.IsZero())
			}
		}
		if err := u.Finish(nil); err != nil {
			t.Fatal(err)
		}
		if a.Refs != nil || b.Refs != nil || !reflect.DeepEqual(only.Refs, map[string]int{"q2": 1}) {
			t.Errorf("compare=%v: after Finish a %v, b %v, y %v", compare, a.Refs, b.Refs, only.Refs)
		}
	}
}

func TestPutNeeded(t *testing.T) {
	rs := newRowSource(t)
	v1, v1b := rs.row("a", "01", "x"), rs.row("a", "01", "y")
	v2 := rs.row("a", "02", "x")
	tests := []struct {
		name    string
		st      rowStart
		rec     Row
		compare bool
		want    bool
	}{
		{"New", rowStart{}, Row{RowVersion: "01", Value: v1}, false, true},
		{"Tombstone", rowStart{existed: true, version: "01"}, Row{RowVersion: "01", Value: v1}, false, true},
		{"Same", rowStart{live: true, version: "01", value: v1}, Row{RowVersion: "01", Value: v1}, false, false},
		{"NewVersion", rowStart{live: true, version: "01", value: v1}, Row{RowVersion: "02", Value: v2}, false, true},
		{"ValueUncompared", rowStart{live: true, version: "01", value: v1}, Row{RowVersion: "01", Value: v1b}, false, false},
		{"ValueCompared", rowStart{live: true, version: "01", value: v1}, Row{RowVersion: "01", Value: v1b}, true, true},
		{"EqualCompared", rowStart{live: true, version: "01", value: v1}, Row{RowVersion: "01", Value: v1}, true, false},
		// A loaded row has no value: only its version tells.
		{"LoadedCompared", rowStart{live: true, version: "01"}, Row{RowVersion: "01", Value: v1b}, true, false},
	}
	for _, tt := range tests {
		if got := putNeeded(tt.st, &tt.rec, tt.compare); got != tt.want {
			t.Errorf("%s: putNeeded = %v; want %v", tt.name, got, tt.want)
		}
	}
}

func TestBeginQuery_Version(t *testing.T) {
	tests := []struct{ from, state, want string }{
		{"", "0a", "0a"},
		{"0a", "0b", "0b"},
		{"0a:03", "0a", "0a:03"},
		{"0b", "0a", "0b"},
		{"0a:03", "0b", "0b"},
	}
	for _, tt := range tests {
		c := New("g")
		c.Version = tt.from
		if got := c.BeginQuery(tt.state).Version; got != tt.want {
			t.Errorf("BeginQuery(%q) from %q: version %q; want %q", tt.state, tt.from, got, tt.want)
		}
	}
}

// TestFromState checks a CVR loaded from the projection's state: its
// records, and the client record a desire outlived, which the next flush
// writes back.
func TestFromState(t *testing.T) {
	at := 1000.0
	st := &cvr.State{
		GroupID:      "g",
		Instance:     streams.CVRInstance{Version: "0b", ReplicaVersion: "r1", TTLClockMs: 5000, UserID: "u"},
		ClientSchema: json.RawMessage(`{}`),
		Clients:      map[string]streams.CVRClient{"c1": {ID: "c1"}},
		Desires: map[cvr.DesireKey]streams.CVRDesire{
			{ClientID: "c1", Hash: "q1"}: {ClientID: "c1", Hash: "q1", TTLMs: 1000, PatchVersion: "0a"},
			{ClientID: "c2", Hash: "q1"}: {ClientID: "c2", Hash: "q1", TTLMs: 1000, InactivatedAtMs: &at, PatchVersion: "0b"},
		},
		Queries: map[string]streams.CVRQuery{"q1": {Hash: "q1", Got: true, PatchVersion: "0a", AST: json.RawMessage(`{"table":"issue"}`)}},
		Rows: map[cvr.RowKey]streams.CVRRow{
			{Table: "issue", Key: `{"id":"a"}`}: {Table: "issue", Key: json.RawMessage(`{"id":"a"}`), RowVersion: "01", PatchVersion: "0a", Refs: map[string]int{"q1": 1}},
		},
	}
	c, err := fromState(st)
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != "0b" || c.ReplicaVersion != "r1" || c.TTLClockMs != 5000 || c.UserID != "u" {
		t.Errorf("instance = %q %q %v %q", c.Version, c.ReplicaVersion, c.TTLClockMs, c.UserID)
	}
	if c2 := c.Clients["c2"]; c2 == nil || !c2.Deleted || c2.Desired["q1"] == nil || !c2.Desired["q1"].Inactive {
		t.Errorf("c2 = %+v", c2)
	}
	if q := c.Queries["q1"]; q.AST == nil || !q.Got || !q.EverGot {
		t.Errorf("q1 = %+v", q)
	}
	if r := c.Rows[rowIDOf("a")]; r == nil || r.Key != `{"id":"a"}` || !r.Value.IsZero() {
		t.Errorf("row a = %+v", r)
	}
	evs, err := configEvents(c)
	if err != nil {
		t.Fatal(err)
	}
	want := []streams.CVREvent{{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: "c2", Deleted: true}}}
	if !reflect.DeepEqual(evs, want) {
		t.Errorf("first flush writes %+v; want only c2's record", evs)
	}
}

func TestMem(t *testing.T) {
	ctx := context.Background()
	m := NewMem()
	if c, err := m.Load(ctx, "g"); c != nil || err != nil {
		t.Fatalf("Load of a new group = %v, %v", c, err)
	}
	c := New("g")
	u := c.BeginConfig()
	u.PutClient("c1")
	c.Version = u.Version
	if err := m.Flush(ctx, c, u); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Load(ctx, "g"); got != c {
		t.Error("Load does not return the flushed CVR")
	}
	m.Drop(ctx, New("g"))
	if got, _ := m.Load(ctx, "g"); got != c {
		t.Error("dropping another CVR of the group dropped the flushed one")
	}
	m.Drop(ctx, c)
	if got, _ := m.Load(ctx, "g"); got != nil {
		t.Error("Drop kept the CVR")
	}
}
