package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pgtest"
)

// The durable-CVR tests (issue 5) watch what the real Zero client receives:
// driver.mjs, given "wire", reports each socket the client opens (with the
// baseCookie it connects with) and every frame it receives.

// cvrApp is an upstream seeded with the bench data and the suite's
// permissions, and a Postgres connection to it.
type cvrApp struct {
	upstream string
	node     string
	pg       *pgx.Conn
}

func newCVRApp(t *testing.T, issues int) *cvrApp {
	t.Helper()
	bin := pgBin(t)
	node := nodeBin(t)
	upstream := pgtest.NewDB(t, pgtest.Start(t))
	seedBench(t, bin, upstream, issues)
	deployPermissions(t, node, upstream, "app/schema.mjs")
	pg, err := pgx.Connect(context.Background(), upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	return &cvrApp{upstream: upstream, node: node, pg: pg}
}

// runEnv is runEnv for a's upstream.
func (a *cvrApp) runEnv(t *testing.T, port int, extra ...string) []string {
	return runEnv(t, a.upstream, port, extra...)
}

func (a *cvrApp) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := a.pg.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// openIssuesQuery is the suite's window: the 10 oldest open issues.
var openIssuesQuery = map[string]any{"table": "issue", "where": []any{"open", "=", true},
	"orderBy": [][]string{{"modified", "asc"}}, "limit": 10}

// openIssues is openIssuesQuery's rows in Postgres, as the client holds them.
func (a *cvrApp) openIssues(t *testing.T) json.RawMessage {
	t.Helper()
	return sqlRows(t, a.pg, `SELECT `+issueJSON+` FROM issue i WHERE i.open ORDER BY i.modified, i.id LIMIT 10`)
}

// windowIDs are the IDs of the issues in openIssuesQuery's window.
func (a *cvrApp) windowIDs(t *testing.T) []string {
	t.Helper()
	rows, err := a.pg.Query(context.Background(), `SELECT id FROM issue WHERE open ORDER BY modified, id LIMIT 10`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// openWired opens a client whose sockets and frames the driver reports.
func (d *zeroDriver) openWired(t *testing.T, client, server, userID, storageKey string) driverEvent {
	t.Helper()
	ack := d.do(t, map[string]any{"cmd": "open", "client": client, "server": server, "userID": userID,
		"auth": signToken(t, zeroSecret, userID, time.Hour), "storageKey": storageKey, "wire": true})
	if d.groups[client] == "" {
		d.groups[client] = ack.ClientGroupID
	}
	return ack
}

// wirePoke is one poke a client received, its parts merged.
type wirePoke struct {
	BaseCookie *string
	Cookie     string
	Rows       []wireRow
	Got        []json.RawMessage
	Desired    map[string][]json.RawMessage
	LMIDs      map[string]float64
}

type wireRow struct {
	Op        string         `json:"op"`
	TableName string         `json:"tableName"`
	Value     map[string]any `json:"value"`
	ID        map[string]any `json:"id"`
}

// rowIDs lists the poke's row patches as op:table:id, sorted.
func (p wirePoke) rowIDs() []string {
	var out []string
	for _, r := range p.Rows {
		id := r.ID
		if r.Op == "put" {
			id = r.Value
		}
		out = append(out, fmt.Sprintf("%s:%s:%v", r.Op, r.TableName, id["id"]))
	}
	slices.Sort(out)
	return out
}

// wireEvents is what a wired client saw from mark on: its sockets' opens
// (with their baseCookie) and closes, errors, and complete pokes.
type wireEvents struct {
	opens  []*string // baseCookie of each socket opened
	closes []json.RawMessage
	errors []json.RawMessage // error frames' bodies
	pokes  []wirePoke
	// notFound counts client-state-not-found events.
	notFound int
}

func (d *zeroDriver) wire(t *testing.T, client string, mark int) wireEvents {
	t.Helper()
	var w wireEvents
	var cur *wirePoke
	for _, ev := range d.since(mark) {
		if ev.Client != client {
			continue
		}
		switch ev.Event {
		case "client-state-not-found":
			w.notFound++
		case "ws":
			if ev.State == "open" {
				var r struct{ BaseCookie *string }
				if err := json.Unmarshal(ev.Reason, &r); err != nil {
					t.Fatal(err)
				}
				w.opens = append(w.opens, r.BaseCookie)
			} else {
				w.closes = append(w.closes, ev.Reason)
			}
		case "frame":
			switch ev.ID {
			case "error":
				w.errors = append(w.errors, ev.Rows)
			case "pokeStart":
				var b struct{ BaseCookie *string }
				if err := json.Unmarshal(ev.Rows, &b); err != nil {
					t.Fatal(err)
				}
				cur = &wirePoke{BaseCookie: b.BaseCookie, Desired: map[string][]json.RawMessage{}, LMIDs: map[string]float64{}}
			case "pokePart":
				if cur == nil {
					continue
				}
				var b struct {
					RowsPatch             []wireRow                    `json:"rowsPatch"`
					GotQueriesPatch       []json.RawMessage            `json:"gotQueriesPatch"`
					DesiredQueriesPatches map[string][]json.RawMessage `json:"desiredQueriesPatches"`
					LastMutationIDChanges map[string]float64           `json:"lastMutationIDChanges"`
				}
				if err := json.Unmarshal(ev.Rows, &b); err != nil {
					t.Fatal(err)
				}
				cur.Rows = append(cur.Rows, b.RowsPatch...)
				cur.Got = append(cur.Got, b.GotQueriesPatch...)
				for k, v := range b.DesiredQueriesPatches {
					cur.Desired[k] = append(cur.Desired[k], v...)
				}
				for k, v := range b.LastMutationIDChanges {
					cur.LMIDs[k] = v
				}
			case "pokeEnd":
				if cur == nil {
					continue
				}
				var b struct {
					Cookie string `json:"cookie"`
					Cancel bool   `json:"cancel"`
				}
				if err := json.Unmarshal(ev.Rows, &b); err != nil {
					t.Fatal(err)
				}
				if !b.Cancel {
					cur.Cookie = b.Cookie
					w.pokes = append(w.pokes, *cur)
				}
				cur = nil
			}
		}
	}
	return w
}

// lastCookie is the cookie of the last poke the client completed.
func (d *zeroDriver) lastCookie(t *testing.T, client string) string {
	t.Helper()
	w := d.wire(t, client, 0)
	if len(w.pokes) == 0 {
		t.Fatalf("client %s completed no poke", client)
	}
	return w.pokes[len(w.pokes)-1].Cookie
}

// errorKinds lists the kinds of the error frames.
func (w wireEvents) errorKinds() []string {
	var out []string
	for _, e := range w.errors {
		var b struct{ Kind, Message string }
		_ = json.Unmarshal(e, &b)
		out = append(out, b.Kind+": "+b.Message)
	}
	return out
}

// checkCatchup asserts that a client reconnected with cookie base and
// caught up with one poke from base carrying exactly the row changes want
// (op:table:id), no query changes, and no ClientNotFound or reload.
func checkCatchup(t *testing.T, w wireEvents, base string, want []string) {
	t.Helper()
	if w.notFound > 0 {
		t.Errorf("the client got client-state-not-found %d times", w.notFound)
	}
	for _, k := range w.errorKinds() {
		if strings.HasPrefix(k, "ClientNotFound") {
			t.Errorf("the client got %s", k)
		}
	}
	if len(w.opens) == 0 {
		t.Fatal("the client opened no socket")
	}
	for i, b := range w.opens {
		if b == nil {
			t.Errorf("socket %d connected without a baseCookie: a full reload", i)
		}
	}
	var caught *wirePoke
	for i, p := range w.pokes {
		if p.BaseCookie == nil {
			t.Errorf("poke %d to %s has no baseCookie: a full reload", i, p.Cookie)
			continue
		}
		if *p.BaseCookie == base && (len(p.Rows) > 0 || caught == nil) {
			caught = &w.pokes[i]
		}
	}
	if caught == nil {
		t.Fatalf("no poke from the client's cookie %s; pokes: %+v", base, w.pokes)
	}
	t.Logf("catch-up poke %s -> %s: rows %v, %d sockets opened", base, caught.Cookie, caught.rowIDs(), len(w.opens))
	if got := caught.rowIDs(); !slices.Equal(got, want) {
		t.Errorf("catch-up poke %s -> %s rows = %v; want exactly %v", base, caught.Cookie, got, want)
	}
	if len(caught.Got) > 0 || len(caught.Desired) > 0 {
		t.Errorf("catch-up poke resent queries: got %s, desired %v", caught.Got, caught.Desired)
	}
}

// want is openIssues for waitRowsEqual.
func (a *cvrApp) want(t *testing.T) func() json.RawMessage {
	return func() json.RawMessage { return a.openIssues(t) }
}
