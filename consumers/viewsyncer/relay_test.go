package viewsyncer

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/jetsync/jetsync/consumers/cvrstore"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

// tcpSink counts the connections and bytes a listener receives.
type tcpSink struct {
	addr         string
	conns, bytes atomic.Int64
}

func newTCPSink(t *testing.T) *tcpSink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &tcpSink{addr: ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					s.bytes.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

// A record in the owners bucket that the deployment's peer secret did not
// sign redirects nobody: the client is sent away and the address it names
// hears nothing.
func TestRelay_ForgedOwner(t *testing.T) {
	e := newEnv(t, envOptions{issues: 5, durable: true})
	sink := newTCPSink(t)
	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, e.shard.OwnersBucket())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, sig string }{{"Unsigned", ""}, {"BadSignature", "c2lnbmVk"}} {
		t.Run(tc.name, func(t *testing.T) {
			group := "forged-" + tc.name
			rec, _ := json.Marshal(streams.CVROwner{ID: "intruder", Address: "ws://" + sink.addr,
				ExpiresMs: time.Now().Add(time.Minute).UnixMilli(), Sig: tc.sig})
			if _, err := kv.Put(ctx, streams.OwnerKey(group), rec); err != nil {
				t.Fatal(err)
			}
			c := connect(t, e, dialOpts{group: group, client: "c1", token: "", init: initFrame(testSchema)})
			c.expectError(kindRehome, "CVR ownership was transferred to intruder at ", closeNormal)
			if n, b := sink.conns.Load(), sink.bytes.Load(); n != 0 || b != 0 {
				t.Fatalf("the forged owner's address got %d connections, %d bytes; want none", n, b)
			}
		})
	}
}

// A peer whose record the deployment's secret signs gets the client's
// connection relayed, with the client's cookies, origin and other request
// headers.
func TestRelay_SignedPeerGetsClientHeaders(t *testing.T) {
	e := newEnv(t, envOptions{issues: 5, durable: true})
	got := make(chan http.Header, 1)
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// As the view-syncer, it accepts any origin.
		up := websocket.Upgrader{Subprotocols: websocket.Subprotocols(r), CheckOrigin: func(*http.Request) bool { return true }}
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		got <- r.Header.Clone()
		_ = ws.WriteMessage(websocket.TextMessage, []byte(`["pong",{}]`))
		_, _, _ = ws.ReadMessage()
	}))
	t.Cleanup(peer.Close)
	_, js := natstest.Connect(t, e.ns)
	store, err := cvrstore.Open(context.Background(), cvrstore.Config{JS: js, Shard: e.shard,
		File: filepath.Join(t.TempDir(), "peer-cvr.db"), OwnerID: "peer", Address: "ws://" + peer.Listener.Addr().String(),
		PeerSecret: []byte(testPeerSecret), Logger: e.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Acquire(context.Background(), "relayed"); err != nil {
		t.Fatal(err)
	}

	proto, err := encodeSecProtocol(secProtocol{InitConnectionMessage: json.RawMessage(initFrame(testSchema))})
	if err != nil {
		t.Fatal(err)
	}
	q := url.Values{"clientGroupID": {"relayed"}, "clientID": {"c1"}, "wsid": {"w1"}, "baseCookie": {""}, "ts": {"1"}, "lmid": {"0"}}
	h := http.Header{"Cookie": {"session=s3cret"}, "Origin": {"https://app.example"}, "X-App-Tenant": {"t1"}}
	d := websocket.Dialer{Subprotocols: []string{proto}, HandshakeTimeout: 5 * time.Second}
	ws, _, err := d.Dial("ws"+strings.TrimPrefix(e.http.URL, "http")+"/sync/v51/connect?"+q.Encode(), h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	if tag, body := readFrame(t, ws); tag != "pong" {
		t.Fatalf("got %s %s; want the peer's frame, relayed", tag, body)
	}
	var rh http.Header
	select {
	case rh = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the peer saw no upgrade")
	}
	for k, want := range map[string]string{"Cookie": "session=s3cret", "Origin": "https://app.example",
		"X-App-Tenant": "t1", "Sec-Websocket-Protocol": proto, forwardedHeader: "1"} {
		if v := rh.Get(k); v != want {
			t.Errorf("relayed %s = %q; want %q", k, v, want)
		}
	}
	if q := rh.Get("Host"); q != "" {
		t.Errorf("relayed a Host header %q", q)
	}
}

// Without a peer secret nothing is relayed, even to a genuine peer: the
// client is sent away to reach the owner through the load balancer.
func TestRelay_NoPeerSecret(t *testing.T) {
	o := envOptions{issues: 5, durable: true, noPeerSecret: true}
	e := newEnv(t, o)
	connect(t, e, dialOpts{group: "g", client: "c1", init: initFrame(testSchema)}).expect("connected")
	e.use(e.startSyncer("vs-b", o))
	connect(t, e, dialOpts{group: "g", client: "c2", init: initFrame(testSchema)}).
		expectError(kindRehome, "CVR ownership was transferred to vs-a at ", closeNormal)
}

// An owner that takes the connection but never answers, as a stopped
// (SIGSTOP) or hung process does, holds the client only until its lease
// lapses: then the group is taken over and served here, well within the
// client's connect timeout, instead of the relay waiting out its own.
func TestRelay_SilentOwnerUntilItsLeaseLapses(t *testing.T) {
	e := newEnv(t, envOptions{issues: 5, durable: true})
	sink := newTCPSink(t)
	_, js := natstest.Connect(t, e.ns)
	const ttl = time.Second
	// Nothing renews this store's lease (no Run): it lapses after ttl.
	store, err := cvrstore.Open(context.Background(), cvrstore.Config{JS: js, Shard: e.shard,
		File: filepath.Join(t.TempDir(), "peer-cvr.db"), OwnerID: "stopped", Address: "ws://" + sink.addr,
		PeerSecret: []byte(testPeerSecret), LeaseTTL: ttl, Logger: e.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Acquire(context.Background(), "silent"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c := connect(t, e, dialOpts{group: "silent", client: "c1", init: initFrame(testSchema)})
	c.expect("connected")
	took := time.Since(start)
	if sink.conns.Load() == 0 {
		t.Error("the owner was not tried first")
	}
	if took > relayBudget {
		t.Errorf("served %v after connecting; want within %v, soon after the owner's lease (%v) lapsed", took.Round(time.Millisecond), relayBudget, ttl)
	}
	owner, err := store.Owner(context.Background(), "silent")
	if err != nil {
		t.Fatal(err)
	}
	if owner.ID == "stopped" {
		t.Errorf("the group is still owned by %+v", owner)
	}
	t.Logf("served %v after connecting, by %s", took.Round(time.Millisecond), owner.ID)
}
