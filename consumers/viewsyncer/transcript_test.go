package viewsyncer

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"
)

const transcriptDir = "../../testdata/spec/transcripts"

// record is one line of a transcript (transcripts/README.md).
type record struct {
	Conn        int               `json:"conn"`
	Dir         string            `json:"dir"`
	Msg         json.RawMessage   `json:"msg"`
	Path        string            `json:"path"`
	Params      map[string]string `json:"params"`
	SecProtocol json.RawMessage   `json:"secProtocol"`
	Text        string            `json:"text"`
	SQL         string            `json:"sql"`
	By          string            `json:"by"`
	Code        int               `json:"code"`
}

func loadTranscript(t *testing.T, name string) []record {
	t.Helper()
	f, err := os.Open(filepath.Join(transcriptDir, name+".jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []record
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// replayer drives a transcript's client side against an env and checks the
// server's frames by issue 4's rules: connected, error and pong frame for
// frame; each poke's patches as a multiset; cookies strictly increasing and
// chained, mapped from the capture's cookies to ours.
type replayer struct {
	t       *testing.T
	e       *env
	conns   map[int]*client
	cookies map[string]string // capture cookie → ours
}

type client struct {
	ws       *websocket.Conn
	expected []json.RawMessage
	closed   bool
	cookie   *string // our last cookie on this connection
}

func replay(t *testing.T, e *env, name string) {
	t.Helper()
	r := &replayer{t: t, e: e, conns: map[int]*client{}, cookies: map[string]string{}}
	recs := loadTranscript(t, name)
	for i, rec := range recs {
		switch rec.Dir {
		case "open":
			r.conns[rec.Conn] = r.dial(rec)
		case "up":
			c := r.conns[rec.Conn]
			r.check(c)
			if err := c.ws.WriteMessage(websocket.TextMessage, rec.Msg); err != nil {
				t.Fatalf("record %d: send: %v", i, err)
			}
		case "down":
			c := r.conns[rec.Conn]
			c.expected = append(c.expected, rec.Msg)
		case "note":
			if rec.SQL == "" {
				continue
			}
			// A proxy cut (1006) recorded after the write it let through
			// happened before it.
			for _, next := range recs[i+1:] {
				if next.Dir != "close" || next.Code != websocket.CloseAbnormalClosure {
					break
				}
				if c := r.conns[next.Conn]; !c.closed {
					r.check(c)
					c.closed = true
					c.ws.NetConn().Close()
				}
			}
			r.checkAll()
			e.execSQL(rec.SQL)
		case "close":
			c := r.conns[rec.Conn]
			if c.closed {
				continue
			}
			r.check(c)
			c.closed = true
			if rec.By == "client" {
				_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(rec.Code, ""), time.Now().Add(time.Second))
				c.ws.Close()
				continue
			}
			r.expectClose(c, rec.Code)
		}
	}
	r.checkAll()
}

func (r *replayer) checkAll() {
	r.t.Helper()
	for _, c := range r.conns {
		if !c.closed {
			r.check(c)
		}
	}
}

// resign re-signs a capture's JWT, which has expired, with the same claims.
func resign(t *testing.T, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return token
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	claims := jwt.MapClaims{}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	claims["iat"], claims["exp"] = now, now+3600
	// A token the capture signed with another secret stays badly signed.
	secret := captureSecret
	_, err = jwt.Parse(token, func(*jwt.Token) (any, error) { return []byte(captureSecret), nil }, jwt.WithoutClaimsValidation())
	if err != nil {
		secret = "not-" + captureSecret
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (r *replayer) dial(rec record) *client {
	r.t.Helper()
	var sp secProtocol
	if err := json.Unmarshal(rec.SecProtocol, &sp); err != nil {
		r.t.Fatal(err)
	}
	if sp.AuthToken != "" {
		sp.AuthToken = resign(r.t, sp.AuthToken)
	}
	proto, err := encodeSecProtocol(sp)
	if err != nil {
		r.t.Fatal(err)
	}
	q := url.Values{}
	for k, v := range rec.Params {
		if k == "baseCookie" && v != "" {
			ours, ok := r.cookies[v]
			if !ok {
				r.t.Fatalf("baseCookie %s was never sent", v)
			}
			v = ours
		}
		q.Set(k, v)
	}
	return &client{ws: dialWS(r.t, r.e, rec.Path, q, proto)}
}

func dialWS(t testing.TB, e *env, path string, q url.Values, proto string) *websocket.Conn {
	t.Helper()
	u := "ws" + strings.TrimPrefix(e.http.URL, "http") + path + "?" + q.Encode()
	d := websocket.Dialer{Subprotocols: []string{proto}, HandshakeTimeout: 5 * time.Second}
	ws, resp, err := d.Dial(u, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	if got := resp.Header.Get("Sec-Websocket-Protocol"); got != proto {
		t.Errorf("Sec-WebSocket-Protocol echoed %q; want %q", got, proto)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func readFrame(t testing.TB, ws *websocket.Conn) (string, json.RawMessage) {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, data, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return splitFrame(t, data)
}

func splitFrame(t testing.TB, data []byte) (string, json.RawMessage) {
	t.Helper()
	var f []json.RawMessage
	if err := json.Unmarshal(data, &f); err != nil || len(f) != 2 {
		t.Fatalf("bad frame %s", data)
	}
	var tag string
	if err := json.Unmarshal(f[0], &tag); err != nil {
		t.Fatalf("bad frame %s", data)
	}
	return tag, f[1]
}

// check reads the server frames the transcript expects so far on c.
func (r *replayer) check(c *client) {
	r.t.Helper()
	for len(c.expected) > 0 {
		tag, body := splitFrame(r.t, c.expected[0])
		if tag == "pokeStart" {
			end := 1
			for ; end < len(c.expected); end++ {
				if t, _ := splitFrame(r.t, c.expected[end]); t == "pokeEnd" {
					break
				}
			}
			if end == len(c.expected) {
				return // the rest of the poke is still to come
			}
			want := c.expected[:end+1]
			c.expected = c.expected[end+1:]
			r.checkPoke(c, want)
			continue
		}
		c.expected = c.expected[1:]
		gotTag, gotBody := readFrame(r.t, c.ws)
		for gotTag == "pong" && tag != "pong" {
			gotTag, gotBody = readFrame(r.t, c.ws) // unsolicited keep-alive
		}
		if gotTag != tag {
			r.t.Fatalf("got %s %s; want %s %s", gotTag, gotBody, tag, body)
		}
		switch tag {
		case "connected":
			var g, w connectedBody
			_ = json.Unmarshal(gotBody, &g)
			_ = json.Unmarshal(body, &w)
			if g.WSID != w.WSID || g.Timestamp == 0 {
				r.t.Errorf("connected = %s; want wsid %s and a timestamp", gotBody, w.WSID)
			}
		case "error":
			var g, w protocolError
			_ = json.Unmarshal(gotBody, &g)
			_ = json.Unmarshal(body, &w)
			if g.Kind != w.Kind || g.Origin != w.Origin || !strings.HasPrefix(g.Message, prefix(w.Message)) {
				r.t.Errorf("error = %s; want %s", gotBody, body)
			}
		default:
			if !jsonEqual(gotBody, body) {
				r.t.Errorf("%s = %s; want %s", tag, gotBody, body)
			}
		}
	}
}

func prefix(s string) string {
	if i := strings.IndexAny(s, ":("); i > 0 {
		return s[:i]
	}
	return s
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	_ = json.Unmarshal(a, &x)
	_ = json.Unmarshal(b, &y)
	return fmt.Sprint(x) == fmt.Sprint(y)
}

// pokeSummary is a poke with its patches as sorted multisets.
type pokeSummary struct {
	base    *string
	cookie  string
	patches []string
}

func summarize(t testing.TB, frames []json.RawMessage) pokeSummary {
	t.Helper()
	var s pokeSummary
	for _, f := range frames {
		tag, body := splitFrame(t, f)
		switch tag {
		case "pokeStart":
			var b pokeStartBody
			if err := json.Unmarshal(body, &b); err != nil {
				t.Fatal(err)
			}
			s.base = b.BaseCookie
		case "pokeEnd":
			var b pokeEndBody
			if err := json.Unmarshal(body, &b); err != nil {
				t.Fatal(err)
			}
			s.cookie = b.Cookie
		case "pokePart":
			var b struct {
				LastMutationIDChanges map[string]json.RawMessage   `json:"lastMutationIDChanges"`
				DesiredQueriesPatches map[string][]json.RawMessage `json:"desiredQueriesPatches"`
				GotQueriesPatch       []json.RawMessage            `json:"gotQueriesPatch"`
				MutationsPatch        []json.RawMessage            `json:"mutationsPatch"`
				RowsPatch             []json.RawMessage            `json:"rowsPatch"`
			}
			if err := json.Unmarshal(body, &b); err != nil {
				t.Fatal(err)
			}
			for c, v := range b.LastMutationIDChanges {
				s.patches = append(s.patches, "lmid "+c+" "+canon(v))
			}
			for c, ps := range b.DesiredQueriesPatches {
				for _, p := range ps {
					s.patches = append(s.patches, "desired "+c+" "+canon(p))
				}
			}
			for _, p := range b.GotQueriesPatch {
				s.patches = append(s.patches, "got "+canon(p))
			}
			for _, p := range b.RowsPatch {
				s.patches = append(s.patches, "row "+rowCanon(t, p))
			}
			for _, p := range b.MutationsPatch {
				s.patches = append(s.patches, "mutation "+canon(p))
			}
		default:
			t.Fatalf("%s inside a poke", tag)
		}
	}
	sort.Strings(s.patches)
	return s
}

func canon(b json.RawMessage) string {
	var v any
	_ = json.Unmarshal(b, &v)
	out, _ := json.Marshal(v)
	return string(out)
}

// rowCanon is canon for a rowsPatch entry, but keeps the order of its
// row's columns: zero-cache sends them in table order, and an app that
// prints a row's keys sees that order.
func rowCanon(t testing.TB, b json.RawMessage) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("bad rowsPatch entry %s: %v", b, err)
	}
	value, ok := m["value"]
	if !ok {
		return canon(b)
	}
	delete(m, "value")
	rest, _ := json.Marshal(m)
	// "value" sorts after the other keys ("op", "tableName"): where canon
	// would put it.
	c := canon(rest)
	return c[:len(c)-1] + `,"value":` + orderedCanon(t, value) + "}"
}

// orderedCanon re-encodes a JSON value compactly, numbers as encoding/json
// writes a float64, keeping the order of object keys.
func orderedCanon(t testing.TB, b json.RawMessage) string {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.UseNumber()
	var out strings.Builder
	var value func() // writes the value d is at
	value = func() {
		tok, err := d.Token()
		if err != nil {
			t.Fatalf("bad JSON %s: %v", b, err)
		}
		switch x := tok.(type) {
		case json.Delim:
			out.WriteString(x.String())
			for i := 0; d.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if x == '{' {
					k, _ := d.Token()
					kb, _ := json.Marshal(k)
					out.Write(kb)
					out.WriteByte(':')
				}
				value()
			}
			end, _ := d.Token()
			out.WriteString(end.(json.Delim).String())
		case json.Number:
			f, err := x.Float64()
			if err != nil {
				t.Fatalf("bad number %s in %s", x, b)
			}
			fb, _ := json.Marshal(f)
			out.Write(fb)
		default:
			xb, _ := json.Marshal(x)
			out.Write(xb)
		}
	}
	value()
	return out.String()
}

func (r *replayer) checkPoke(c *client, want []json.RawMessage) {
	r.t.Helper()
	var got []json.RawMessage
	for {
		_ = c.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			r.t.Fatalf("reading a poke: %v (want %s)", err, want)
		}
		tag, _ := splitFrame(r.t, data)
		if tag == "pong" && len(got) == 0 {
			continue
		}
		got = append(got, data)
		if tag == "pokeEnd" {
			break
		}
	}
	g, w := summarize(r.t, got), summarize(r.t, want)
	if (g.base == nil) != (w.base == nil) {
		r.t.Fatalf("poke base %v; want %v", deref(g.base), deref(w.base))
	}
	if w.base != nil && r.cookies[*w.base] != *g.base {
		r.t.Errorf("poke base %s; want ours for %s (%s)", *g.base, *w.base, r.cookies[*w.base])
	}
	if c.cookie != nil && (g.base == nil || *g.base != *c.cookie) {
		r.t.Errorf("poke base %v does not chain to the last cookie %s", deref(g.base), *c.cookie)
	}
	if g.base != nil && g.cookie < *g.base || g.base != nil && g.cookie == *g.base && len(g.patches) > 0 {
		r.t.Errorf("poke cookie %s does not increase from %s", g.cookie, *g.base)
	}
	if prev, ok := r.cookies[w.cookie]; ok && prev != g.cookie {
		r.t.Errorf("capture cookie %s maps to %s and %s", w.cookie, prev, g.cookie)
	}
	r.t.Logf("poke %s -> %s: %d patches", deref(g.base), g.cookie, len(g.patches))
	r.cookies[w.cookie] = g.cookie
	cookie := g.cookie
	c.cookie = &cookie
	if strings.Join(g.patches, "\n") != strings.Join(w.patches, "\n") {
		r.t.Errorf("poke %s patches:\n%s\nwant:\n%s", g.cookie, strings.Join(g.patches, "\n"), strings.Join(w.patches, "\n"))
	}
}

func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

func (r *replayer) expectClose(c *client, code int) {
	r.t.Helper()
	for {
		_ = c.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, data, err := c.ws.ReadMessage()
		if err == nil {
			if tag, _ := splitFrame(r.t, data); tag == "pong" {
				continue
			}
			r.t.Fatalf("got %s; want close %d", data, code)
		}
		if !websocket.IsCloseError(err, code) {
			r.t.Errorf("close: %v; want code %d", err, code)
		}
		return
	}
}

func TestTranscripts(t *testing.T) {
	e := newEnv(t, envOptions{issues: 1000, secret: captureSecret})
	for _, name := range []string{
		"connect-hydrate-legacy",
		"connect-with-initial-queries-legacy-only",
		"upstream-insert-update-delete-legacy",
		"idle-ping-pong-legacy",
		"hydrate-all-shapes-legacy-only",
		"change-desired-queries-add-remove-legacy",
		"reconnect-basecookie-legacy",
		"reopen-persisted-state-legacy",
		"ttl-expiry-legacy",
		"auth-error-bad-jwt",
		"auth-error-wrong-subject",
		// Last: its DDL changes the issue table, though it ends as it began.
		"upstream-ddl-legacy",
	} {
		t.Run(name, func(t *testing.T) { replay(t, e, name) })
	}
}

// TestTranscripts_Synced replays the transcripts of synced queries and
// custom mutations against a view-syncer whose API server (apiServer)
// transforms the queries and runs the mutators.
func TestTranscripts_Synced(t *testing.T) {
	e := newEnv(t, envOptions{issues: 1000, secret: captureSecret, api: true})
	for _, name := range []string{
		"connect-hydrate-custom",
		"connect-with-initial-queries",
		"hydrate-all-shapes-custom",
		"hydrate-all-shapes-legacy",
		"upstream-insert-update-delete",
		"idle-ping-pong",
		"change-desired-queries-add-remove",
		"reconnect-basecookie",
		"reopen-persisted-state",
		"mutation-push",
	} {
		t.Run(name, func(t *testing.T) { replay(t, e, name) })
	}
}
