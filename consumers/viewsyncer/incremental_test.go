package viewsyncer

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// issueRows applies a poke's issue row patches to rows (id: value JSON).
func issueRows(t *testing.T, rows map[string]string, p pokeSummary) map[string]string {
	t.Helper()
	for _, patch := range p.patches {
		body, ok := strings.CutPrefix(patch, "row ")
		if !ok {
			continue
		}
		var rp struct {
			Op        string         `json:"op"`
			TableName string         `json:"tableName"`
			ID        map[string]any `json:"id"`
			Value     map[string]any `json:"value"`
		}
		if err := json.Unmarshal([]byte(body), &rp); err != nil {
			t.Fatal(err)
		}
		if rp.TableName != "issue" {
			continue
		}
		switch rp.Op {
		case "put":
			b, _ := json.Marshal(rp.Value)
			rows[rp.Value["id"].(string)] = string(b)
		case "del":
			delete(rows, rp.ID["id"].(string))
		}
	}
	return rows
}

// TestServer_Incremental checks that replica advances update queries from
// the changed rows: one poke per client with exactly the row patches a
// fresh hydration would differ by, and no query re-run.
func TestServer_Incremental(t *testing.T) {
	e := newEnv(t, envOptions{issues: 40})
	window := `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true},"op":"="},"orderBy":[["modified","asc"]],"limit":5}`
	const groups = 5
	clients := make([]*tc, groups)
	rows := make([]map[string]string, groups)
	for i := range clients {
		clients[i] = connect(t, e, dialOpts{group: fmt.Sprint("inc", i), client: "c1", init: initFrame(testSchema, put("w", window, 0))})
		rows[i] = issueRows(t, map[string]string{}, clients[i].hydrated())
		if len(rows[i]) != 5 {
			t.Fatalf("hydration has %d issues; want 5", len(rows[i]))
		}
	}
	m := e.srv.metrics
	fallbacks := counterValue(t, m.fallbacks)
	first := slices.Sorted(maps.Keys(rows[0]))[0]

	cookies := make([]string, groups)
	fixed := func(s string) func() string { return func() string { return s } }
	for n, step := range []struct {
		stmt func() string
		// outside changes no group's rows: no group is poked, and the
		// next step's poke follows the same cookie.
		outside bool
	}{
		{stmt: fixed(fmt.Sprintf("UPDATE issue SET modified = 9000000000000 WHERE id = '%s'", first))}, // leaves; refill
		{stmt: fixed("UPDATE issue SET modified = 0 WHERE id = 'i0000040'")},                           // enters
		{stmt: fixed("UPDATE issue SET open = false WHERE id = 'i0000040'")},                           // leaves by filter
		{stmt: fixed("UPDATE issue SET title = 'renamed' WHERE id = 'i0000039'"), outside: true},
		{stmt: fixed("DELETE FROM issue WHERE id = '" + first + "'"), outside: true}, // left already
		{stmt: func() string { // leaves; refill
			return "DELETE FROM issue WHERE id = '" + slices.Sorted(maps.Keys(rows[0]))[0] + "'"
		}},
	} {
		stmt := step.stmt()
		hydrations := counterValue(t, m.hydrations)
		e.execSQL(stmt)
		for i, c := range clients {
			if step.outside {
				continue
			}
			p := c.poke()
			if countPrefix(p, "got ") != 0 || countPrefix(p, "desired ") != 0 {
				t.Errorf("%s: poke %v has query patches", stmt, p.patches)
			}
			if countPrefix(p, "row ") == 0 {
				t.Errorf("%s: poke has no row patch", stmt)
			}
			if cookies[i] != "" && (p.base == nil || *p.base != cookies[i]) {
				t.Errorf("%s: poke from %v; want from the last cookie %s", stmt, p.base, cookies[i])
			}
			cookies[i] = p.cookie
			rows[i] = issueRows(t, rows[i], p)
		}
		if got := counterValue(t, m.hydrations); got != hydrations {
			t.Errorf("%s: query hydrations went from %v to %v; want no query re-run", stmt, hydrations, got)
		}
		// A new group hydrates the same query from scratch.
		fresh := connect(t, e, dialOpts{group: fmt.Sprint("fresh", n), client: "c1", init: initFrame(testSchema, put("w", window, 0))})
		want := issueRows(t, map[string]string{}, fresh.hydrated())
		for i := range rows {
			if !maps.Equal(rows[i], want) {
				t.Errorf("after %s group %d holds %v; want %v", stmt, i, slices.Sorted(maps.Keys(rows[i])), slices.Sorted(maps.Keys(want)))
			}
		}
	}
	if got := counterValue(t, m.fallbacks); got != fallbacks {
		t.Errorf("update fallbacks = %v; want %v", got, fallbacks)
	}
}
