package main

// A minimal Zero sync protocol v51 client, after bench/viewsyncer's: enough
// to hold one query and time the pokes that change its rows.

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

// wsClient is one Zero client over a websocket.
type wsClient struct{ ws *websocket.Conn }

// dial connects a client of group, its initConnection carried in the
// Sec-WebSocket-Protocol header as the real client sends it.
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
	b, err := json.Marshal(map[string]any{"initConnectionMessage": json.RawMessage(init)})
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

// read returns the next frame's tag and the frame. An error frame is an
// error.
func (c *wsClient) read() (string, []byte, error) {
	_ = c.ws.SetReadDeadline(time.Now().Add(readTimeout))
	_, data, err := c.ws.ReadMessage()
	if err != nil {
		return "", nil, err
	}
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

// poke is what one poke carried, as far as the benchmark cares.
type poke struct {
	got     map[string]string // hash → op of the gotQueriesPatch
	markers []string          // issue titles starting with the marker
	end     time.Time         // when its pokeEnd arrived
}

// nextPoke reads one whole poke. Parts are decoded only when they hold a
// gotQueriesPatch or marker: the client shares the cores with the servers.
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
			gotPatch := bytes.Contains(data, []byte(`"gotQueriesPatch"`))
			hasMarker := marker != "" && bytes.Contains(data, []byte(marker))
			if !gotPatch && !hasMarker {
				continue
			}
			var frame [2]json.RawMessage
			if err := json.Unmarshal(data, &frame); err != nil {
				return nil, fmt.Errorf("decode pokePart: %w", err)
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
			if err := json.Unmarshal(frame[1], &f); err != nil {
				return nil, fmt.Errorf("decode pokePart: %w", err)
			}
			for _, g := range f.GotQueriesPatch {
				p.got[g.Hash] = g.Op
			}
			for _, r := range f.RowsPatch {
				if hasMarker && r.Op == "put" && r.TableName == "issue" && strings.HasPrefix(r.Value.Title, marker) {
					p.markers = append(p.markers, r.Value.Title)
				}
			}
		case "pokeEnd":
			if p == nil {
				return nil, fmt.Errorf("pokeEnd outside a poke: %.200s", data)
			}
			p.end = time.Now()
			return p, nil
		}
	}
}

// waitGot reads pokes until hash has been put in a gotQueriesPatch.
func (c *wsClient) waitGot(hash string) error {
	for {
		p, err := c.nextPoke("")
		if err != nil {
			return err
		}
		if p.got[hash] == "put" {
			return nil
		}
	}
}
