// Package syncclient is a minimal Zero sync protocol v51 client for the
// benchmarks: it holds queries, pushes custom mutations and reads pokes
// cheaply, since it shares the machine's cores with the servers it measures.
package syncclient

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

// clientSchema is the e2e app's schema (e2e/client/app/schema.mjs) as the
// real client sends it in initConnection.
const clientSchema = `{"tables":{"comment":{"columns":{"body":{"type":"string"},"created":{"type":"number"},"id":{"type":"string"},"issue_id":{"type":"string"}},"primaryKey":["id"]},"issue":{"columns":{"created":{"type":"number"},"id":{"type":"string"},"modified":{"type":"number"},"open":{"type":"boolean"},"owner_id":{"type":"string"},"title":{"type":"string"}},"primaryKey":["id"]},"issue_label":{"columns":{"issue_id":{"type":"string"},"label_id":{"type":"string"}},"primaryKey":["issue_id","label_id"]},"label":{"columns":{"id":{"type":"string"},"name":{"type":"string"}},"primaryKey":["id"]},"user":{"columns":{"id":{"type":"string"},"name":{"type":"string"}},"primaryKey":["id"]}}}`

// DefaultReadTimeout bounds the wait for any one frame when Options leave it
// zero.
const DefaultReadTimeout = 2 * time.Minute

// Query is a legacy (AST) query as a client desires it.
type Query struct {
	Hash string
	AST  string
}

// NewQuery names ast by a hash of it.
func NewQuery(ast string) Query {
	h := fnv.New64a()
	h.Write([]byte(ast))
	return Query{Hash: strconv.FormatUint(h.Sum64(), 36), AST: ast}
}

// Put is q's desired-query put.
func (q Query) Put(ttlMS int) string { return ASTPut(q.Hash, q.AST, ttlMS) }

// ASTPut and SyncedPut are desired-query puts as the real client sends them:
// a legacy query carries its AST, a synced query its name and args.
func ASTPut(hash, ast string, ttlMS int) string {
	return fmt.Sprintf(`{"op":"put","hash":%q,"ast":%s,"ttl":%d}`, hash, ast, ttlMS)
}

func SyncedPut(hash, name, args string, ttlMS int) string {
	return fmt.Sprintf(`{"op":"put","hash":%q,"name":%q,"args":[%s],"ttl":%d}`, hash, name, args, ttlMS)
}

// InitConnection is the initConnection frame desiring puts.
func InitConnection(puts ...string) string {
	return `["initConnection",{"desiredQueriesPatch":[` + strings.Join(puts, ",") + `],"clientSchema":` + clientSchema + `}]`
}

// DelQuery is the changeDesiredQueries frame that drops hash.
func DelQuery(hash string) string {
	return `["changeDesiredQueries",{"desiredQueriesPatch":[{"op":"del","hash":"` + hash + `"}]}]`
}

// Options say how Dial connects.
type Options struct {
	Group, Client string
	// AuthToken, when set, is the JWT sent with the connection.
	AuthToken string
	// Init, when set, is the initConnection carried in the
	// Sec-WebSocket-Protocol header, as the real client sends it.
	Init string
	// ReadTimeout bounds the wait for any one frame (DefaultReadTimeout
	// when zero).
	ReadTimeout time.Duration
	// ReadBufferSize is the websocket's (gorilla's default when zero).
	ReadBufferSize int
	// BaseCookie, when set, reconnects from the cookie of the last poke
	// the client completed (Poke.Cookie), as the real client does.
	BaseCookie string
}

// Client is one Zero client speaking sync protocol v51 over a websocket.
type Client struct {
	ws          *websocket.Conn
	group, id   string
	readTimeout time.Duration
	lmid        int // the last mutation id pushed
	// Bytes counts the frames read.
	Bytes int
}

// Dial connects a client to the sync server at base (http://host:port) as
// user u000001.
func Dial(base string, o Options) (*Client, error) {
	q := url.Values{
		"clientGroupID": {o.Group},
		"clientID":      {o.Client},
		"userID":        {"u000001"},
		"baseCookie":    {o.BaseCookie},
		"ts":            {strconv.FormatInt(time.Now().UnixMilli(), 10)},
		"lmid":          {"0"},
		"wsid":          {"ws-" + o.Client},
	}
	sp := map[string]any{}
	if o.AuthToken != "" {
		sp["authToken"] = o.AuthToken
	}
	if o.Init != "" {
		sp["initConnectionMessage"] = json.RawMessage(o.Init)
	}
	b, err := json.Marshal(sp)
	if err != nil {
		return nil, err
	}
	proto := strings.NewReplacer("+", "%2B", "/", "%2F", "=", "%3D").Replace(base64.StdEncoding.EncodeToString(b))
	d := websocket.Dialer{Subprotocols: []string{proto}, HandshakeTimeout: 30 * time.Second, ReadBufferSize: o.ReadBufferSize}
	u := "ws" + strings.TrimPrefix(base, "http") + "/sync/v51/connect?" + q.Encode()
	ws, _, err := d.Dial(u, nil)
	if err != nil {
		return nil, fmt.Errorf("dial group %s: %w", o.Group, err)
	}
	rt := o.ReadTimeout
	if rt == 0 {
		rt = DefaultReadTimeout
	}
	return &Client{ws: ws, group: o.Group, id: o.Client, readTimeout: rt}, nil
}

// ID is the client's id.
func (c *Client) ID() string { return c.id }

func (c *Client) Close() { _ = c.ws.Close() }

// Send writes one frame.
func (c *Client) Send(frame string) error {
	return c.ws.WriteMessage(websocket.TextMessage, []byte(frame))
}

// Push sends one custom mutation, the next of the client's ids, as the real
// client's push frame, and returns its id.
func (c *Client) Push(name, args string) (int, error) {
	c.lmid++
	now := time.Now().UnixMilli()
	frame := fmt.Sprintf(`["push",{"timestamp":%d,"clientGroupID":%q,"mutations":[{"type":"custom","timestamp":%d,"id":%d,"clientID":%q,"name":%q,"args":[%s]}],"pushVersion":1,"requestID":"%s-%d"}]`,
		now, c.group, now, c.lmid, c.id, name, args, c.id, c.lmid)
	return c.lmid, c.Send(frame)
}

// read returns the next frame's tag and the frame. An error frame is an
// error.
func (c *Client) read() (string, []byte, error) {
	_ = c.ws.SetReadDeadline(time.Now().Add(c.readTimeout))
	_, data, err := c.ws.ReadMessage()
	if err != nil {
		return "", nil, err
	}
	c.Bytes += len(data)
	// A frame is ["tag",{...}].
	rest, ok := bytes.CutPrefix(data, []byte(`["`))
	i := bytes.IndexByte(rest, '"')
	if !ok || i < 0 {
		return "", nil, fmt.Errorf("bad frame %.200s", data)
	}
	tag := string(rest[:i])
	if tag == "error" {
		return "", nil, fmt.Errorf("server error: %.500s", data)
	}
	return tag, data, nil
}

// ReadFrame returns the next frame's tag and the whole frame, for callers
// that scan frames themselves. An error frame is an error.
func (c *Client) ReadFrame() (string, []byte, error) { return c.read() }

// Expect reads frames up to one tagged tag, skipping pongs.
func (c *Client) Expect(tag string) error {
	for {
		got, data, err := c.read()
		if err != nil {
			return err
		}
		if got == tag {
			return nil
		}
		if got != "pong" {
			return fmt.Errorf("got %.200s; want %s", data, tag)
		}
	}
}

// Poke is what one poke carried, as far as the benchmarks care.
type Poke struct {
	Got     map[string]string // hash → op of the gotQueriesPatch
	LMIDs   map[string]int    // client → lastMutationIDChanges
	Rows    int               // row puts
	Markers []string          // issue titles put starting with the marker
	End     time.Time         // when its pokeEnd arrived
	Cookie  string            // the pokeEnd's cookie
}

// NextPoke reads one whole poke. Rows are counted without decoding them; a
// part is decoded only when it holds a gotQueriesPatch,
// lastMutationIDChanges or marker.
func (c *Client) NextPoke(marker string) (*Poke, error) {
	var p *Poke
	for {
		tag, data, err := c.read()
		if err != nil {
			return nil, err
		}
		switch tag {
		case "pokeStart":
			p = &Poke{Got: map[string]string{}, LMIDs: map[string]int{}}
		case "pokePart":
			if p == nil {
				return nil, fmt.Errorf("pokePart outside a poke: %.200s", data)
			}
			p.Rows += bytes.Count(data, []byte(`{"op":"put","tableName":`))
			hasMarker := marker != "" && bytes.Contains(data, []byte(marker))
			if !hasMarker && !bytes.Contains(data, []byte(`"gotQueriesPatch"`)) && !bytes.Contains(data, []byte(`"lastMutationIDChanges"`)) {
				continue
			}
			var frame [2]json.RawMessage
			if err := json.Unmarshal(data, &frame); err != nil {
				return nil, fmt.Errorf("decode pokePart: %w", err)
			}
			var f struct {
				GotQueriesPatch       []struct{ Op, Hash string } `json:"gotQueriesPatch"`
				LastMutationIDChanges map[string]int              `json:"lastMutationIDChanges"`
				RowsPatch             []struct {
					Op        string `json:"op"`
					TableName string `json:"tableName"`
					Value     struct {
						Title string `json:"title"`
					} `json:"value"`
				} `json:"rowsPatch"`
			}
			if err := json.Unmarshal(frame[1], &f); err != nil {
				return nil, fmt.Errorf("decode pokePart: %w", err)
			}
			for _, g := range f.GotQueriesPatch {
				p.Got[g.Hash] = g.Op
			}
			for k, v := range f.LastMutationIDChanges {
				p.LMIDs[k] = v
			}
			if hasMarker {
				for _, r := range f.RowsPatch {
					if r.Op == "put" && r.TableName == "issue" && strings.HasPrefix(r.Value.Title, marker) {
						p.Markers = append(p.Markers, r.Value.Title)
					}
				}
			}
		case "pokeEnd":
			if p == nil {
				return nil, fmt.Errorf("pokeEnd outside a poke: %.200s", data)
			}
			p.End = time.Now()
			var frame [2]json.RawMessage
			var end struct {
				Cookie string `json:"cookie"`
			}
			if json.Unmarshal(data, &frame) == nil && json.Unmarshal(frame[1], &end) == nil {
				p.Cookie = end.Cookie
			}
			return p, nil
		default:
			// pong, connected, pushResponse, pull responses and the like.
		}
	}
}

// WaitGot reads pokes until each hash has been put in a gotQueriesPatch of
// a finished poke, and returns when that last happened and the row puts
// seen.
func (c *Client) WaitGot(hashes ...string) (time.Time, int, error) {
	pending := map[string]bool{}
	for _, h := range hashes {
		pending[h] = true
	}
	rows := 0
	for {
		p, err := c.NextPoke("")
		if err != nil {
			return time.Time{}, rows, err
		}
		rows += p.Rows
		for h, op := range p.Got {
			if op == "put" {
				delete(pending, h)
			}
		}
		if len(pending) == 0 {
			return p.End, rows, nil
		}
	}
}

// WaitGone reads pokes until hash has been deleted from the got queries.
func (c *Client) WaitGone(hash string) error {
	for {
		p, err := c.NextPoke("")
		if err != nil {
			return err
		}
		if p.Got[hash] == "del" {
			return nil
		}
	}
}
