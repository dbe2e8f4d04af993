package cvrstore

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jetsync/jetsync/streams"
)

// TestUpdate_Idle checks which finished query-driven updates count as
// changing nothing but their state version.
func TestUpdate_Idle(t *testing.T) {
	rs := newRowSource(t)
	a, b := rowIDOf("a"), rowIDOf("b")
	key := func(id string) string { return id[len("issue")+1:] }
	// base is a CVR at 01 whose query q holds row a at version v1.
	base := func() *CVR {
		c := New("g")
		c.Queries["q"] = &Query{Hash: "q", Got: true, EverGot: true, PatchVersion: "01"}
		c.Queries["r"] = &Query{Hash: "r", Got: true, EverGot: true, PatchVersion: "01"}
		u := c.BeginQuery("01")
		u.Hold(a, key(a), "q", rs.row("a", "v1", "A"))
		if err := u.Finish(nil); err != nil {
			t.Fatal(err)
		}
		c.Version = u.Version
		return c
	}
	for _, tt := range []struct {
		name string
		do   func(*Update)
		want bool
	}{
		{"Untouched", func(*Update) {}, true},
		{"SameRowAgain", func(u *Update) { u.Hold(a, key(a), "q", rs.row("a", "v1", "A")) }, true},
		{"RowChanged", func(u *Update) { u.Hold(a, key(a), "q", rs.row("a", "v2", "A2")) }, false},
		{"RowAdded", func(u *Update) { u.Hold(b, key(b), "q", rs.row("b", "v1", "B")) }, false},
		{"RowLeft", func(u *Update) { u.Release(a, "q") }, false},
		{"HeldByAnotherQuery", func(u *Update) { u.Hold(a, key(a), "r", rs.row("a", "v1", "A")) }, false},
		{"HeldAndDroppedUnsent", func(u *Update) {
			u.Hold(b, key(b), "q", rs.row("b", "v1", "B"))
			u.Release(b, "q")
		}, true},
		{"QueryUngot", func(u *Update) { u.Unget("r") }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			u := c.BeginQuery("05")
			tt.do(u)
			if err := u.Finish(nil); err != nil {
				t.Fatal(err)
			}
			if got := u.Idle(); got != tt.want {
				t.Fatalf("Idle = %v; want %v", got, tt.want)
			}
			if tt.want {
				u.Settle()
				if u.Version != c.Version || u.Changed() {
					t.Errorf("settled at %q; want the CVR's %q", u.Version, c.Version)
				}
			}
		})
	}
	t.Run("NewCVR", func(t *testing.T) {
		u := New("g").BeginQuery("05")
		if err := u.Finish(nil); err != nil {
			t.Fatal(err)
		}
		if u.Idle() {
			t.Error("a CVR's first update is idle; want it written")
		}
	})
}

// TestDurable_Quiet checks that Quiet reports a CVR whose idle flush would
// write nothing, and only such a one: the view-syncer skips the flush
// when it does. A quiet CVR's idle flush is run too, with no stream
// behind it, which a write would need.
func TestDurable_Quiet(t *testing.T) {
	written := func() *CVR {
		c := New("g")
		c.Version, c.ReplicaVersion, c.UserID, c.TTLClockMs = "05", "r1", "u", 1000
		c.written = streams.CVRInstance{Version: "05", ReplicaVersion: "r1", UserID: "u", TTLClockMs: 1000}
		return c
	}
	d := &Durable{}
	for _, tt := range []struct {
		name   string
		change func(*CVR)
		want   bool
	}{
		{"AsWritten", func(*CVR) {}, true},
		{"ClockWithinAMinute", func(c *CVR) { c.TTLClockMs += clockPersistMs - 1 }, true},
		{"ClockAMinuteOn", func(c *CVR) { c.TTLClockMs += clockPersistMs }, false},
		{"Version", func(c *CVR) { c.Version = "06" }, false},
		{"ReplicaVersion", func(c *CVR) { c.ReplicaVersion = "r2" }, false},
		{"User", func(c *CVR) { c.UserID = "v" }, false},
		{"DirtyClient", func(c *CVR) { c.dirty.clients = map[string]clientWas{"c1": {}} }, false},
		{"DirtyDesire", func(c *CVR) { c.dirty.desires = map[DesireKey]desireWas{{ClientID: "c1", Hash: "q"}: {}} }, false},
		{"DirtyQuery", func(c *CVR) { c.dirty.queries = map[string]queryWas{"q": {}} }, false},
		{"ClientSchemaUnwritten", func(c *CVR) { c.ClientSchema = json.RawMessage(`{"tables":{}}`) }, false},
		{"ClientSchemaWritten", func(c *CVR) {
			c.ClientSchema = json.RawMessage(`{"tables":{}}`)
			c.schemaWritten = c.ClientSchema
		}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := written()
			tt.change(c)
			if got := d.Quiet(c); got != tt.want {
				t.Fatalf("Quiet = %v; want %v", got, tt.want)
			}
			if !tt.want {
				return
			}
			u := c.BeginQuery("05")
			if err := u.Finish(nil); err != nil {
				t.Fatal(err)
			}
			if err := d.Flush(context.Background(), c, u); err != nil {
				t.Errorf("idle flush of a quiet CVR: %v", err)
			}
		})
	}
	if !NewMem().Quiet(New("g")) {
		t.Error("Mem.Quiet = false; want true")
	}
}
