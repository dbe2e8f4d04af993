package zql

import "testing"

// TestCollector_ReuseDedups: a view reuses one collector for its root
// rows (View.eval), so a reset one must still hold a row brought twice
// once.
func TestCollector_ReuseDedups(t *testing.T) {
	tb := &table{name: "issue"}
	a, b := &row{version: "1"}, &row{version: "2"}
	c := &collector{}
	for round := range 3 {
		c.reset()
		c.add(tb, "a", a)
		c.add(tb, "b", b)
		c.add(tb, "a", a)
		c.add(tb, "b", b)
		if len(c.rows) != 2 || c.rows[0].r != a || c.rows[1].r != b {
			t.Fatalf("round %d: collected %d rows (%v); want a, then b", round, len(c.rows), c.rows)
		}
		if c.deps != nil {
			t.Fatalf("round %d: a reset collector kept the deps an entry owns", round)
		}
		c.deps = append(c.deps, "dep")
	}
}
