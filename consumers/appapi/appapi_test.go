package appapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// recorded is one request the API server received.
type recorded struct {
	Path   string
	Query  url.Values
	Header http.Header
	Body   string
}

// apiServer is a real HTTP server standing in for the app's API server. It
// records every request and answers with respond (n counts from 0).
type apiServer struct {
	*httptest.Server
	mu      sync.Mutex
	reqs    []recorded
	respond func(w http.ResponseWriter, r *http.Request, n int)
}

func newAPIServer(t *testing.T, respond func(w http.ResponseWriter, r *http.Request, n int)) *apiServer {
	t.Helper()
	s := &apiServer{respond: respond}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.reqs)
		s.reqs = append(s.reqs, recorded{Path: r.URL.Path, Query: r.URL.Query(), Header: r.Header.Clone(), Body: string(b)})
		s.mu.Unlock()
		s.respond(w, r, n)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *apiServer) requests() []recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

// reply answers every request with status and body.
func reply(status int, body string) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

func newTestClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c.backoff = func(int) time.Duration { return time.Millisecond }
	return c
}

const issueAST = `{"table":"issue","where":{"type":"simple","op":"=","left":{"type":"column","name":"open"},"right":{"type":"literal","value":true}},"orderBy":[["modified","desc"],["id","asc"]],"limit":3}`

func okQueryResponse(userID string) string {
	u := ""
	if userID != "" {
		u = `"userID":"` + userID + `",`
	}
	return `{"kind":"QueryResponse",` + u + `"queries":[{"id":"q1","name":"openByModified","ast":` + issueAST + `}]}`
}

var oneQuery = []Query{{ID: "q1", Name: "openByModified", Args: json.RawMessage(`[{"limit":3}]`)}}

// goHeaders are what net/http itself adds to every request.
var goHeaders = []string{"Accept-Encoding", "Content-Length", "User-Agent"}

func headerNames(h http.Header) []string {
	var names []string
	for k := range h {
		if !slices.Contains(goHeaders, k) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	return names
}

// TestClient_Headers is acceptance 3 of issue 6: exactly the configured
// headers, cookies and origin reach the API server.
func TestClient_Headers(t *testing.T) {
	upgrade := http.Header{
		"Cookie":          {"session=abc", "theme=dark"},
		"Origin":          {"https://app.example"},
		"X-Forwarded-For": {"10.0.0.1", "10.0.0.2"},
		"Cf-Ray":          {"ray-1"},
		"X-Secret":        {"not forwarded"},
	}
	r := httptest.NewRequest(http.MethodGet, "/sync/v51/connect", nil)
	r.Header = upgrade
	conn := ConnFromRequest(r, "u1", "tok-1")
	clientHeaders := map[string]string{"x-tenant": "t1", "X-Request-ID": "r1", "x-evil": "no", "authorization": "Bearer spoof"}

	tests := []struct {
		name string
		ep   Endpoint
		conn Conn
		want http.Header
	}{{
		name: "Everything",
		ep: Endpoint{APIKey: "key-1", ForwardCookies: true,
			AllowedClientHeaders: []string{"X-Tenant", "x-request-id", "Authorization"}, AllowedRequestHeaders: []string{"x-forwarded-for", "CF-RAY"}},
		conn: conn,
		want: http.Header{
			"Content-Type":    {"application/json"},
			"X-Api-Key":       {"key-1"},
			"X-Tenant":        {"t1"},
			"X-Request-Id":    {"r1"},
			"X-Forwarded-For": {"10.0.0.1, 10.0.0.2"},
			"Cf-Ray":          {"ray-1"},
			// The token wins over a client header of the same name.
			"Authorization": {"Bearer tok-1"},
			"Cookie":        {"session=abc; theme=dark"},
			"Origin":        {"https://app.example"},
		},
	}, {
		name: "Defaults",
		ep:   Endpoint{},
		conn: conn,
		want: http.Header{
			"Content-Type":  {"application/json"},
			"Authorization": {"Bearer tok-1"},
			"Origin":        {"https://app.example"},
		},
	}, {
		name: "LoggedOutNoOrigin",
		ep:   Endpoint{ForwardCookies: true},
		conn: Conn{RequestHeader: http.Header{}},
		want: http.Header{"Content-Type": {"application/json"}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, src := range []string{"query", "mutate"} {
				s := newAPIServer(t, reply(200, `{"kind":"MutateResponse","mutations":[]}`))
				if src == "query" {
					s.respond = reply(200, okQueryResponse(""))
				}
				ep := tc.ep
				ep.URLs = []string{s.URL + "/" + src}
				cfg := Config{AppID: "zpeer", ShardNum: 2}
				if src == "query" {
					cfg.Query = ep
				} else {
					cfg.Mutate = ep
				}
				c := newTestClient(t, cfg)
				var err error
				wantBody := `["transform",[{"id":"q1","name":"openByModified","args":[{"limit":3}]}]]`
				if src == "query" {
					_, err = c.Transform(t.Context(), TransformRequest{Conn: tc.conn, Headers: clientHeaders, Queries: oneQuery})
				} else {
					body := PushBody{ClientGroupID: "g1", PushVersion: 1, Timestamp: 1796038912352, RequestID: "r-1",
						Mutations: []Mutation{{Type: "custom", ID: 1, ClientID: "c1", Name: "issue.setTitle", Args: json.RawMessage(`[{"id":"i1"}]`), Timestamp: 1796038912350}}}
					_, err = c.Push(t.Context(), PushRequest{Conn: tc.conn, Headers: clientHeaders, Body: body})
					wantBody = `{"clientGroupID":"g1","mutations":[{"type":"custom","id":1,"clientID":"c1","name":"issue.setTitle","args":[{"id":"i1"}],"timestamp":1796038912350}],"pushVersion":1,"timestamp":1796038912352,"requestID":"r-1"}`
				}
				if err != nil {
					t.Fatalf("%s: %v", src, err)
				}
				reqs := s.requests()
				if len(reqs) != 1 {
					t.Fatalf("%s: %d requests; want 1", src, len(reqs))
				}
				got := reqs[0]
				if diff := cmp.Diff(headerNames(tc.want), headerNames(got.Header)); diff != "" {
					t.Errorf("%s: header names (-want +got):\n%s", src, diff)
				}
				for k, v := range tc.want {
					if diff := cmp.Diff(v, got.Header[k]); diff != "" {
						t.Errorf("%s: header %s (-want +got):\n%s", src, k, diff)
					}
				}
				if want := (url.Values{"schema": {"zpeer_2"}, "appID": {"zpeer"}}); !cmp.Equal(want, got.Query) {
					t.Errorf("%s: query = %v; want %v", src, got.Query, want)
				}
				if got.Path != "/"+src || got.Body != wantBody {
					t.Errorf("%s: POST %s %s; want /%s %s", src, got.Path, got.Body, src, wantBody)
				}
			}
		})
	}
}

func TestClient_URLAllowList(t *testing.T) {
	configured := newAPIServer(t, reply(200, okQueryResponse("")))
	other := newAPIServer(t, reply(200, okQueryResponse("")))
	c := newTestClient(t, Config{
		Query:  Endpoint{URLs: []string{configured.URL + "/query", "http://127.0.0.1:*/alt/*"}},
		Mutate: Endpoint{URLs: []string{configured.URL + "/mutate"}},
	})

	t.Run("Refused", func(t *testing.T) {
		bad := other.URL + "/query"
		_, err := c.Transform(t.Context(), TransformRequest{URL: bad, Queries: oneQuery})
		var f *Failure
		if !errors.As(err, &f) {
			t.Fatalf("Transform = %v; want a *Failure", err)
		}
		want := &Failure{Kind: KindTransformFailed, Origin: OriginZeroCache, Reason: ReasonInternal,
			Message: `URL "` + bad + `" is not allowed by the ZERO_QUERY_URL configuration`, QueryIDs: []string{"q1"}}
		if diff := cmp.Diff(want, f, cmp.AllowUnexported(Failure{})); diff != "" {
			t.Errorf("failure (-want +got):\n%s", diff)
		}
		if IsAuth(err) || !IsTransient(err) {
			t.Errorf("IsAuth = %v, IsTransient = %v; want false, true", IsAuth(err), IsTransient(err))
		}
		_, err = c.Push(t.Context(), PushRequest{URL: other.URL + "/mutate", Body: PushBody{Mutations: []Mutation{{ClientID: "c1", ID: 4}}}})
		if !errors.As(err, &f) || f.Kind != KindPushFailed || !strings.Contains(f.Message, "is not allowed by the ZERO_MUTATE_URL configuration") ||
			!cmp.Equal(f.MutationIDs, []MutationID{{"c1", 4}}) {
			t.Errorf("Push = %#v; want a PushFailed refusing the URL", err)
		}
		if _, err := c.Validate(t.Context(), Conn{}, bad, nil); !errors.As(err, &f) || f.Reason != ReasonInternal {
			t.Errorf("Validate = %v; want the URL refused", err)
		}
		if n := len(other.requests()) + len(configured.requests()); n != 0 {
			t.Errorf("%d requests reached a server; want 0", n)
		}
	})
	t.Run("AllowedByPattern", func(t *testing.T) {
		if _, err := c.Transform(t.Context(), TransformRequest{URL: other.URL + "/alt/v2/query", Queries: oneQuery}); err != nil {
			t.Fatalf("Transform: %v", err)
		}
		if got := other.requests(); len(got) != 1 || got[0].Path != "/alt/v2/query" {
			t.Errorf("requests = %v; want one to /alt/v2/query", got)
		}
		if !c.QueryAllowed(other.URL+"/alt/x?q=1") || c.MutateAllowed(other.URL+"/alt/x") {
			t.Error("QueryAllowed/MutateAllowed disagree with the patterns")
		}
	})
	t.Run("NoURL", func(t *testing.T) {
		c := newTestClient(t, Config{})
		_, err := c.Transform(t.Context(), TransformRequest{Queries: oneQuery})
		var f *Failure
		if !errors.As(err, &f) || f.Message != "Failed to transform queries: Fetch config for transform is missing URL" {
			t.Errorf("Transform without a URL = %v", err)
		}
		_, err = c.Push(t.Context(), PushRequest{})
		if !errors.As(err, &f) || f.Message != "Failed to push: ZERO_MUTATE_URL is not set" {
			t.Errorf("Push without a URL = %v", err)
		}
	})
	t.Run("ReservedParam", func(t *testing.T) {
		if err := (Config{Query: Endpoint{URLs: []string{"http://x/q?schema=a"}}}).Validate(); err == nil {
			t.Error("Validate accepted a URL with ?schema=")
		}
		_, err := c.Transform(t.Context(), TransformRequest{URL: other.URL + "/alt/q?appID=x", Queries: oneQuery})
		var f *Failure
		if !errors.As(err, &f) || f.Reason != ReasonInternal || !strings.Contains(f.Message, `reserved query param "appID"`) {
			t.Errorf("Transform = %v; want the reserved param refused", err)
		}
	})
}

func TestClient_Classification(t *testing.T) {
	const transformFailed = `{"kind":"TransformFailed","origin":"server","reason":"database","message":"db down","queryIDs":["x"],"details":{"a":1}}`
	tests := []struct {
		name     string
		respond  func(w http.ResponseWriter, r *http.Request, n int)
		attempts int
		auth     bool
		want     *Failure
	}{{
		name:     "401",
		respond:  reply(401, "nope"),
		attempts: 1, auth: true,
		want: &Failure{Reason: ReasonHTTP, Origin: OriginZeroCache, Status: 401, BodyPreview: ptr("nope"),
			Message: "Fetch from API server returned non-OK status 401"},
	}, {
		name:     "403",
		respond:  reply(403, ""),
		attempts: 1, auth: true,
		want: &Failure{Reason: ReasonHTTP, Origin: OriginZeroCache, Status: 403, BodyPreview: ptr(""),
			Message: "Fetch from API server returned non-OK status 403"},
	}, {
		name:     "400NotRetried",
		respond:  reply(400, "bad"),
		attempts: 1,
		want: &Failure{Reason: ReasonHTTP, Origin: OriginZeroCache, Status: 400, BodyPreview: ptr("bad"),
			Message: "Fetch from API server returned non-OK status 400"},
	}, {
		name:     "500Retried",
		respond:  reply(500, "boom"),
		attempts: 4,
		want: &Failure{Reason: ReasonHTTP, Origin: OriginZeroCache, Status: 500, BodyPreview: ptr("boom"),
			Message: "Fetch from API server returned non-OK status 500"},
	}, {
		name: "Timeout",
		respond: func(w http.ResponseWriter, r *http.Request, _ int) {
			<-r.Context().Done()
		},
		attempts: 4,
		want:     &Failure{Reason: ReasonInternal, Origin: OriginZeroCache},
	}, {
		name:     "GarbageBody",
		respond:  reply(200, "<html>not json"),
		attempts: 1,
		want:     &Failure{Reason: ReasonParse, Origin: OriginZeroCache},
	}, {
		name:     "WrongShape",
		respond:  reply(200, `{"kind":"QueryResponse","queries":[{"id":"q1","name":"n"}]}`),
		attempts: 1,
		want:     &Failure{Reason: ReasonParse, Origin: OriginZeroCache},
	}, {
		name:     "BadAST",
		respond:  reply(200, `{"kind":"QueryResponse","queries":[{"id":"q1","name":"n","ast":{"table":""}}]}`),
		attempts: 1,
		want:     &Failure{Reason: ReasonParse, Origin: OriginZeroCache},
	}, {
		name:     "ServerTransformFailed",
		respond:  reply(200, transformFailed),
		attempts: 1,
		want: &Failure{Origin: OriginServer, Reason: ReasonDatabase, Message: "db down",
			Details: json.RawMessage(`{"a":1}`), QueryIDs: []string{"x"}},
	}, {
		name:     "LegacyTransformFailed",
		respond:  reply(200, `["transformFailed",`+transformFailed+`]`),
		attempts: 1,
		want: &Failure{Origin: OriginServer, Reason: ReasonDatabase, Message: "db down",
			Details: json.RawMessage(`{"a":1}`), QueryIDs: []string{"x"}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newAPIServer(t, tc.respond)
			c := newTestClient(t, Config{Query: Endpoint{URLs: []string{s.URL + "/query"}}, AttemptTimeout: 100 * time.Millisecond})
			_, err := c.Transform(t.Context(), TransformRequest{Queries: oneQuery})
			var f *Failure
			if !errors.As(err, &f) {
				t.Fatalf("Transform = %v; want a *Failure", err)
			}
			if got := len(s.requests()); got != tc.attempts {
				t.Errorf("%d attempts; want %d", got, tc.attempts)
			}
			if IsAuth(err) != tc.auth || IsTransient(err) == tc.auth {
				t.Errorf("IsAuth = %v, IsTransient = %v; want auth %v", IsAuth(err), IsTransient(err), tc.auth)
			}
			want := *tc.want
			want.Kind = KindTransformFailed
			if want.QueryIDs == nil {
				want.QueryIDs = []string{"q1"}
			}
			if want.Message == "" {
				want.Message = f.Message // checked below by prefix
			}
			if diff := cmp.Diff(&want, f, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Err" }, cmp.Ignore())); diff != "" {
				t.Errorf("failure (-want +got):\n%s", diff)
			}
			switch f.Reason {
			case ReasonParse:
				if !strings.HasPrefix(f.Message, "Failed to parse response from API server: ") || !IsBadResponse(err) {
					t.Errorf("message %q, IsBadResponse %v", f.Message, IsBadResponse(err))
				}
			case ReasonInternal:
				if !strings.HasPrefix(f.Message, "Fetch from API server threw error: ") {
					t.Errorf("message %q", f.Message)
				}
			}
			// The body the client gets parses as its schema wants.
			b, _ := json.Marshal(f)
			obj := map[string]json.RawMessage{}
			if err := json.Unmarshal(b, &obj); err != nil {
				t.Fatal(err)
			}
			if _, err := decodeFailure(KindTransformFailed, obj); err != nil {
				t.Errorf("the failure's body %s does not decode: %v", b, err)
			}
		})
	}
	t.Run("500ThenOK", func(t *testing.T) {
		s := newAPIServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if n < 2 {
				reply(503, "busy")(w, r, n)
				return
			}
			reply(200, okQueryResponse(""))(w, r, n)
		})
		c := newTestClient(t, Config{Query: Endpoint{URLs: []string{s.URL}}})
		if _, err := c.Transform(t.Context(), TransformRequest{Queries: oneQuery}); err != nil {
			t.Fatalf("Transform: %v", err)
		}
		if n := len(s.requests()); n != 3 {
			t.Errorf("%d attempts; want 3", n)
		}
	})
	t.Run("ConnectionRefused", func(t *testing.T) {
		s := newAPIServer(t, reply(200, "{}"))
		s.Close()
		c := newTestClient(t, Config{Query: Endpoint{URLs: []string{s.URL}}})
		_, err := c.Transform(t.Context(), TransformRequest{Queries: oneQuery})
		var f *Failure
		if !errors.As(err, &f) || f.Reason != ReasonInternal || IsAuth(err) {
			t.Errorf("Transform = %v; want a transient internal failure", err)
		}
	})
	t.Run("Canceled", func(t *testing.T) {
		s := newAPIServer(t, reply(500, "down"))
		c := newTestClient(t, Config{Query: Endpoint{URLs: []string{s.URL}}})
		c.backoff = func(int) time.Duration { return time.Hour }
		ctx, cancel := context.WithCancel(t.Context())
		s.respond = func(w http.ResponseWriter, r *http.Request, n int) {
			cancel()
			reply(500, "down")(w, r, n)
		}
		_, err := c.Transform(ctx, TransformRequest{Queries: oneQuery})
		if !errors.Is(err, context.Canceled) && !IsTransient(err) {
			t.Errorf("Transform = %v; want it to stop on cancel", err)
		}
		if n := len(s.requests()); n != 1 {
			t.Errorf("%d attempts after cancel; want 1", n)
		}
	})
}

func TestClient_Oversize(t *testing.T) {
	big := strings.Repeat("é", 2000)
	t.Run("Body", func(t *testing.T) {
		s := newAPIServer(t, reply(200, `{"kind":"QueryResponse","queries":[],"pad":"`+big+`"}`))
		c := newTestClient(t, Config{Query: Endpoint{URLs: []string{s.URL}}, MaxResponseBytes: 1024})
		_, err := c.Transform(t.Context(), TransformRequest{Queries: oneQuery})
		var f *Failure
		if !errors.As(err, &f) || f.Reason != ReasonParse || !strings.Contains(f.Message, "exceeds 1024 bytes") {
			t.Errorf("Transform = %v; want a parse failure for the size", err)
		}
	})
	t.Run("ErrorPreview", func(t *testing.T) {
		s := newAPIServer(t, reply(502, big))
		c := newTestClient(t, Config{Query: Endpoint{URLs: []string{s.URL}}, MaxAttempts: 1})
		_, err := c.Transform(t.Context(), TransformRequest{Queries: oneQuery})
		var f *Failure
		if !errors.As(err, &f) || f.BodyPreview == nil {
			t.Fatalf("Transform = %v; want a preview", err)
		}
		if want := strings.Repeat("é", 512) + "..."; *f.BodyPreview != want {
			t.Errorf("preview has %d bytes; want 512 characters and ...", len(*f.BodyPreview))
		}
	})
}

func TestClient_Transform(t *testing.T) {
	resp := `{"kind":"QueryResponse","userID":"u1","extra":true,"queries":[
		{"id":"q1","name":"openByModified","ast":` + issueAST + `,"more":1},
		{"error":"app","id":"q2","name":"issuesByIDs","message":"not allowed","details":{"code":403}},
		{"error":"parse","id":"q3","name":"pageAfter","message":"bad args"},
		{"error":"app","id":"q4","name":"x"}]}`
	s := newAPIServer(t, reply(200, resp))
	c := newTestClient(t, Config{Query: Endpoint{URLs: []string{s.URL}}})
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	qs := []Query{oneQuery[0], {ID: "q2", Name: "issuesByIDs"}, {ID: "q3", Name: "pageAfter"}, {ID: "q4", Name: "x"}}
	conn := Conn{UserID: "u1", Token: "t1"}

	res, err := c.Transform(t.Context(), TransformRequest{Conn: conn, Queries: qs})
	if err != nil {
		t.Fatalf("Transform: %v", err)
	}
	if res.Cached || !res.Validation.Server || res.Validation.UserID == nil || *res.Validation.UserID != "u1" {
		t.Errorf("Cached %v, Validation %+v; want a server validation of u1", res.Cached, res.Validation)
	}
	if len(res.Queries) != 4 {
		t.Fatalf("%d results; want 4", len(res.Queries))
	}
	q1 := res.Queries[0]
	if q1.ID != "q1" || q1.AST == nil || q1.AST.Table != "issue" || q1.TransformationHash == "" || q1.Error != nil {
		t.Errorf("q1 = %+v", q1)
	}
	var errs []string
	for _, q := range res.Queries[1:] {
		if q.Error == nil || q.AST != nil {
			t.Fatalf("%s = %+v; want an error", q.ID, q)
		}
		b, _ := json.Marshal(q.Error)
		errs = append(errs, string(b))
	}
	wantErrs := []string{
		`{"error":"app","id":"q2","name":"issuesByIDs","message":"not allowed","details":{"code":403}}`,
		`{"error":"parse","id":"q3","name":"pageAfter","message":"bad args"}`,
		`{"error":"app","id":"q4","name":"x"}`,
	}
	if diff := cmp.Diff(wantErrs, errs); diff != "" {
		t.Errorf("transformError elements (-want +got):\n%s", diff)
	}
	if got := s.requests()[0].Body; !strings.Contains(got, `{"id":"q2","name":"issuesByIDs","args":[]}`) {
		t.Errorf("request %s: absent args should be []", got)
	}

	// Within the TTL, the success is served from the cache; errors are not
	// cached, so they are asked again.
	now = now.Add(4 * time.Second)
	s.respond = reply(200, `{"kind":"QueryResponse","queries":[]}`)
	res, err = c.Transform(t.Context(), TransformRequest{Conn: conn, Queries: qs[:1]})
	if err != nil || !res.Cached || len(res.Queries) != 1 || res.Queries[0].TransformationHash != q1.TransformationHash {
		t.Errorf("cached Transform = %+v, %v; want q1 from the cache", res, err)
	}
	if n := len(s.requests()); n != 1 {
		t.Errorf("%d requests; want 1 (cache hit)", n)
	}
	res, err = c.Transform(t.Context(), TransformRequest{Conn: conn, Queries: qs[:2]})
	if err != nil || res.Cached || len(s.requests()) != 2 || !strings.Contains(s.requests()[1].Body, `"q2"`) || strings.Contains(s.requests()[1].Body, `"q1"`) {
		t.Errorf("Transform = %+v, %v; want only q2 sent", res, err)
	}
	// Another identity misses the cache.
	other := conn
	other.Token = "t2"
	if _, err := c.Transform(t.Context(), TransformRequest{Conn: other, Queries: qs[:1]}); err != nil || len(s.requests()) != 3 {
		t.Errorf("another token: %v, %d requests; want a request", err, len(s.requests()))
	}
	// After the TTL the entry is gone.
	now = now.Add(2 * time.Second)
	if _, err := c.Transform(t.Context(), TransformRequest{Conn: conn, Queries: qs[:1]}); err != nil || len(s.requests()) != 4 {
		t.Errorf("after the TTL: %v, %d requests; want a request", err, len(s.requests()))
	}
	if got := c.cache.len(); got > 1 {
		t.Errorf("cache holds %d entries after the sweep; want at most 1", got)
	}
	// Nothing to transform: no request.
	if res, err := c.Transform(t.Context(), TransformRequest{Conn: conn}); err != nil || !res.Cached || len(s.requests()) != 4 {
		t.Errorf("empty Transform = %+v, %v", res, err)
	}
}

func TestClient_Validate(t *testing.T) {
	tests := []struct {
		name string
		resp string
		want Validation
	}{
		{"ClientFallback", `{"kind":"QueryResponse","queries":[]}`, Validation{}},
		{"ServerUser", `{"kind":"QueryResponse","userID":"u1","queries":[]}`, Validation{Server: true, UserID: ptr("u1")}},
		{"ServerLoggedOut", `{"kind":"QueryResponse","userID":null,"queries":[]}`, Validation{Server: true}},
		{"Legacy", `["transformed",[]]`, Validation{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newAPIServer(t, reply(200, tc.resp))
			c := newTestClient(t, Config{Query: Endpoint{URLs: []string{s.URL}}})
			got, err := c.Validate(t.Context(), Conn{Token: "t"}, "", nil)
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Validate (-want +got):\n%s", diff)
			}
			if r := s.requests(); len(r) != 1 || r[0].Body != `["transform",[]]` {
				t.Errorf("requests = %v; want one empty transform", r)
			}
		})
	}
	t.Run("NoQueryURL", func(t *testing.T) {
		c := newTestClient(t, Config{})
		if v, err := c.Validate(t.Context(), Conn{}, "", nil); err != nil || v.Server {
			t.Errorf("Validate = %+v, %v; want a client-fallback success", v, err)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// TestClient_RequestTimeout holds every request: a call ends at its
// RequestTimeout, retries included, with a transient failure.
func TestClient_RequestTimeout(t *testing.T) {
	s := newAPIServer(t, func(w http.ResponseWriter, r *http.Request, _ int) { <-r.Context().Done() })
	c := newTestClient(t, Config{Query: Endpoint{URLs: []string{s.URL + "/query"}}, AttemptTimeout: time.Hour, RequestTimeout: 200 * time.Millisecond})
	for _, call := range []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"Transform", func(ctx context.Context) error {
			_, err := c.Transform(ctx, TransformRequest{Queries: oneQuery})
			return err
		}},
		{"Validate", func(ctx context.Context) error {
			_, err := c.Validate(ctx, Conn{}, "", nil)
			return err
		}},
	} {
		start := time.Now()
		err := call.do(t.Context())
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s took %v; want it to end near its 200ms timeout", call.name, d)
		}
		if !IsTransient(err) {
			t.Errorf("%s = %v; want a transient failure", call.name, err)
		}
	}
}
