package cvrstore

import "testing"

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
