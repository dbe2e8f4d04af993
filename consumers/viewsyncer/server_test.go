package viewsyncer

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/jetsync/jetsync/streams"
)

// testSchema is the transcripts' client schema.
const testSchema = `{"tables":{"comment":{"columns":{"body":{"type":"string"},"created":{"type":"number"},"id":{"type":"string"},"issue_id":{"type":"string"}},"primaryKey":["id"]},"issue":{"columns":{"created":{"type":"number"},"id":{"type":"string"},"modified":{"type":"number"},"open":{"type":"boolean"},"owner_id":{"type":"string"},"title":{"type":"string"}},"primaryKey":["id"]},"issue_label":{"columns":{"issue_id":{"type":"string"},"label_id":{"type":"string"}},"primaryKey":["issue_id","label_id"]},"label":{"columns":{"id":{"type":"string"},"name":{"type":"string"}},"primaryKey":["id"]},"user":{"columns":{"id":{"type":"string"},"name":{"type":"string"}},"primaryKey":["id"]}}}`

// tc is a test client.
type tc struct {
	t  *testing.T
	ws *websocket.Conn
}

type dialOpts struct {
	path     string
	group    string
	client   string
	user     string
	base     string
	token    string
	init     string // initConnection frame for the header, or ""
	noParams bool
}

func connect(t *testing.T, e *env, o dialOpts) *tc {
	t.Helper()
	if o.path == "" {
		o.path = "/sync/v51/connect"
	}
	q := url.Values{}
	if !o.noParams {
		q.Set("clientGroupID", o.group)
		q.Set("clientID", o.client)
		q.Set("userID", o.user)
		q.Set("baseCookie", o.base)
		q.Set("ts", "1234.5")
		q.Set("lmid", "0")
		q.Set("wsid", "ws-"+o.client)
	}
	sp := secProtocol{AuthToken: o.token}
	if o.init != "" {
		sp.InitConnectionMessage = json.RawMessage(o.init)
	}
	proto, err := encodeSecProtocol(sp)
	if err != nil {
		t.Fatal(err)
	}
	return &tc{t: t, ws: dialWS(t, e, o.path, q, proto)}
}

func (c *tc) send(frame string) {
	c.t.Helper()
	if err := c.ws.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// next reads the next frame other than an unsolicited pong.
func (c *tc) next() (string, json.RawMessage) {
	c.t.Helper()
	for {
		tag, body := readFrame(c.t, c.ws)
		if tag != "pong" {
			return tag, body
		}
	}
}

func (c *tc) expect(tag string) json.RawMessage {
	c.t.Helper()
	got, body := readFrame(c.t, c.ws)
	if got != tag {
		c.t.Fatalf("got %s %s; want %s", got, body, tag)
	}
	return body
}

// poke reads one poke and summarizes it.
func (c *tc) poke() pokeSummary {
	c.t.Helper()
	var frames []json.RawMessage
	for {
		_ = c.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			c.t.Fatalf("read poke: %v", err)
		}
		tag, _ := splitFrame(c.t, data)
		if tag == "pong" && len(frames) == 0 {
			continue
		}
		if len(frames) == 0 && tag != "pokeStart" {
			c.t.Fatalf("got %s; want a poke", data)
		}
		frames = append(frames, data)
		if tag == "pokeEnd" {
			return summarize(c.t, frames)
		}
	}
}

// expectError reads an error frame and the close that follows it.
func (c *tc) expectError(kind, msgPrefix string, code int) {
	c.t.Helper()
	tag, body := c.next()
	var pe protocolError
	_ = json.Unmarshal(body, &pe)
	if tag != "error" || pe.Kind != kind || pe.Origin != "zeroCache" || !strings.HasPrefix(pe.Message, msgPrefix) {
		c.t.Fatalf("got %s %s; want error %s %q…", tag, body, kind, msgPrefix)
	}
	c.expectClose(code)
}

func (c *tc) expectClose(code int) {
	c.t.Helper()
	_ = c.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, data, err := c.ws.ReadMessage()
		if err == nil {
			if tag, _ := splitFrame(c.t, data); tag == "pong" {
				continue
			}
			c.t.Fatalf("got %s; want close %d", data, code)
		}
		if !websocket.IsCloseError(err, code) {
			c.t.Fatalf("close: %v; want code %d", err, code)
		}
		return
	}
}

// hydrated reads what a new group's first initConnection brings: the
// config poke and the poke at the replica's version.
func (c *tc) hydrated() pokeSummary {
	c.t.Helper()
	c.expect("connected")
	c.poke()
	return c.poke()
}

func initFrame(schema string, puts ...string) string {
	p := "[" + strings.Join(puts, ",") + "]"
	if schema == "" {
		return `["initConnection",{"desiredQueriesPatch":` + p + `}]`
	}
	return `["initConnection",{"desiredQueriesPatch":` + p + `,"clientSchema":` + schema + `}]`
}

func put(hash, ast string, ttl int) string {
	return fmt.Sprintf(`{"op":"put","hash":%q,"ast":%s,"ttl":%d}`, hash, ast, ttl)
}

func del(hash string) string { return fmt.Sprintf(`{"op":"del","hash":%q}`, hash) }

func has(s pokeSummary, patch string) bool {
	for _, p := range s.patches {
		if p == patch {
			return true
		}
	}
	return false
}

func countPrefix(s pokeSummary, prefix string) int {
	n := 0
	for _, p := range s.patches {
		if strings.HasPrefix(p, prefix) {
			n++
		}
	}
	return n
}

func TestServer_Handshake(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30})
	labels := `{"table":"label","orderBy":[["id","asc"]]}`

	t.Run("InitConnectionAsFirstFrame", func(t *testing.T) {
		c := connect(t, e, dialOpts{path: "/zero/sync/v51/connect", group: "g1", client: "c1"})
		c.expect("connected")
		c.send(initFrame(testSchema, put("q1", labels, 300000)))
		if p := c.poke(); p.base != nil || !has(p, `desired c1 {"hash":"q1","op":"put"}`) {
			t.Errorf("first poke = %+v; want the desired put from null", p)
		}
		p := c.poke()
		if !has(p, `got {"hash":"q1","op":"put"}`) || countPrefix(p, "row ") != 20 {
			t.Errorf("second poke = %+v; want got put and 20 labels", p)
		}
		c.send(`["ping",{}]`)
		c.expect("pong")
		c.send(`["closeConnection",[]]`)
		c.send(`["ping",{}]`)
		c.expect("pong")
	})

	t.Run("OlderSupportedVersion", func(t *testing.T) {
		c := connect(t, e, dialOpts{path: "/sync/v30/connect", group: "g2", client: "c1"})
		c.expect("connected")
	})

	t.Run("VersionNotSupported", func(t *testing.T) {
		c := connect(t, e, dialOpts{path: "/sync/v52/connect", group: "g3", client: "c1"})
		c.expectError(kindVersionNotSupported, "server is at sync protocol v51 and does not support v52", closeNormal)
	})

	t.Run("MissingParams", func(t *testing.T) {
		c := connect(t, e, dialOpts{noParams: true})
		c.expectClose(closeProtocol)
	})

	t.Run("NotASyncPath", func(t *testing.T) {
		resp, err := http.Get(e.http.URL + "/a/b/sync/v51/connect")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("status %d; want 404", resp.StatusCode)
		}
	})

	t.Run("BadFramesLeaveOthersAlone", func(t *testing.T) {
		other := connect(t, e, dialOpts{group: "g4", client: "other", init: initFrame(testSchema)})
		other.hydrated()
		for i, f := range []string{`not json`, `["nope",{}]`, `["ping"]`, `{"a":1}`, `["changeDesiredQueries",{"desiredQueriesPatch":[{"op":"put"}]}]`} {
			c := connect(t, e, dialOpts{group: "g4", client: fmt.Sprintf("bad%d", i), init: initFrame(testSchema)})
			c.expect("connected")
			c.poke() // a new client of an existing group: one catch-up
			c.send(f)
			c.expectError(kindInvalidMessage, "invalid message", closeNormal)
		}
		// other got a poke per client that joined, and still answers.
		other.send(`["ping",{}]`)
		for {
			tag, body := readFrame(t, other.ws)
			if tag == "pong" {
				break
			}
			if !strings.HasPrefix(tag, "poke") {
				t.Fatalf("other got %s %s", tag, body)
			}
		}
	})

	t.Run("UnknownTableInAST", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "g5", client: "c1", init: initFrame(testSchema, put("q", `{"table":"nope"}`, 0))})
		c.expect("connected")
		c.expectError(kindInternal, "table 'nope' is not one of: ", closeNormal)
	})

	t.Run("NewGroupWithoutSchema", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "g6", client: "c1", init: initFrame("")})
		c.expect("connected")
		c.expectError(kindInvalidConnectionRequest, "The initConnection message for a new client group must include client schema", closeNormal)
	})

	t.Run("SchemaNotReplicated", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "g7", client: "c1", init: initFrame(`{"tables":{"nope":{"columns":{"id":{"type":"string"}},"primaryKey":["id"]}}}`)})
		c.expect("connected")
		c.expectError(kindSchemaVersionNotSupported, `The "nope" table does not exist`, closeNormal)
	})

	t.Run("UnknownBaseCookie", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "g8", client: "c1", base: "5abcde", init: initFrame("")})
		c.expect("connected")
		c.expectError(kindClientNotFound, "", closeNormal)
	})

	t.Run("BaseCookieAhead", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "g9", client: "c1", init: initFrame(testSchema)})
		p := c.hydrated()
		c.ws.Close()
		c = connect(t, e, dialOpts{group: "g9", client: "c1", base: p.cookie + "0", init: initFrame("")})
		c.expect("connected")
		c.expectError(kindInvalidConnectionBaseCookie, "CVR is at version "+p.cookie, closeNormal)
	})

	t.Run("NewestConnectionWins", func(t *testing.T) {
		a := connect(t, e, dialOpts{group: "g10", client: "c1", init: initFrame(testSchema)})
		p := a.hydrated()
		b := connect(t, e, dialOpts{group: "g10", client: "c1", base: p.cookie, init: initFrame("")})
		a.expectClose(closeNormal)
		b.expect("connected")
		if q := b.poke(); q.cookie != p.cookie || *q.base != p.cookie || len(q.patches) != 0 {
			t.Errorf("reconnect poke = %+v; want an empty poke at %s", q, p.cookie)
		}
	})

	t.Run("PushWithoutMutateURL", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "g11", client: "c1", init: initFrame(testSchema)})
		c.hydrated()
		c.send(`["push",{"clientGroupID":"g11","mutations":[{"type":"custom","id":1,"clientID":"c1","name":"m","args":[null],"timestamp":1}],"pushVersion":1,"timestamp":1,"requestID":"r"}]`)
		c.expectError(kindInvalidPush, "A ZERO_MUTATE_URL must be set", closeNormal)
	})
}

func TestServer_SlowClientIsClosed(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30})
	e.srv.cfg.MaxQueueBytes = 2000
	c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema, put("q", `{"table":"issue"}`, 0))})
	// The hydration does not fit in the queue: the client is closed
	// without an error, so that it reconnects and catches up.
	for {
		_ = c.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, _, err := c.ws.ReadMessage(); err != nil {
			if !websocket.IsCloseError(err, websocket.CloseTryAgainLater) {
				t.Fatalf("close: %v; want %d", err, websocket.CloseTryAgainLater)
			}
			return
		}
	}
}

func TestServer_OversizeFrame(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10})
	e.srv.cfg.MaxPayloadBytes = 1000
	c := connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema)})
	c.hydrated()
	c.send(`["ping",{"pad":"` + strings.Repeat("x", 2000) + `"}]`)
	c.expectClose(websocket.CloseMessageTooBig)
}

func TestServer_Auth(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, secret: captureSecret})
	sign := func(claims jwt.MapClaims, alg jwt.SigningMethod) string {
		s, err := jwt.NewWithClaims(alg, claims).SignedString([]byte(captureSecret))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	now := time.Now().Unix()
	tests := []struct {
		name, user, token string
		kind, msg         string
	}{
		{"Valid", "u1", sign(jwt.MapClaims{"sub": "u1", "exp": now + 60}, jwt.SigningMethodHS256), "", ""},
		{"HS512", "u1", sign(jwt.MapClaims{"sub": "u1"}, jwt.SigningMethodHS512), "", ""},
		{"LoggedOut", "", "", "", ""},
		{"Expired", "u1", sign(jwt.MapClaims{"sub": "u1", "exp": now - 60}, jwt.SigningMethodHS256),
			kindAuthInvalidated, `Failed to decode auth token: JWTExpired: "exp" claim timestamp check failed`},
		{"WrongSubject", "u2", sign(jwt.MapClaims{"sub": "u1"}, jwt.SigningMethodHS256),
			kindAuthInvalidated, `Failed to decode auth token: JWTClaimValidationFailed: unexpected "sub" claim value`},
		{"Garbage", "u1", "abc", kindAuthInvalidated, "Failed to decode auth token: JWSInvalid"},
		{"TokenWithoutUser", "", sign(jwt.MapClaims{"sub": "u1"}, jwt.SigningMethodHS256),
			kindUnauthorized, "Authenticated connections require a userID."},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := connect(t, e, dialOpts{group: fmt.Sprintf("auth%d", i), client: "c1", user: tt.user, token: tt.token, init: initFrame(testSchema)})
			if tt.kind == "" {
				c.hydrated()
				return
			}
			c.expectError(tt.kind, tt.msg, closeAuth)
		})
	}

	t.Run("GroupPinnedToUser", func(t *testing.T) {
		a := connect(t, e, dialOpts{group: "pinned", client: "c1", user: "u1", token: sign(jwt.MapClaims{"sub": "u1"}, jwt.SigningMethodHS256), init: initFrame(testSchema)})
		a.hydrated()
		b := connect(t, e, dialOpts{group: "pinned", client: "c2", user: "u2", token: sign(jwt.MapClaims{"sub": "u2"}, jwt.SigningMethodHS256), init: initFrame("")})
		b.expectError(kindUnauthorized, "Client groups are pinned to a single userID", closeAuth)
	})
}

func TestServer_Rows(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30})
	issue7 := `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"i0000007"},"op":"="},"related":[{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"},"system":"client"}]}`
	owner := `{"table":"user","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"u000008"},"op":"="}}`

	t.Run("RefcountedAcrossQueries", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "rows", client: "c1", init: initFrame(testSchema, put("a", issue7, 0), put("b", owner, 0))})
		c.expect("connected")
		c.poke()
		p := c.poke()
		if countPrefix(p, "row ") != 2 {
			t.Fatalf("hydration = %v; want issue i0000007 and user u000008 once", p.patches)
		}
		// Dropping a keeps the user, which b holds.
		c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + del("a") + `]}]`)
		c.poke()
		p = c.poke()
		if !has(p, `got {"hash":"a","op":"del"}`) || !has(p, `row {"id":{"id":"i0000007"},"op":"del","tableName":"issue"}`) || countPrefix(p, "row ") != 1 {
			t.Errorf("removing a = %v; want got del a and only the issue deleted", p.patches)
		}
		c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + del("b") + `]}]`)
		c.poke()
		p = c.poke()
		if !has(p, `row {"id":{"id":"u000008"},"op":"del","tableName":"user"}`) {
			t.Errorf("removing b = %v; want the user deleted", p.patches)
		}
	})

	t.Run("NoPokeForUnrelatedWrite", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "adv", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
		c.expect("connected")
		c.poke()
		first := c.poke()
		// As zero-cache, no poke for a write that changed none of the
		// group's rows: the next one is for its own row, from the same
		// cookie.
		e.execSQL("UPDATE issue SET title = 'other' WHERE id = 'i0000008'")
		e.execSQL("UPDATE issue SET title = 'own' WHERE id = 'i0000007'")
		p := c.poke()
		if len(p.patches) != 1 || !strings.Contains(p.patches[0], "own") || *p.base != first.cookie || p.cookie <= first.cookie {
			t.Errorf("poke after an unrelated write, then one to the group's row = %+v; want that row's poke after %s", p, first.cookie)
		}
	})

	t.Run("LastMutationIDs", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "lm", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
		c.expect("connected")
		c.poke()
		c.poke()
		e.tx("zpeer_0", "clients", streams.Change{Op: streams.OpInsert, New: streams.Row{
			"clientGroupID": raw("lm"), "clientID": raw("c1"), "lastMutationID": raw(3), "userID": raw(nil)}},
			streams.Change{Op: streams.OpInsert, New: streams.Row{
				"clientGroupID": raw("other"), "clientID": raw("c9"), "lastMutationID": raw(5), "userID": raw(nil)}})
		p := c.poke()
		if strings.Join(p.patches, "|") != `lmid c1 3` {
			t.Errorf("poke = %v; want lastMutationIDChanges {c1: 3} only", p.patches)
		}
		// A new client of the group is caught up with every lmid.
		d := connect(t, e, dialOpts{group: "lm", client: "c2", init: initFrame("")})
		d.expect("connected")
		if p := d.poke(); !has(p, "lmid c1 3") {
			t.Errorf("catch-up = %v; want lmid c1 3", p.patches)
		}
	})
}

// badQueryCases are legacy queries zero-cache 1.9.0 refuses, with the
// error kind and the start of the message it sends before it closes the
// socket (e2e/badquery_test.go runs them against it). Where zero-cache
// fails with a TypeError of its own, jetsync names the column instead; a
// malformed AST gets jetsync's own message.
var badQueryCases = []struct{ name, ast, kind, prefix string }{
	{"UnknownTable", `{"table":"nope"}`, kindInternal, "table 'nope' is not one of: comment,issue,issue_label,label,user. Check the spelling"},
	{"UnknownWhereColumn", `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"nope"},"op":"=","right":{"type":"literal","value":1}}}`, kindInternal, `no such column: "nope"`},
	{"UnknownOrderByColumn", `{"table":"issue","orderBy":[["nope","asc"]]}`, kindInternal, `no such column: "nope"`},
	{"UnknownRelatedChildField", `{"table":"issue","related":[{"correlation":{"parentField":["owner_id"],"childField":["nope"]},"subquery":{"table":"user","alias":"owner"}}]}`, kindInternal, `no such column: "nope"`},
	{"UnknownRelatedParentField", `{"table":"issue","related":[{"correlation":{"parentField":["nope"],"childField":["id"]},"subquery":{"table":"user","alias":"owner"}}]}`, kindInternal, `no such column: "nope"`},
	{"UnknownRelatedTable", `{"table":"issue","related":[{"correlation":{"parentField":["owner_id"],"childField":["id"]},"subquery":{"table":"nope","alias":"owner"}}]}`, kindInternal, "table 'nope' is not one of"},
	{"UnknownExistsColumn", `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["id"],"childField":["nope"]},"subquery":{"table":"comment","alias":"zsubq_comments"}}}}`, kindInternal, `no such column: "nope"`},
	{"ExistsWithStart", `{"table":"issue","where":{"type":"correlatedSubquery","op":"EXISTS","related":{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"zsubq_comments","orderBy":[["id","asc"]],"start":{"row":{"id":"c"},"exclusive":true}}}}}`, kindInternal, "EXISTS subqueries must not have start"},
	{"UnknownOperator", `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"op":"~~","right":{"type":"literal","value":"x"}}}`, kindInvalidMessage, ""},
	{"NullInList", `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"op":"IN","right":{"type":"literal","value":["x",null]}}}`, kindInvalidMessage, ""},
	{"UnknownConditionType", `{"table":"issue","where":{"type":"xor","conditions":[]}}`, kindInvalidMessage, ""},
	{"NotAnAST", `[1,2,3]`, kindInvalidMessage, ""},
	// zero-cache fails it in SQLite at each hydration; jetsync before saving it.
	{"LikeTooLong", `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"title"},"op":"LIKE","right":{"type":"literal","value":"` + strings.Repeat("a", 50001) + `"}}}`, kindInternal, "LIKE or GLOB pattern too complex"},
}

// TestServer_BadQueries sends each bad query on a connection whose other
// query is synced: it gets its error frame and its socket closes, and
// nothing else suffers: another group keeps its pokes, and the client
// reconnecting from its cookie finds its group and its other query whole.
// A bad query in initConnection fails the same way.
func TestServer_BadQueries(t *testing.T) {
	e := newEnv(t, envOptions{issues: 20})
	good := `{"table":"issue","orderBy":[["id","asc"]],"limit":3}`
	other := connect(t, e, dialOpts{group: "bystander", client: "b1", init: initFrame(testSchema, put("good", good, 0))})
	other.hydrated()
	waitTitle := func(c *tc, title string) {
		t.Helper()
		for {
			p := c.poke()
			for _, patch := range p.patches {
				if strings.Contains(patch, `"title":"`+title+`"`) {
					return
				}
			}
		}
	}
	for i, bq := range badQueryCases {
		t.Run(bq.name, func(t *testing.T) {
			group := fmt.Sprint("bad", i)
			c := connect(t, e, dialOpts{group: group, client: "c1", init: initFrame(testSchema, put("good", good, 0))})
			p := c.hydrated()
			c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("bad", bq.ast, 0) + `]}]`)
			c.expectError(bq.kind, bq.prefix, closeNormal)

			title := fmt.Sprint("after ", bq.name)
			e.execSQL(fmt.Sprintf("UPDATE issue SET title = '%s' WHERE id = 'i0000001'", title))
			waitTitle(other, title)

			c = connect(t, e, dialOpts{group: group, client: "c1", base: p.cookie, init: initFrame("")})
			c.expect("connected")
			waitTitle(c, title)
			title += " again"
			e.execSQL(fmt.Sprintf("UPDATE issue SET title = '%s' WHERE id = 'i0000001'", title))
			waitTitle(c, title)
			waitTitle(other, title)

			n := connect(t, e, dialOpts{group: group + "-init", client: "c1", init: initFrame(testSchema, put("good", good, 0), put("bad", bq.ast, 0))})
			n.expect("connected")
			n.expectError(bq.kind, bq.prefix, closeNormal)
		})
	}
}
