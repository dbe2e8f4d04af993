package viewsyncer

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetsync/jetsync/streams"
)

// syncedQueriesFile holds the ASTs the transcripts' app
// (testdata/spec/transcripts/app) returns for the synced queries the
// transcripts name: handleQueryRequest of @rocicorp/zero 1.9.0 run over
// app/queries.mjs, under Node 22, with the ids, names and args of their
// desired-query puts.
const syncedQueriesFile = "testdata/synced-queries.json"

// apiServer is the app's API server for tests, in Go: its query endpoint
// answers transforms from syncedQueriesFile, and its mutate endpoint runs
// the transcripts' mutators as the Node API server would, publishing each
// push's upstream transaction (rows, the clients lmid, an error result)
// into the env's stream before it answers.
type apiServer struct {
	t    testing.TB
	e    *env
	http *httptest.Server

	asts map[string]json.RawMessage // query id → AST

	mu sync.Mutex
	// faults answer the next requests to a path with a status.
	faults map[string][]int
	// lmids and results are the upstream clients and mutations rows.
	lmids   map[[2]string]int64
	results map[[2]string][]int64
	// requests records every request's path, header and body.
	requests []apiRequest
	// omitUserID answers without a userID.
	omitUserID bool
	// rejected answers every request with a token in it with its status.
	rejected map[string]int
	// hung holds the requests bearing a token in it until the caller
	// gives up or the test ends; hanging counts those held now, and
	// hungFor records how long each one was held.
	hung     map[string]bool
	hanging  int
	hungFor  []time.Duration
	released chan struct{}
}

// hang holds every request bearing token (hangRequest).
func (a *apiServer) hang(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hung == nil {
		a.hung = map[string]bool{}
	}
	a.hung[token] = true
}

// unhang stops holding requests bearing token.
func (a *apiServer) unhang(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.hung, token)
}

// hangRequest holds r, if its token is hung, until its caller gives up or
// the test ends; it reports whether it did.
func (a *apiServer) hangRequest(r *http.Request) bool {
	a.mu.Lock()
	if !a.hung[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")] {
		a.mu.Unlock()
		return false
	}
	a.hanging++
	a.mu.Unlock()
	start := time.Now()
	select {
	case <-r.Context().Done():
	case <-a.released:
	}
	a.mu.Lock()
	a.hanging--
	a.hungFor = append(a.hungFor, time.Since(start))
	a.mu.Unlock()
	return true
}

// reject answers every request bearing token with status (0: no more).
func (a *apiServer) reject(token string, status int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.rejected == nil {
		a.rejected = map[string]int{}
	}
	a.rejected[token] = status
}

type apiRequest struct {
	Path   string
	Header http.Header
	Body   json.RawMessage
}

func newAPIServer(t testing.TB, e *env) *apiServer {
	t.Helper()
	b, err := os.ReadFile(syncedQueriesFile)
	if err != nil {
		t.Fatal(err)
	}
	var qs []struct {
		ID  string          `json:"id"`
		AST json.RawMessage `json:"ast"`
	}
	if err := json.Unmarshal(b, &qs); err != nil {
		t.Fatal(err)
	}
	a := &apiServer{t: t, e: e, asts: map[string]json.RawMessage{}, faults: map[string][]int{},
		lmids: map[[2]string]int64{}, results: map[[2]string][]int64{}}
	for _, q := range qs {
		a.asts[q.ID] = q.AST
	}
	a.released = make(chan struct{})
	a.http = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.http.Close)
	// Before Close, which waits for the requests being held.
	t.Cleanup(func() { close(a.released) })
	return a
}

// fail makes the next n requests to path ("/query" or "/mutate") answer status.
func (a *apiServer) fail(path string, status, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for range n {
		a.faults[path] = append(a.faults[path], status)
	}
}

// reqs returns the requests to path so far.
func (a *apiServer) reqs(path string) []apiRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []apiRequest
	for _, r := range a.requests {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// apiUserOf is the token's user: a JWT's sub (unverified), an opaque token's
// text after "user:", or the userID cookie.
func apiUserOf(r *http.Request) (string, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		if c, err := r.Cookie("userID"); err == nil {
			return c.Value, true
		}
		return "", false
	}
	if u, ok := strings.CutPrefix(tok, "user:"); ok {
		return u, true
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	var claims struct {
		Sub string `json:"sub"`
	}
	if err != nil || json.Unmarshal(b, &claims) != nil {
		return "", false
	}
	return claims.Sub, true
}

func (a *apiServer) serve(w http.ResponseWriter, r *http.Request) {
	var body json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if a.hangRequest(r) {
		return
	}
	a.mu.Lock()
	a.requests = append(a.requests, apiRequest{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	var fault int
	if fs := a.faults[r.URL.Path]; len(fs) > 0 {
		fault, a.faults[r.URL.Path] = fs[0], fs[1:]
	}
	omit := a.omitUserID
	if st := a.rejected[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]; st != 0 && fault == 0 {
		fault = st
	}
	a.mu.Unlock()
	if fault != 0 {
		http.Error(w, fmt.Sprintf("injected %d", fault), fault)
		return
	}
	user, ok := apiUserOf(r)
	resp := map[string]any{}
	if ok && !omit {
		resp["userID"] = user
	}
	switch r.URL.Path {
	case "/query":
		var req []json.RawMessage
		var qs []struct {
			ID   string          `json:"id"`
			Name string          `json:"name"`
			Args json.RawMessage `json:"args"`
		}
		if json.Unmarshal(body, &req) != nil || len(req) != 2 || json.Unmarshal(req[1], &qs) != nil {
			http.Error(w, "bad transform request", http.StatusBadRequest)
			return
		}
		out := []any{}
		for _, q := range qs {
			a.mu.Lock()
			ast, ok := a.asts[q.ID]
			a.mu.Unlock()
			if !ok {
				out = append(out, map[string]any{"error": "app", "id": q.ID, "name": q.Name, "message": "no query " + q.Name})
				continue
			}
			out = append(out, map[string]any{"id": q.ID, "name": q.Name, "ast": ast})
		}
		resp["kind"], resp["queries"] = "QueryResponse", out
	case "/mutate":
		var push struct {
			ClientGroupID string `json:"clientGroupID"`
			Mutations     []struct {
				ID       int64             `json:"id"`
				ClientID string            `json:"clientID"`
				Name     string            `json:"name"`
				Args     []json.RawMessage `json:"args"`
			} `json:"mutations"`
		}
		if err := json.Unmarshal(body, &push); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out := []any{}
		for _, m := range push.Mutations {
			out = append(out, map[string]any{"id": map[string]any{"clientID": m.ClientID, "id": m.ID},
				"result": a.mutate(push.ClientGroupID, m.ClientID, m.ID, m.Name, m.Args)})
		}
		resp["kind"], resp["mutations"] = "MutateResponse", out
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// mutate runs one mutation as handleMutateRequest does, in one upstream
// transaction with the lmid bookkeeping (docs/protocol.md §8).
func (a *apiServer) mutate(group, client string, id int64, name string, args []json.RawMessage) any {
	var arg map[string]json.RawMessage
	if len(args) > 0 {
		_ = json.Unmarshal(args[0], &arg)
	}
	if name == "_zero_cleanupResults" {
		var c struct {
			ClientID string `json:"clientID"`
			UpTo     int64  `json:"upToMutationID"`
		}
		_ = json.Unmarshal(args[0], &c)
		key := [2]string{group, c.ClientID}
		a.mu.Lock()
		var dels []streams.Change
		var keep []int64
		for _, mid := range a.results[key] {
			if mid <= c.UpTo {
				dels = append(dels, streams.Change{Op: streams.OpDelete, Old: streams.Row{
					"clientGroupID": raw(group), "clientID": raw(c.ClientID), "mutationID": raw(mid)}})
			} else {
				keep = append(keep, mid)
			}
		}
		a.results[key] = keep
		a.mu.Unlock()
		if len(dels) > 0 {
			a.e.txTables(tableChanges{"zpeer_0", "mutations", dels})
		}
		return map[string]any{}
	}
	key := [2]string{group, client}
	a.mu.Lock()
	last := a.lmids[key]
	switch {
	case id <= last:
		a.mu.Unlock()
		return map[string]any{"error": "alreadyProcessed"}
	case id > last+1:
		a.mu.Unlock()
		return map[string]any{"error": "oooMutation"}
	}
	a.lmids[key] = id
	var parts []tableChanges
	var result any = map[string]any{}
	switch name {
	case "issue.setTitle":
		parts = append(parts, tableChanges{"public", "issue", []streams.Change{{Op: streams.OpUpdate,
			New: streams.Row{"id": arg["id"], "title": arg["title"], "modified": arg["modified"]}}}})
	case "failing":
		var why string
		_ = json.Unmarshal(arg["why"], &why)
		res := map[string]any{"error": "app", "message": "server rejected: " + why}
		result = res
		parts = append(parts, tableChanges{"zpeer_0", "mutations", []streams.Change{{Op: streams.OpInsert, New: streams.Row{
			"clientGroupID": raw(group), "clientID": raw(client), "mutationID": raw(id), "result": raw(res)}}}})
		a.results[key] = append(a.results[key], id)
	}
	a.mu.Unlock()
	parts = append(parts, tableChanges{"zpeer_0", "clients", []streams.Change{{Op: streams.OpInsert, New: streams.Row{
		"clientGroupID": raw(group), "clientID": raw(client), "lastMutationID": raw(id), "userID": raw(nil)}}}})
	a.e.txTables(parts...)
	return result
}
