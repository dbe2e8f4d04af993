package viewsyncer

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/jetsync/jetsync/streams"
)

// waitPatch reads c's pokes until one holds a patch containing s.
func waitPatch(c *tc, s string) pokeSummary {
	c.t.Helper()
	for {
		p := c.poke()
		for _, patch := range p.patches {
			if strings.Contains(patch, s) {
				return p
			}
		}
	}
}

// TestServer_PanicContained makes one group's advance panic: its socket
// gets an Internal error, the other group keeps its pokes, and the
// victim's client starts its group over when it returns.
func TestServer_PanicContained(t *testing.T) {
	e := newEnv(t, envOptions{issues: 20})
	good := `{"table":"issue","orderBy":[["id","asc"]],"limit":3}`
	victim := connect(t, e, dialOpts{group: "victim", client: "c1", init: initFrame(testSchema, put("good", good, 0))})
	victim.hydrated()
	other := connect(t, e, dialOpts{group: "bystander", client: "b1", init: initFrame(testSchema, put("good", good, 0))})
	other.hydrated()

	hook := func(id string) {
		if id == "victim" {
			panic("injected for the test")
		}
	}
	advanceHook.Store(&hook)
	t.Cleanup(func() { advanceHook.Store(nil) })
	e.execSQL("UPDATE issue SET title = 'after the panic' WHERE id = 'i0000001'")
	victim.expectError(kindInternal, "Internal error in the view-syncer (advance)", closeNormal)
	waitPatch(other, `"title":"after the panic"`)
	e.execSQL("UPDATE issue SET title = 'and after' WHERE id = 'i0000002'")
	waitPatch(other, `"title":"and after"`)

	advanceHook.Store(nil)
	c := connect(t, e, dialOpts{group: "victim", client: "c1", init: initFrame(testSchema, put("good", good, 0))})
	if p := c.hydrated(); !has(p, "got "+`{"hash":"good","op":"put"}`) {
		t.Errorf("the victim's group starting over got %v; want its query", p.patches)
	}
	e.execSQL("UPDATE issue SET title = 'back' WHERE id = 'i0000001'")
	waitPatch(c, `"title":"back"`)
	waitPatch(other, `"title":"back"`)
}

// TestServer_SQLiteLimits sends queries past SQLite's limits on an IN list
// and on ANDed conditions: each answers, keeps answering, and survives a
// reconnect from its cookie.
func TestServer_SQLiteLimits(t *testing.T) {
	e := newEnv(t, envOptions{issues: 20})
	vals := make([]string, 0, 40000)
	for k := range 40000 {
		vals = append(vals, fmt.Sprintf(`"i%07d"`, k*3)) // i0000003, 06, … and 39,993 others
	}
	in := `{"type":"simple","left":{"type":"column","name":"id"},"op":"IN","right":{"type":"literal","value":[` + strings.Join(vals, ",") + `]}}`
	conds := []string{in}
	for k := range 1500 {
		conds = append(conds, fmt.Sprintf(`{"type":"simple","left":{"type":"column","name":"title"},"op":"!=","right":{"type":"literal","value":"nope %d"}}`, k))
	}
	ast := `{"table":"issue","where":{"type":"and","conditions":[` + strings.Join(conds, ",") + `]},"orderBy":[["id","asc"]]}`

	c := connect(t, e, dialOpts{group: "big", client: "c1", init: initFrame(testSchema)})
	c.hydrated()
	c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("big", ast, 0) + `]}]`)
	p := waitPatch(c, `got {"hash":"big"`)
	var got []string
	for _, patch := range p.patches {
		if strings.HasPrefix(patch, "row ") && strings.Contains(patch, `"tableName":"issue"`) {
			got = append(got, patch)
		}
	}
	if len(got) != 6 { // i0000003 … i0000018
		t.Fatalf("got %d issue rows; want 6: %v", len(got), p.patches)
	}
	e.execSQL("UPDATE issue SET title = 'seen' WHERE id = 'i0000009'")
	p = waitPatch(c, `"title":"seen"`)

	c.ws.Close()
	c = connect(t, e, dialOpts{group: "big", client: "c1", base: p.cookie, init: initFrame("")})
	c.expect("connected")
	e.execSQL("UPDATE issue SET title = 'seen again' WHERE id = 'i0000012'")
	waitPatch(c, `"title":"seen again"`)
}

// TestServer_DeniedTableReadsNothing hydrates a query on a table the rules
// deny, which answers with no rows and must read none either.
func TestServer_DeniedTableReadsNothing(t *testing.T) {
	e := newEnv(t, envOptions{issues: 2000, secret: captureSecret})
	e.tx("zpeer", "permissions", streams.Change{Op: streams.OpUpdate, New: streams.Row{
		"lock": raw(true), "permissions": json.RawMessage(rules(map[string]string{"user": anyoneCan})), "hash": raw("h")}})
	read := func() float64 {
		var m dto.Metric
		if err := e.srv.metrics.rowsRead.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	c := connect(t, e, dialOpts{group: "denied", client: "c1", init: initFrame(testSchema)})
	c.hydrated()
	before := read()
	c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("issues", `{"table":"issue","orderBy":[["title","desc"]]}`, 0) + `]}]`)
	p := waitPatch(c, `got {"hash":"issues"`)
	for _, patch := range p.patches {
		if strings.HasPrefix(patch, "row ") {
			t.Errorf("synced %s from a denied table", patch)
		}
	}
	if n := read() - before; n != 0 {
		t.Errorf("hydrating the denied table read %v rows; want 0", n)
	}
}
