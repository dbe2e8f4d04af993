package viewsyncer

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// inspect sends one inspect op and reads its answer, skipping pokes.
func (c *tc) inspect(body string) inspectDown {
	c.t.Helper()
	c.send(`["inspect",` + body + `]`)
	// The client waits for the answer without a timeout; the test not.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if time.Now().After(deadline) {
			c.t.Fatalf("no answer to inspect %s", body)
		}
		tag, b := readFrame(c.t, c.ws)
		if tag != "inspect" {
			continue // pongs, pokes of the group's advance
		}
		var d inspectDown
		var raw struct {
			Op    string          `json:"op"`
			ID    string          `json:"id"`
			Value json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal(b, &raw); err != nil {
			c.t.Fatalf("inspect answer %s: %v", b, err)
		}
		d.Op, d.ID, d.Value = raw.Op, raw.ID, raw.Value
		return d
	}
}

func valueOf[T any](t *testing.T, d inspectDown) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(d.Value.(json.RawMessage), &v); err != nil {
		t.Fatalf("%s value %s: %v", d.Op, d.Value, err)
	}
	return v
}

func TestInspect(t *testing.T) {
	e := newEnv(t, envOptions{issues: 30, adminPassword: "s3cret"})
	labels := `{"table":"label","orderBy":[["id","asc"]]}`
	c := connect(t, e, dialOpts{group: "g1", client: "c1"})
	c.expect("connected")
	c.send(initFrame(testSchema, put("q1", labels, 300000)))
	c.poke()
	c.poke()

	// Before authenticating, every op gets the challenge.
	if d := c.inspect(`{"op":"version","id":"1"}`); d.Op != "authenticated" || d.ID != "1" || valueOf[bool](t, d) {
		t.Fatalf("version before authenticate = %+v; want authenticated false", d)
	}
	if d := c.inspect(`{"op":"authenticate","id":"2","value":"wrong"}`); d.Op != "authenticated" || valueOf[bool](t, d) {
		t.Fatalf("wrong password = %+v; want authenticated false", d)
	}
	if d := c.inspect(`{"op":"queries","id":"3"}`); d.Op != "authenticated" {
		t.Fatalf("queries after a wrong password = %+v; want the challenge", d)
	}
	if d := c.inspect(`{"op":"authenticate","id":"4","value":"s3cret"}`); d.Op != "authenticated" || !valueOf[bool](t, d) {
		t.Fatalf("right password = %+v; want authenticated true", d)
	}

	if d := c.inspect(`{"op":"version","id":"5"}`); d.Op != "version" || valueOf[string](t, d) != "jetsync test" {
		t.Errorf("version = %+v", d)
	}

	d := c.inspect(`{"op":"queries","id":"6"}`)
	rows := valueOf[[]struct {
		ClientID      string          `json:"clientID"`
		QueryID       string          `json:"queryID"`
		AST           json.RawMessage `json:"ast"`
		Name          *string         `json:"name"`
		Got           bool            `json:"got"`
		TTL           float64         `json:"ttl"`
		InactivatedAt *float64        `json:"inactivatedAt"`
		RowCount      int             `json:"rowCount"`
		Metrics       map[string]any  `json:"metrics"`
	}](t, d)
	if d.Op != "queries" || len(rows) != 1 {
		t.Fatalf("queries = %+v; want one row", d)
	}
	r := rows[0]
	if r.ClientID != "c1" || r.QueryID != "q1" || !r.Got || r.TTL != 300000 || r.RowCount != 20 ||
		r.Name != nil || r.InactivatedAt != nil || string(r.AST) == "null" {
		t.Errorf("query row = %+v", r)
	}
	if _, ok := r.Metrics["query-hydration-server-ms"].(float64); !ok {
		t.Errorf("query metrics = %v; want query-hydration-server-ms", r.Metrics)
	}
	if td, ok := r.Metrics["query-update-server"].([]any); !ok || len(td) != 1 {
		t.Errorf("query-update-server = %v; want an empty digest", r.Metrics["query-update-server"])
	}

	m := valueOf[map[string][]float64](t, c.inspect(`{"op":"metrics","id":"7"}`))
	if mat := m["query-materialization-server"]; len(mat) < 3 || mat[0] != digestCompression || mat[2] < 1 {
		t.Errorf("query-materialization-server = %v; want a digest of the hydration", mat)
	}
	if _, ok := m["query-update-server"]; !ok {
		t.Errorf("metrics = %v; want query-update-server", m)
	}

	d = c.inspect(fmt.Sprintf(`{"op":"analyze-query","id":"8","ast":%s,"options":{"syncedRows":true}}`, labels))
	res := valueOf[struct {
		Warnings       []string            `json:"warnings"`
		SyncedRows     map[string][]any    `json:"syncedRows"`
		SyncedRowCount int                 `json:"syncedRowCount"`
		Start          float64             `json:"start"`
		Elapsed        *float64            `json:"elapsed"`
		SQLitePlans    map[string][]string `json:"sqlitePlans"`
		ReadRowCount   int                 `json:"readRowCount"`
	}](t, d)
	if d.Op != "analyze-query" || res.SyncedRowCount != 20 || len(res.SyncedRows["label"]) != 20 ||
		res.ReadRowCount < 20 || res.Elapsed == nil || res.Start == 0 || len(res.SQLitePlans) == 0 {
		t.Fatalf("analyze-query = %s", d.Value)
	}
	for sql, plan := range res.SQLitePlans {
		if len(plan) == 0 {
			t.Errorf("plan of %s is empty", sql)
		}
	}
	// The deprecated value field carries the AST too.
	if d := c.inspect(fmt.Sprintf(`{"op":"analyze-query","id":"9","value":%s}`, labels)); d.Op != "analyze-query" {
		t.Errorf("analyze-query with value = %+v", d)
	}
	if d := c.inspect(`{"op":"analyze-query","id":"10"}`); d.Op != "error" || d.ID != "10" {
		t.Errorf("analyze-query without an AST = %+v; want an error", d)
	}
	if d := c.inspect(`{"op":"analyze-query","id":"11","ast":{"table":"nope"}}`); d.Op != "error" {
		t.Errorf("analyze-query of an unknown table = %+v; want an error", d)
	}

	if d := c.inspect(`{"op":"frobnicate","id":"12"}`); d.Op != "error" || d.ID != "12" ||
		valueOf[string](t, d) != `unknown inspect op "frobnicate"` {
		t.Errorf("unknown op = %+v; want an error", d)
	}
	// The connection stays up.
	c.send(`["ping",{}]`)
	for tag, _ := readFrame(t, c.ws); tag != "pong"; tag, _ = readFrame(t, c.ws) {
	}
}

func TestInspect_DevelopmentMode(t *testing.T) {
	for _, tc := range []struct {
		name, want, given string
		dev, ok           bool
	}{
		{"dev without password", "", "", true, true},
		{"dev, client sends one", "", "x", true, false},
		{"no password, production", "", "", false, false},
		{"password set, dev", "pw", "", true, false},
		{"right password", "pw", "pw", false, true},
		{"wrong password", "pw", "pX", false, false},
		{"prefix of password", "pw", "p", false, false},
	} {
		if got := AdminPasswordValid(Config{AdminPassword: tc.want, DevelopmentMode: tc.dev}, tc.given); got != tc.ok {
			t.Errorf("%s: valid = %v; want %v", tc.name, got, tc.ok)
		}
	}
}

func TestDigest(t *testing.T) {
	var d digest
	for i := range 1000 {
		d.add(float64(i))
	}
	j := d.json()
	if len(j)%2 != 1 || j[0] != digestCompression || (len(j)-1)/2 > 2*maxCentroids {
		t.Fatalf("digest json has %d numbers", len(j))
	}
	var w, sum float64
	for i := 1; i < len(j); i += 2 {
		sum += j[i] * j[i+1]
		w += j[i+1]
	}
	if w != 1000 || sum/w != 499.5 {
		t.Errorf("weight %v mean %v; want 1000 and 499.5", w, sum/w)
	}
}

func TestServer_ProtocolVersionRange(t *testing.T) {
	e := newEnv(t, envOptions{issues: 1})
	// zero-cache 1.9.0 accepts v30 to v51.
	for _, v := range []int{30, 51} {
		c := connect(t, e, dialOpts{path: fmt.Sprintf("/sync/v%d/connect", v), group: fmt.Sprintf("pv%d", v), client: "c1"})
		c.expect("connected")
	}
	c := connect(t, e, dialOpts{path: "/sync/v29/connect", group: "pv29", client: "c1"})
	c.expectError(kindVersionNotSupported,
		"server is at sync protocol v51 and does not support v29. The client must be updated to a newer release.", closeNormal)
	c = connect(t, e, dialOpts{path: "/sync/v52/connect", group: "pv52", client: "c1"})
	c.expectError(kindVersionNotSupported,
		"server is at sync protocol v51 and does not support v52. The server must be updated to a newer release.", closeNormal)
}
