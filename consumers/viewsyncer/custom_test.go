package viewsyncer

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// Synced queries of the transcripts' app (testdata/synced-queries.json).
const (
	labelsAllHash   = "1127s2j08bc4x"
	issue4Hash      = "39a8ln0msv92m"
	labelsAllPut    = `{"op":"put","hash":"1127s2j08bc4x","name":"labelsAll","args":[{}],"ttl":300000}`
	issue4Put       = `{"op":"put","hash":"39a8ln0msv92m","name":"issuesByIDs","args":[{"ids":["i0000004"]}],"ttl":300000}`
	unknownQueryPut = `{"op":"put","hash":"nope1","name":"nope","args":[1],"ttl":300000}`
)

// failure is a TransformFailed or PushFailed error body.
type failure struct {
	Kind        string            `json:"kind"`
	Origin      string            `json:"origin"`
	Reason      string            `json:"reason"`
	Status      int               `json:"status"`
	QueryIDs    []string          `json:"queryIDs"`
	MutationIDs []json.RawMessage `json:"mutationIDs"`
}

// expectFailure reads a TransformFailed or PushFailed and the close.
func (c *tc) expectFailure(kind string, status, code int) failure {
	c.t.Helper()
	tag, body := c.next()
	var f failure
	_ = json.Unmarshal(body, &f)
	if tag != "error" || f.Kind != kind || f.Origin != "zeroCache" || f.Reason != "http" || f.Status != status {
		c.t.Fatalf("got %s %s; want error %s http %d", tag, body, kind, status)
	}
	c.expectClose(code)
	return f
}

// alive checks that c is still served.
func (c *tc) alive() {
	c.t.Helper()
	c.send(`["ping",{}]`)
	c.expect("pong")
}

func jwtFor(t *testing.T, sub string, iat int64) string {
	t.Helper()
	return signJWT(t, jwt.SigningMethodHS256, []byte(captureSecret), "", jwt.MapClaims{"sub": sub, "iat": iat, "exp": time.Now().Unix() + 3600})
}

func customPush(group, client string, id int, name, arg string) string {
	return fmt.Sprintf(`["push",{"clientGroupID":%q,"mutations":[{"type":"custom","id":%d,"clientID":%q,"name":%q,"args":[%s],"timestamp":1}],"pushVersion":1,"timestamp":1,"requestID":"r%d"}]`,
		group, id, client, name, arg, id)
}

func TestServer_SyncedQueries(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30, secret: captureSecret, api: true})
	token := jwtFor(t, "u1", time.Now().Unix())

	t.Run("TransformError", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "sq1", client: "c1", user: "u1", token: token, init: initFrame(testSchema, labelsAllPut, unknownQueryPut)})
		c.expect("connected")
		c.poke()
		body := c.expect("transformError")
		var errs []map[string]any
		if err := json.Unmarshal(body, &errs); err != nil || len(errs) != 1 || errs[0]["id"] != "nope1" || errs[0]["error"] != "app" {
			t.Fatalf("transformError %s; want the app error of nope1", body)
		}
		p := c.poke()
		if !has(p, `got {"hash":"`+labelsAllHash+`","op":"put"}`) || has(p, `got {"hash":"nope1","op":"put"}`) {
			t.Errorf("poke %v; want labelsAll got, and not nope1", p.patches)
		}
		c.alive()
	})

	t.Run("TransformFailed", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "sq2", client: "c1", user: "u1", token: token, init: initFrame(testSchema, labelsAllPut)})
		c.hydrated()
		e.api.fail("/query", 500, 4)
		c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + issue4Put + `]}]`)
		c.poke() // the desired put
		f := c.expectFailure("TransformFailed", 500, closeNormal)
		if len(f.QueryIDs) != 1 || f.QueryIDs[0] != issue4Hash {
			t.Errorf("queryIDs = %v; want [%s]", f.QueryIDs, issue4Hash)
		}
		// The connection sent away transforms no more: a maintenance round
		// that retried through it would cache an answer the next group
		// with the same token gets instead of its own transform.
		time.Sleep(4 * evictInterval)
		n := 0
		for _, r := range e.api.reqs("/query") {
			if strings.Contains(string(r.Body), issue4Hash) {
				n++
			}
		}
		if n != 4 {
			t.Errorf("%d transforms of %s; want the 4 attempts of the one that failed", n, issue4Hash)
		}
	})

	t.Run("TransformUnauthorized", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "sq3", client: "c1", user: "u1", token: token, init: initFrame(testSchema, labelsAllPut)})
		c.hydrated()
		e.api.fail("/query", 401, 1)
		c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + issue4Put + `]}]`)
		c.poke()
		c.expectFailure("TransformFailed", 401, closeAuth)
	})

	t.Run("ValidationUnauthorized", func(t *testing.T) {
		e.api.fail("/query", 403, 1)
		c := connect(t, e, dialOpts{group: "sq4", client: "c1", user: "u1", token: token, init: initFrame(testSchema, labelsAllPut)})
		c.expect("connected")
		c.expectFailure("TransformFailed", 403, closeAuth) // before any poke
	})

	t.Run("TransformedASTDoesNotCompile", func(t *testing.T) {
		// The API server answers with an AST over a table the replica lacks:
		// the connection that asked gets zero-cache's Internal error, and
		// another group stays served.
		other := connect(t, e, dialOpts{group: "sq8", client: "c1", user: "u1", token: token, init: initFrame(testSchema, labelsAllPut)})
		other.hydrated()
		e.api.mu.Lock()
		e.api.asts["badast1"] = json.RawMessage(`{"table":"nope"}`)
		e.api.mu.Unlock()
		c := connect(t, e, dialOpts{group: "sq7", client: "c1", user: "u1", token: token, init: initFrame(testSchema, labelsAllPut)})
		c.hydrated()
		c.send(`["changeDesiredQueries",{"desiredQueriesPatch":[{"op":"put","hash":"badast1","name":"bad","args":[],"ttl":300000}]}]`)
		// Within a deadline: keep-alive pongs would keep a plain read waiting.
		for deadline := time.Now().Add(20 * time.Second); ; {
			if time.Now().After(deadline) {
				t.Fatal("no error within 20 s: the query hangs")
			}
			tag, body := readFrame(t, c.ws)
			if tag != "error" {
				continue // the desired put's poke, pongs
			}
			var pe protocolError
			if err := json.Unmarshal(body, &pe); err != nil || pe.Kind != kindInternal || !strings.HasPrefix(pe.Message, "table 'nope' is not one of: ") {
				t.Fatalf("error %s; want Internal, table 'nope' is not one of: …", body)
			}
			c.expectClose(closeNormal)
			break
		}
		other.alive()
	})

	t.Run("PinnedUser", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "sq5", client: "c1", user: "u1", token: token, init: initFrame(testSchema, labelsAllPut)})
		c.hydrated()
		other := connect(t, e, dialOpts{group: "sq5", client: "c2", user: "u2", token: jwtFor(t, "u2", time.Now().Unix()), init: initFrame("")})
		other.expectError(kindUnauthorized, "Client groups are pinned", closeAuth)
		c.alive()
	})

	t.Run("UpdateAuthRetransforms", func(t *testing.T) {
		c := connect(t, e, dialOpts{group: "sq6", client: "c1", user: "u1", token: token, init: initFrame(testSchema, labelsAllPut)})
		c.hydrated()
		fresh := jwtFor(t, "u1", time.Now().Unix()+1)
		c.send(`["updateAuth",{"auth":"` + fresh + `"}]`)
		polltest.Until(t, 10*time.Second, "a transform with the new token", func() bool {
			for _, r := range e.api.reqs("/query") {
				if r.Header.Get("Authorization") == "Bearer "+fresh && strings.Contains(string(r.Body), labelsAllHash) {
					return true
				}
			}
			return false
		})
		c.alive()
		// A refused token fails the connection.
		newer := jwtFor(t, "u1", time.Now().Unix()+2)
		e.api.reject(newer, 401)
		c.send(`["updateAuth",{"auth":"` + newer + `"}]`)
		c.expectFailure("TransformFailed", 401, closeAuth)
	})
}

func TestServer_OpaqueToken(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, api: true})
	c := connect(t, e, dialOpts{group: "op1", client: "c1", user: "u1", token: "user:u1", init: initFrame(testSchema, labelsAllPut)})
	p := c.hydrated()
	if !has(p, `got {"hash":"`+labelsAllHash+`","op":"put"}`) {
		t.Errorf("poke %v; want labelsAll got", p.patches)
	}
	rs := e.api.reqs("/query")
	if len(rs) == 0 || rs[0].Header.Get("Authorization") != "Bearer user:u1" || string(rs[0].Body) != `["transform",[]]` {
		t.Errorf("first query request %+v; want the validation with the opaque token", rs)
	}
}

func TestServer_Push(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30, secret: captureSecret, api: true})
	token := jwtFor(t, "u1", time.Now().Unix())
	hydrated := func(t *testing.T, group string) *tc {
		c := connect(t, e, dialOpts{group: group, client: "c1", user: "u1", token: token, init: initFrame(testSchema, issue4Put)})
		c.hydrated()
		return c
	}

	t.Run("Confirmed", func(t *testing.T) {
		c := hydrated(t, "pu1")
		c.send(customPush("pu1", "c1", 1, "issue.setTitle", `{"id":"i0000004","title":"pushed","modified":4.5}`))
		p := c.poke()
		if !has(p, `lmid c1 1`) || countPrefix(p, `row {"op":"put","tableName":"issue"`) != 1 {
			t.Errorf("poke %v; want lmid 1 and the issue in one poke", p.patches)
		}
		c.send(customPush("pu1", "c1", 2, "failing", `{"why":"test"}`))
		p = c.poke()
		want := `mutation {"mutation":{"id":{"clientID":"c1","id":2},"result":{"error":"app","message":"server rejected: test"}},"op":"put"}`
		if !has(p, `lmid c1 2`) || !has(p, want) {
			t.Errorf("poke %v; want lmid 2 and %s", p.patches, want)
		}
		c.send(`["ackMutationResponses",{"clientID":"c1","id":2}]`)
		p = c.poke()
		if !has(p, `mutation {"id":{"clientID":"c1","id":2},"op":"del"}`) {
			t.Errorf("poke %v; want the result's del", p.patches)
		}
	})

	t.Run("PushFailed", func(t *testing.T) {
		c := hydrated(t, "pu2")
		e.api.fail("/mutate", 500, 4)
		c.send(customPush("pu2", "c1", 1, "issue.setTitle", `{"id":"i0000004","title":"x","modified":1}`))
		f := c.expectFailure("PushFailed", 500, closeNormal)
		if len(f.MutationIDs) != 1 || string(f.MutationIDs[0]) != `{"clientID":"c1","id":1}` {
			t.Errorf("mutationIDs = %s; want c1's 1", f.MutationIDs)
		}
	})

	t.Run("PushUnauthorized", func(t *testing.T) {
		c := hydrated(t, "pu3")
		e.api.fail("/mutate", 401, 1)
		c.send(customPush("pu3", "c1", 1, "issue.setTitle", `{"id":"i0000004","title":"x","modified":1}`))
		c.expectFailure("PushFailed", 401, closeAuth)
	})

	t.Run("CRUD", func(t *testing.T) {
		c := hydrated(t, "pu4")
		c.send(`["push",{"clientGroupID":"pu4","mutations":[{"type":"crud","id":1,"clientID":"c1","name":"_zero_crud","args":[{"ops":[]}],"timestamp":1}],"pushVersion":1,"timestamp":1,"requestID":"r"}]`)
		c.expectError(kindInvalidPush, "Support for legacy CRUD mutations is disabled", closeNormal)
	})

	t.Run("OtherGroup", func(t *testing.T) {
		c := hydrated(t, "pu5")
		c.send(customPush("elsewhere", "c1", 1, "failing", `{}`))
		c.expectError(kindInvalidPush, `clientGroupID in mutation "elsewhere" does not match`, closeNormal)
	})
}

// TestServer_AuthMaintenance checks the periodic revalidation (docs/protocol.md §13):
// a client whose token the API server now refuses is failed alone, the
// group's other client keeps syncing; a transient failure fails nobody.
func TestServer_AuthMaintenance(t *testing.T) {
	e := newEnv(t, envOptions{issues: 10, secret: captureSecret, api: true, revalidate: 300 * time.Millisecond, retransform: 400 * time.Millisecond})
	t1, t2 := jwtFor(t, "u1", time.Now().Unix()), jwtFor(t, "u1", time.Now().Unix()+1)
	a := connect(t, e, dialOpts{group: "am1", client: "c1", user: "u1", token: t1, init: initFrame(testSchema, issue4Put)})
	a.hydrated()
	b := connect(t, e, dialOpts{group: "am1", client: "c2", user: "u1", token: t2, init: initFrame("", issue4Put)})
	b.expect("connected")
	b.poke()
	a.poke() // c2's desired query
	polltest.Until(t, 10*time.Second, "c2's transform", func() bool {
		for _, r := range e.api.reqs("/query") {
			if r.Header.Get("Authorization") == "Bearer "+t2 && strings.Contains(string(r.Body), issue4Hash) {
				return true
			}
		}
		return false
	})

	// A transient failure defers maintenance: nobody is failed.
	e.api.fail("/query", 500, 8)
	polltest.Until(t, 10*time.Second, "the 500s to be served", func() bool {
		e.api.mu.Lock()
		defer e.api.mu.Unlock()
		return len(e.api.faults["/query"]) == 0
	})
	a.alive()
	b.alive()

	e.api.reject(t2, 401)
	b.expectFailure("TransformFailed", 401, closeAuth)
	e.tx("public", "issue", streams.Change{Op: streams.OpUpdate, New: streams.Row{"id": raw("i0000004"), "title": raw("still synced")}})
	if p := a.poke(); countPrefix(p, `row {"op":"put","tableName":"issue"`) != 1 {
		t.Errorf("poke %v; want the issue", p.patches)
	}
	a.alive()
}
