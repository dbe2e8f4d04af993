package main

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

// readTimeout bounds the wait for any one frame.
const readTimeout = 2 * time.Minute

// query is a legacy (AST) query as a client desires it.
type query struct {
	hash string
	ast  string
}

func newQuery(ast string) query {
	h := fnv.New64a()
	h.Write([]byte(ast))
	return query{hash: strconv.FormatUint(h.Sum64(), 36), ast: ast}
}

func (q query) put(ttlMS int) string {
	return fmt.Sprintf(`{"op":"put","hash":%q,"ast":%s,"ttl":%d}`, q.hash, q.ast, ttlMS)
}

func initConnection(puts ...string) string {
	return `["initConnection",{"desiredQueriesPatch":[` + strings.Join(puts, ",") + `],"clientSchema":` + clientSchema + `}]`
}

// wsClient is one Zero client speaking sync protocol v51 over a websocket.
type wsClient struct {
	ws *websocket.Conn
	// bytes counts the frames read.
	bytes int
}

// dial connects a client of group; init, when set, is the initConnection
// carried in the Sec-WebSocket-Protocol header, as the real client sends it.
func dial(base, group, client, init string) (*wsClient, error) {
	q := url.Values{
		"clientGroupID": {group},
		"clientID":      {client},
		"userID":        {"u000001"},
		"baseCookie":    {""},
		"ts":            {strconv.FormatInt(time.Now().UnixMilli(), 10)},
		"lmid":          {"0"},
		"wsid":          {"ws-" + client},
	}
	sp := map[string]any{}
	if init != "" {
		sp["initConnectionMessage"] = json.RawMessage(init)
	}
	b, err := json.Marshal(sp)
	if err != nil {
		return nil, err
	}
	proto := strings.NewReplacer("+", "%2B", "/", "%2F", "=", "%3D").Replace(base64.StdEncoding.EncodeToString(b))
	d := websocket.Dialer{Subprotocols: []string{proto}, HandshakeTimeout: 30 * time.Second, ReadBufferSize: 64 << 10}
	u := "ws" + strings.TrimPrefix(base, "http") + "/sync/v51/connect?" + q.Encode()
	ws, _, err := d.Dial(u, nil)
	if err != nil {
		return nil, fmt.Errorf("dial group %s: %w", group, err)
	}
	return &wsClient{ws: ws}, nil
}

func (c *wsClient) close() { _ = c.ws.Close() }

func (c *wsClient) send(frame string) error {
	return c.ws.WriteMessage(websocket.TextMessage, []byte(frame))
}

// read returns the next frame's tag and the frame. An error frame is an
// error.
func (c *wsClient) read() (string, []byte, error) {
	_ = c.ws.SetReadDeadline(time.Now().Add(readTimeout))
	_, data, err := c.ws.ReadMessage()
	if err != nil {
		return "", nil, err
	}
	c.bytes += len(data)
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

// expect reads frames up to one tagged tag, skipping pongs.
func (c *wsClient) expect(tag string) error {
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

// poke is what one poke carried, as far as the benchmark cares.
type poke struct {
	got     map[string]string // hash → op of the gotQueriesPatch
	rows    int               // row puts
	markers []string          // issue titles carrying the marker prefix
	end     time.Time         // when its pokeEnd arrived
}

// nextPoke reads one whole poke. Rows are counted without decoding them: the
// benchmark client shares the two cores with the server. Titles are decoded
// only from parts that hold marker.
func (c *wsClient) nextPoke(marker string) (*poke, error) {
	var p *poke
	for {
		tag, data, err := c.read()
		if err != nil {
			return nil, err
		}
		switch tag {
		case "pokeStart":
			p = &poke{got: map[string]string{}}
		case "pokePart":
			if p == nil {
				return nil, fmt.Errorf("pokePart outside a poke: %.200s", data)
			}
			p.rows += bytes.Count(data, []byte(`{"op":"put","tableName":`))
			gotPatch := bytes.Contains(data, []byte(`"gotQueriesPatch"`))
			hasMarker := marker != "" && bytes.Contains(data, []byte(marker))
			if !gotPatch && !hasMarker {
				continue
			}
			var f struct {
				GotQueriesPatch []struct{ Op, Hash string } `json:"gotQueriesPatch"`
				RowsPatch       []struct {
					Op        string `json:"op"`
					TableName string `json:"tableName"`
					Value     struct {
						Title string `json:"title"`
					} `json:"value"`
				} `json:"rowsPatch"`
			}
			var frame [2]json.RawMessage
			if err := json.Unmarshal(data, &frame); err != nil {
				return nil, fmt.Errorf("decode pokePart: %w", err)
			}
			if err := json.Unmarshal(frame[1], &f); err != nil {
				return nil, fmt.Errorf("decode pokePart: %w", err)
			}
			for _, g := range f.GotQueriesPatch {
				p.got[g.Hash] = g.Op
			}
			if hasMarker {
				for _, r := range f.RowsPatch {
					if r.Op == "put" && r.TableName == "issue" && strings.HasPrefix(r.Value.Title, marker) {
						p.markers = append(p.markers, r.Value.Title)
					}
				}
			}
		case "pokeEnd":
			if p == nil {
				return nil, fmt.Errorf("pokeEnd outside a poke: %.200s", data)
			}
			p.end = time.Now()
			return p, nil
		case "pong", "connected":
		default:
			// Other frames (for example pull responses) don't concern us.
		}
	}
}

// waitGot reads pokes until each hash has been put in a gotQueriesPatch of
// a finished poke, and returns when that last happened and the rows seen.
func (c *wsClient) waitGot(hashes ...string) (time.Time, int, error) {
	pending := map[string]bool{}
	for _, h := range hashes {
		pending[h] = true
	}
	rows := 0
	for {
		p, err := c.nextPoke("")
		if err != nil {
			return time.Time{}, rows, err
		}
		rows += p.rows
		for h, op := range p.got {
			if op == "put" {
				delete(pending, h)
			}
		}
		if len(pending) == 0 {
			return p.end, rows, nil
		}
	}
}
