package cvrstore

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// catchup lists a catch-up's patches in a stable order.
func catchup(c *CVR, base string) []string {
	var out []string
	for p := range c.Catchup(base, true) {
		s := fmt.Sprintf("%d del=%v %s %s", p.Kind, p.Del, p.ClientID, p.Hash)
		if p.Row != nil {
			s += " " + p.Row.Table + "/" + p.Row.Key
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// pruneFixture is a group whose records changed at versions 11 to 15.
func pruneFixture() *CVR {
	c := New("g")
	c.Version = "15"
	c.Clients["live"] = &Client{ID: "live", Desired: map[string]*Desire{
		"q-live":    {TTL: time.Minute, PatchVersion: "11"},
		"q-expired": {Inactive: true, InactiveAt: 0, PatchVersion: "12"},
		"q-running": {TTL: time.Hour, Inactive: true, InactiveAt: 0, PatchVersion: "12"},
		"q-late":    {Inactive: true, InactiveAt: 0, PatchVersion: "14"},
	}}
	c.Clients["gone"] = &Client{ID: "gone", Deleted: true, Desired: map[string]*Desire{
		"q-gone": {Inactive: true, Cleared: true, PatchVersion: "12"},
	}}
	c.Clients["gone-late"] = &Client{ID: "gone-late", Deleted: true, Desired: map[string]*Desire{
		"q-gone": {Inactive: true, Cleared: true, PatchVersion: "14"},
	}}
	c.Queries["q-live"] = &Query{Hash: "q-live", Got: true, EverGot: true, PatchVersion: "11"}
	c.Queries["q-expired"] = &Query{Hash: "q-expired", EverGot: true, PatchVersion: "13"}
	c.Queries["q-running"] = &Query{Hash: "q-running", Got: true, EverGot: true, PatchVersion: "11"}
	c.Queries["q-late"] = &Query{Hash: "q-late", EverGot: true, PatchVersion: "14"}
	c.Queries["q-gone"] = &Query{Hash: "q-gone", EverGot: true, PatchVersion: "12"}
	c.Queries["q-piped"] = &Query{Hash: "q-piped", PatchVersion: "11"}
	c.Queries["internal"] = &Query{Hash: "internal", Internal: true, PatchVersion: "11"}
	c.Rows["issue\x00a"] = &Row{Table: "issue", Key: "a", Refs: map[string]int{"q-live": 1}, PatchVersion: "11"}
	c.Rows["issue\x00b"] = &Row{Table: "issue", Key: "b", PatchVersion: "12"}
	c.Rows["issue\x00c"] = &Row{Table: "issue", Key: "c", PatchVersion: "13"}
	c.Rows["issue\x00d"] = &Row{Table: "issue", Key: "d", PatchVersion: "15"}
	return c
}

func TestCVR_Prune(t *testing.T) {
	c := pruneFixture()
	clock := 1.0
	before := map[string][]string{}
	for _, base := range []string{"11", "12", "13", "14", "15"} {
		before[base] = catchup(c, base)
	}
	p := c.Prune("13", clock, func(h string) bool { return h == "q-piped" })
	if want := (Pruned{Rows: 2, Desires: 2, Queries: 1, Clients: 1}); p != want {
		t.Errorf("pruned %+v; want %+v", p, want)
	}
	for _, gone := range []string{"issue\x00b", "issue\x00c"} {
		if c.Rows[gone] != nil {
			t.Errorf("tombstone %q kept", gone)
		}
	}
	for _, kept := range []string{"issue\x00a", "issue\x00d"} {
		if c.Rows[kept] == nil {
			t.Errorf("row %q pruned", kept)
		}
	}
	if d := c.Clients["live"].Desired; d["q-expired"] != nil || d["q-running"] == nil || d["q-late"] == nil || d["q-live"] == nil {
		t.Errorf("live client's desires after the prune: %v", d)
	}
	if c.Clients["gone"] != nil || c.Clients["gone-late"] == nil {
		t.Errorf("deleted clients after the prune: %v", c.Clients)
	}
	for _, h := range []string{"q-expired"} {
		if c.Queries[h] != nil {
			t.Errorf("query %s kept", h)
		}
	}
	// q-gone is still desired (its TTL is out, but not past the horizon)
	// by gone-late; the piped and internal queries stay.
	for _, h := range []string{"q-live", "q-running", "q-late", "q-gone", "q-piped", "internal"} {
		if c.Queries[h] == nil {
			t.Errorf("query %s pruned", h)
		}
	}
	if c.PrunedThrough != "13" {
		t.Errorf("PrunedThrough = %q; want 13", c.PrunedThrough)
	}
	// Every cookie not older than PrunedThrough catches up as before.
	for _, base := range []string{"13", "14", "15"} {
		if got := catchup(c, base); !slices.Equal(got, before[base]) {
			t.Errorf("catch-up from %s after the prune:\n%v\nbefore:\n%v", base, got, before[base])
		}
	}
	// Nothing past the horizon goes, however often it runs.
	if p := c.Prune("13", clock, nil); p.Rows+p.Desires+p.Clients != 0 {
		t.Errorf("a second prune at the same horizon dropped %+v", p)
	}
}

func TestCVR_PruneHorizon(t *testing.T) {
	c := New("g")
	t0 := time.Unix(1000, 0)
	if h := c.PruneHorizon(t0); h != "" {
		t.Errorf("horizon without marks %q", h)
	}
	for i, v := range []string{"11", "11", "12", "13"} {
		c.Version = v
		c.MarkVersion(t0.Add(time.Duration(i) * time.Minute))
	}
	tests := []struct {
		cutoff time.Duration
		want   string
	}{{-time.Second, ""}, {0, "11"}, {90 * time.Second, "11"}, {2 * time.Minute, "12"}, {time.Hour, "13"}}
	for _, tt := range tests {
		if got := c.PruneHorizon(t0.Add(tt.cutoff)); got != tt.want {
			t.Errorf("PruneHorizon(t0%+v) = %q; want %q", tt.cutoff, got, tt.want)
		}
	}
	// A prune keeps the last mark at or before its horizon.
	c.Prune("12", 0, nil)
	if got := c.PruneHorizon(t0.Add(2 * time.Minute)); got != "12" {
		t.Errorf("after a prune, PruneHorizon = %q; want 12", got)
	}
}
