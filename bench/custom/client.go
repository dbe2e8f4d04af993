package main

// A minimal Zero sync protocol v51 client, after bench/viewsyncer's, that
// also desires synced queries by name and pushes custom mutations.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
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
const readTimeout = time.Minute

// astPut and syncedPut are desired-query puts as the real client sends
// them: a legacy query carries its AST, a synced query its name and args.
func astPut(hash, ast string, ttlMS int) string {
	return fmt.Sprintf(`{"op":"put","hash":%q,"ast":%s,"ttl":%d}`, hash, ast, ttlMS)
}

func syncedPut(hash, name, args string, ttlMS int) string {
	return fmt.Sprintf(`{"op":"put","hash":%q,"name":%q,"args":[%s],"ttl":%d}`, hash, name, args, ttlMS)
}

func initConnection(puts ...string) string {
	return `["initConnection",{"desiredQueriesPatch":[` + strings.Join(puts, ",") + `],"clientSchema":` + clientSchema + `}]`
}

// wsClient is one Zero client speaking sync protocol v51 over a websocket.
type wsClient struct {
	ws            *websocket.Conn
	group, client string
	lmid          int // the last mutation id pushed
}

// dial connects client of group as user u000001 with token, its JWT; init,
// when set, is the initConnection carried in the Sec-WebSocket-Protocol
// header, as the real client sends it.
func dial(base, token, group, client, init string) (*wsClient, error) {
	q := url.Values{
		"clientGroupID": {group},
		"clientID":      {client},
		"userID":        {"u000001"},
		"baseCookie":    {""},
		"ts":            {strconv.FormatInt(time.Now().UnixMilli(), 10)},
		"lmid":          {"0"},
		"wsid":          {"ws-" + client},
	}
	sp := map[string]any{"authToken": token}
	if init != "" {
		sp["initConnectionMessage"] = json.RawMessage(init)
	}
	b, err := json.Marshal(sp)
	if err != nil {
		return nil, err
	}
	proto := strings.NewReplacer("+", "%2B", "/", "%2F", "=", "%3D").Replace(base64.StdEncoding.EncodeToString(b))
	d := websocket.Dialer{Subprotocols: []string{proto}, HandshakeTimeout: 30 * time.Second}
	u := "ws" + strings.TrimPrefix(base, "http") + "/sync/v51/connect?" + q.Encode()
	ws, _, err := d.Dial(u, nil)
	if err != nil {
		return nil, fmt.Errorf("dial group %s: %w", group, err)
	}
	return &wsClient{ws: ws, group: group, client: client}, nil
}

func (c *wsClient) close() { _ = c.ws.Close() }

func (c *wsClient) send(frame string) error {
	return c.ws.WriteMessage(websocket.TextMessage, []byte(frame))
}

// push sends one custom mutation, the next of the client's ids, as the real
// client's push frame, and returns its id.
func (c *wsClient) push(name, args string) (int, error) {
	c.lmid++
	now := time.Now().UnixMilli()
	frame := fmt.Sprintf(`["push",{"timestamp":%d,"clientGroupID":%q,"mutations":[{"type":"custom","timestamp":%d,"id":%d,"clientID":%q,"name":%q,"args":[%s]}],"pushVersion":1,"requestID":"%s-%d"}]`,
		now, c.group, now, c.lmid, c.client, name, args, c.client, c.lmid)
	return c.lmid, c.send(frame)
}

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
	got    map[string]string // hash → op of the gotQueriesPatch
	rows   int               // row puts
	lmids  map[string]int    // lastMutationIDChanges
	titles []string          // issue titles put
	end    time.Time         // when its pokeEnd arrived
}

// nextPoke reads one whole poke.
func (c *wsClient) nextPoke() (*poke, error) {
	var p *poke
	for {
		tag, data, err := c.read()
		if err != nil {
			return nil, err
		}
		switch tag {
		case "pokeStart":
			p = &poke{got: map[string]string{}, lmids: map[string]int{}}
		case "pokePart":
			if p == nil {
				return nil, fmt.Errorf("pokePart outside a poke: %.200s", data)
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
				p.got[g.Hash] = g.Op
			}
			for k, v := range f.LastMutationIDChanges {
				p.lmids[k] = v
			}
			for _, r := range f.RowsPatch {
				if r.Op != "put" {
					continue
				}
				p.rows++
				if r.TableName == "issue" {
					p.titles = append(p.titles, r.Value.Title)
				}
			}
		case "pokeEnd":
			if p == nil {
				return nil, fmt.Errorf("pokeEnd outside a poke: %.200s", data)
			}
			p.end = time.Now()
			return p, nil
		default:
			// pong, connected, pushResponse and the like.
		}
	}
}

// waitGot reads pokes until hash has been put in a gotQueriesPatch of a
// finished poke, and returns when that happened and the row puts seen.
func (c *wsClient) waitGot(hash string) (time.Time, int, error) {
	rows := 0
	for {
		p, err := c.nextPoke()
		if err != nil {
			return time.Time{}, rows, err
		}
		rows += p.rows
		if p.got[hash] == "put" {
			return p.end, rows, nil
		}
	}
}

// waitGone reads pokes until hash has been deleted from the got queries.
func (c *wsClient) waitGone(hash string) error {
	for {
		p, err := c.nextPoke()
		if err != nil {
			return err
		}
		if p.got[hash] == "del" {
			return nil
		}
	}
}
