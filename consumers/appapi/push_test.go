package appapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func pushBody(group string, ms ...MutationID) PushBody {
	b := PushBody{ClientGroupID: group, PushVersion: 1, Timestamp: 1700000001240, RequestID: "req"}
	for _, m := range ms {
		b.Mutations = append(b.Mutations, Mutation{Type: "custom", ID: m.ID, ClientID: m.ClientID, Name: "issue.setTitle",
			Args: json.RawMessage(`[{"id":"i1"}]`), Timestamp: 1700000001234})
	}
	return b
}

func TestClient_Push(t *testing.T) {
	ids := []MutationID{{"c1", 7}, {"c2", 3}, {"c1", 8}}
	tests := []struct {
		name     string
		status   int
		resp     string
		wantErr  *Failure
		wantRes  PushResult
		wantOOO  map[string][]MutationID
		attempts int
	}{{
		name: "Success",
		resp: `{"kind":"MutateResponse","userID":"u1","mutations":[{"id":{"clientID":"c1","id":7},"result":{}},
			{"id":{"clientID":"c2","id":3},"result":{"error":"app","message":"boom"}},{"id":{"clientID":"c1","id":8},"result":{"error":"alreadyProcessed"}}]}`,
		wantRes: PushResult{Validation: Validation{Server: true, UserID: ptr("u1")}, Mutations: []MutationResponse{
			{ID: ids[0], Result: json.RawMessage(`{}`)},
			{ID: ids[1], Result: json.RawMessage(`{"error":"app","message":"boom"}`)},
			{ID: ids[2], Result: json.RawMessage(`{"error":"alreadyProcessed"}`)},
		}},
		attempts: 1,
	}, {
		name: "OutOfOrder",
		resp: `{"mutations":[{"id":{"clientID":"c1","id":7},"result":{}},{"id":{"clientID":"c1","id":8},"result":{"error":"oooMutation","details":"x"}},
			{"id":{"clientID":"c2","id":3},"result":{}}]}`,
		wantRes: PushResult{Mutations: []MutationResponse{
			{ID: ids[0], Result: json.RawMessage(`{}`)},
			{ID: ids[2], Result: json.RawMessage(`{"error":"oooMutation","details":"x"}`)},
			{ID: ids[1], Result: json.RawMessage(`{}`)},
		}},
		wantOOO:  map[string][]MutationID{"c1": {ids[0], ids[2]}},
		attempts: 1,
	}, {
		name:     "401",
		status:   401,
		resp:     "expired",
		wantErr:  &Failure{Origin: OriginZeroCache, Reason: ReasonHTTP, Status: 401, BodyPreview: ptr("expired"), Message: "Fetch from API server returned non-OK status 401", MutationIDs: ids},
		attempts: 1,
	}, {
		name:     "500",
		status:   500,
		resp:     "down",
		wantErr:  &Failure{Origin: OriginZeroCache, Reason: ReasonHTTP, Status: 500, BodyPreview: ptr("down"), Message: "Fetch from API server returned non-OK status 500", MutationIDs: ids},
		attempts: 4,
	}, {
		name:     "ServerPushFailed",
		resp:     `{"kind":"PushFailed","origin":"server","reason":"database","message":"deadlock","mutationIDs":[{"clientID":"c2","id":3}]}`,
		wantErr:  &Failure{Origin: OriginServer, Reason: ReasonDatabase, Message: "deadlock", MutationIDs: ids[1:2]},
		attempts: 1,
	}, {
		name:     "LegacyHTTPError",
		resp:     `{"error":"http","status":403,"details":"forbidden","mutationIDs":[{"clientID":"c1","id":7}]}`,
		wantErr:  &Failure{Origin: OriginZeroCache, Reason: ReasonHTTP, Status: 403, BodyPreview: ptr("forbidden"), Message: "Fetch from API server returned non-OK status 403", MutationIDs: ids[:1]},
		attempts: 1,
	}, {
		name:     "LegacyZeroPusher",
		resp:     `{"error":"zeroPusher","details":"it broke"}`,
		wantErr:  &Failure{Origin: OriginServer, Reason: ReasonInternal, Message: "it broke"},
		attempts: 1,
	}, {
		name:     "LegacyUnsupportedPushVersion",
		resp:     `{"error":"unsupportedPushVersion"}`,
		wantErr:  &Failure{Origin: OriginServer, Reason: ReasonUnsupportedPushVersion, Message: "Unsupported push version"},
		attempts: 1,
	}, {
		name:     "Garbage",
		resp:     `{"kind":"MutateResponse","mutations":[{"id":7}]}`,
		wantErr:  &Failure{Origin: OriginZeroCache, Reason: ReasonParse, MutationIDs: ids},
		attempts: 1,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status := tc.status
			if status == 0 {
				status = 200
			}
			s := newAPIServer(t, reply(status, tc.resp))
			c := newTestClient(t, Config{Mutate: Endpoint{URLs: []string{s.URL + "/mutate"}}})
			res, err := c.Push(t.Context(), PushRequest{Conn: Conn{Token: "t"}, Body: pushBody("g1", ids...)})
			if n := len(s.requests()); n != tc.attempts {
				t.Errorf("%d attempts; want %d", n, tc.attempts)
			}
			if tc.wantErr != nil {
				var f *Failure
				if !errors.As(err, &f) {
					t.Fatalf("Push = %v; want a *Failure", err)
				}
				want := *tc.wantErr
				want.Kind = KindPushFailed
				if want.Reason == ReasonParse {
					want.Message = f.Message
				}
				if diff := cmp.Diff(&want, f, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Err" }, cmp.Ignore())); diff != "" {
					t.Errorf("failure (-want +got):\n%s", diff)
				}
				if IsAuth(err) != (f.Status == 401 || f.Status == 403) {
					t.Errorf("IsAuth = %v for status %d", IsAuth(err), f.Status)
				}
				return
			}
			if err != nil {
				t.Fatalf("Push: %v", err)
			}
			if diff := cmp.Diff(tc.wantRes, res); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			ooo := map[string][]MutationID{}
			for cid, f := range res.OutOfOrder() {
				if f.Kind != KindPushFailed || f.Origin != OriginServer || f.Reason != ReasonOutOfOrderMutation {
					t.Errorf("OutOfOrder[%s] = %+v", cid, f)
				}
				ooo[cid] = f.MutationIDs
			}
			if diff := cmp.Diff(tc.wantOOO, ooo, cmp.Comparer(func(a, b map[string][]MutationID) bool { return len(a) == 0 && len(b) == 0 || cmp.Equal(a, b) })); diff != "" {
				t.Errorf("OutOfOrder (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFailure_ByClient(t *testing.T) {
	f := &Failure{Kind: KindPushFailed, Origin: OriginZeroCache, Reason: ReasonHTTP, Status: 500, Message: "m",
		MutationIDs: []MutationID{{"c1", 7}, {"c2", 3}, {"c1", 8}}}
	got := f.ByClient()
	if len(got) != 2 || !cmp.Equal(got["c1"].MutationIDs, []MutationID{{"c1", 7}, {"c1", 8}}) ||
		!cmp.Equal(got["c2"].MutationIDs, []MutationID{{"c2", 3}}) || got["c2"].Status != 500 {
		t.Errorf("ByClient = %+v", got)
	}
	b, _ := json.Marshal(got["c2"])
	want := `{"kind":"PushFailed","origin":"zeroCache","reason":"http","status":500,"message":"m","mutationIDs":[{"clientID":"c2","id":3}]}`
	if string(b) != want {
		t.Errorf("body = %s; want %s", b, want)
	}
}

func TestClient_Cleanup(t *testing.T) {
	s := newAPIServer(t, reply(200, `{"kind":"MutateResponse","mutations":[]}`))
	c := newTestClient(t, Config{Mutate: Endpoint{URLs: []string{s.URL}}})
	c.now = func() time.Time { return time.UnixMilli(1700000000000) }
	r := CleanupRequest{Conn: Conn{Token: "t"}, ClientGroupID: "g1"}
	if err := c.CleanupResults(t.Context(), r, "c1", 7); err != nil {
		t.Fatal(err)
	}
	if err := c.CleanupClients(t.Context(), r, []string{"c2", "c3"}); err != nil {
		t.Fatal(err)
	}
	reqs := s.requests()
	want := []string{
		`{"clientGroupID":"g1","mutations":[{"type":"custom","id":0,"clientID":"c1","name":"_zero_cleanupResults","args":[{"clientGroupID":"g1","clientID":"c1","type":"single","upToMutationID":7}],"timestamp":1700000000000}],"pushVersion":1,"timestamp":1700000000000,"requestID":"cleanup-g1-c1-7"}`,
		`{"clientGroupID":"g1","mutations":[{"type":"custom","id":0,"clientID":"c2","name":"_zero_cleanupResults","args":[{"clientGroupID":"g1","clientIDs":["c2","c3"],"type":"bulk"}],"timestamp":1700000000000}],"pushVersion":1,"timestamp":1700000000000,"requestID":"cleanup-bulk-g1-1700000000000"}`,
	}
	if len(reqs) != 2 || reqs[0].Body != want[0] || reqs[1].Body != want[1] {
		t.Errorf("requests = %+v; want %v", reqs, want)
	}
}

func TestCombinePushes(t *testing.T) {
	k1 := PushKey{ClientID: "c1", WSID: "w1", Revision: 1}
	k1b := PushKey{ClientID: "c1", WSID: "w1", Revision: 2}
	k2 := PushKey{ClientID: "c2", WSID: "w9", Revision: 1}
	in := []PushEntry{
		{Key: k1, Request: PushRequest{Body: pushBody("g", MutationID{"c1", 1})}},
		{Key: k2, Request: PushRequest{Body: pushBody("g", MutationID{"c2", 1})}},
		{Key: k1, Request: PushRequest{Body: pushBody("g", MutationID{"c1", 2}, MutationID{"c1", 3})}},
		{Key: k1b, Request: PushRequest{Body: pushBody("g", MutationID{"c1", 4})}},
	}
	got := CombinePushes(in)
	var keys []PushKey
	var muts [][]MutationID
	for _, e := range got {
		keys = append(keys, e.Key)
		muts = append(muts, e.Request.Body.MutationIDs())
	}
	if diff := cmp.Diff([]PushKey{k1, k2, k1b}, keys); diff != "" {
		t.Errorf("keys (-want +got):\n%s", diff)
	}
	want := [][]MutationID{{{"c1", 1}, {"c1", 2}, {"c1", 3}}, {{"c2", 1}}, {{"c1", 4}}}
	if diff := cmp.Diff(want, muts); diff != "" {
		t.Errorf("mutations (-want +got):\n%s", diff)
	}
	if n := len(in[0].Request.Body.Mutations); n != 1 {
		t.Errorf("CombinePushes changed its input: %d mutations", n)
	}
}

// TestPusher_Run shows that pushes arriving while a request is in flight
// are combined per key into the next round.
func TestPusher_Run(t *testing.T) {
	received := make(chan string, 10)
	release := make(chan struct{})
	s := newAPIServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 0 {
			received <- "first"
			<-release
		}
		reply(200, `{"kind":"MutateResponse","mutations":[]}`)(w, r, n)
	})
	c := newTestClient(t, Config{Mutate: Endpoint{URLs: []string{s.URL}}})
	outcomes := make(chan PushOutcome, 10)
	p := c.NewPusher(4, func(_ context.Context, o PushOutcome) { outcomes <- o })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})

	k1 := PushKey{ClientID: "c1", WSID: "w1"}
	k2 := PushKey{ClientID: "c2", WSID: "w2"}
	enqueue := func(k PushKey, id int64) {
		t.Helper()
		if err := p.Enqueue(PushEntry{Key: k, Request: PushRequest{Body: pushBody("g", MutationID{k.ClientID, id})}}); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(k1, 1)
	<-received
	enqueue(k1, 2)
	enqueue(k2, 1)
	enqueue(k1, 3)
	enqueue(k2, 2)
	if err := p.Enqueue(PushEntry{Key: k1}); !errors.Is(err, ErrPushQueueFull) {
		t.Errorf("Enqueue on a full queue = %v; want ErrPushQueueFull", err)
	}
	close(release)

	var got [][]MutationID
	for range 3 {
		select {
		case o := <-outcomes:
			if o.Err != nil {
				t.Fatalf("outcome: %v", o.Err)
			}
			got = append(got, o.Entry.Request.Body.MutationIDs())
		case <-time.After(10 * time.Second):
			t.Fatal("timed out waiting for outcomes")
		}
	}
	want := [][]MutationID{{{"c1", 1}}, {{"c1", 2}, {"c1", 3}}, {{"c2", 1}, {"c2", 2}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pushes sent (-want +got):\n%s", diff)
	}
	var bodies []string
	for _, r := range s.requests() {
		bodies = append(bodies, r.Body)
	}
	if len(bodies) != 3 || strings.Count(bodies[1], `"clientID":"c1"`) != 2 {
		t.Errorf("bodies = %v", bodies)
	}
}
