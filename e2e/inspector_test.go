package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestZeroClient_Inspector drives the real client's zero.inspector API
// (client/inspector.mjs) against `jetsync run` with ZERO_ADMIN_PASSWORD
// and an API server for named queries: every call answers, a wrong
// password is refused. /statz and /heapz take the same password.
func TestZeroClient_Inspector(t *testing.T) {
	const password = "inspect-e2e-pw"
	app := newCVRApp(t, 200)
	api := startAPIServer(t, app.node, app.upstream)
	p := start(t, app.runEnv(t, 0, "ZERO_ADMIN_PASSWORD="+password, "ZERO_QUERY_URL="+api.url+"/query"), "run")
	port := int(p.logRecord(t, "http listening", 60*time.Second)["port"].(float64))
	srv := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, p, srv, 90*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, app.node, "inspector.mjs", srv, "u000001", signToken(t, zeroSecret, "u000001", time.Hour), password)
	cmd.Dir = "client"
	cmd.Env = baseEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("inspector.mjs: %v\n%s", err, stderr.String())
	}
	t.Logf("inspector.mjs: %s", out)
	type result struct {
		OK    json.RawMessage `json:"ok"`
		Error string          `json:"error"`
	}
	var res map[string]result
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("inspector.mjs said %s: %v", out, err)
	}
	if f, ok := res["fatal"]; ok {
		t.Fatalf("inspector.mjs failed: %s", f.OK)
	}
	get := func(name string, v any) {
		t.Helper()
		r, ok := res[name]
		if !ok || r.Error != "" {
			t.Errorf("%s: %+v; want an answer", name, r)
			return
		}
		if err := json.Unmarshal(r.OK, v); err != nil {
			t.Errorf("%s: %s: %v", name, r.OK, err)
		}
	}

	var ok bool
	if get("wrongPassword", &ok); ok {
		t.Errorf("a wrong password was accepted")
	}
	if r := res["versionUnauthenticated"]; r.Error == "" {
		t.Errorf("version unauthenticated = %+v; want a refusal", r)
	}
	if get("authenticate", &ok); !ok {
		t.Errorf("the admin password was refused")
	}
	var version string
	if get("version", &version); !strings.HasPrefix(version, "jetsync ") || !strings.Contains(version, "sync protocol: 30-51") {
		t.Errorf("version = %q; want what jetsync version prints", version)
	}
	var queries []struct {
		ID               string  `json:"id"`
		Got              bool    `json:"got"`
		TTL              string  `json:"ttl"`
		RowCount         int     `json:"rowCount"`
		ServerZQL        *string `json:"serverZQL"`
		HydrationsServer int     `json:"hydrationsServer"`
	}
	get("queries", &queries)
	found := false
	for _, q := range queries {
		if q.Got && q.ServerZQL != nil && strings.HasPrefix(*q.ServerZQL, "issue") && q.RowCount >= 5 && q.TTL != "" && q.HydrationsServer == 1 {
			found = true
		}
	}
	if !found {
		t.Errorf("queries = %+v; want the synced window with its AST, rows, TTL and hydration time", queries)
	}
	var metrics map[string]any
	if get("metrics", &metrics); len(metrics) == 0 {
		t.Errorf("metrics = %v", metrics)
	} else if n, _ := metrics["query-materialization-server"].(float64); n < 1 {
		t.Errorf("query-materialization-server counts %v; want the hydrations", metrics["query-materialization-server"])
	}
	type analysis struct {
		SyncedRowCount int      `json:"syncedRowCount"`
		SyncedRows     []string `json:"syncedRows"`
		ReadRowCount   int      `json:"readRowCount"`
		Elapsed        *float64 `json:"elapsed"`
		Plans          int      `json:"plans"`
	}
	// The shapes' issues, plus their owners where related.
	for name, issues := range map[string]int{"analyzeQuery": 5, "analyzeServerAST": 3, "analyzeNamedQuery": 4} {
		var a analysis
		if get(name, &a); a.SyncedRowCount < issues || a.SyncedRowCount > 2*issues || a.Elapsed == nil || a.Plans == 0 || a.ReadRowCount < issues {
			t.Errorf("%s = %+v; want %d issues synced, timing and plans", name, a, issues)
		}
	}

	t.Run("StatzHeapz", func(t *testing.T) {
		for _, path := range []string{"/statz", "/heapz"} {
			for _, pw := range []string{"", "wrong"} {
				req, _ := http.NewRequest("GET", srv+path, nil)
				if pw != "" {
					req.SetBasicAuth("admin", pw)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
					t.Errorf("%s with %q: %d; want 401 with a challenge", path, pw, resp.StatusCode)
				}
			}
			req, _ := http.NewRequest("GET", srv+path, nil)
			req.SetBasicAuth("anyone", password)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || len(body) == 0 {
				t.Errorf("%s: %d, %d bytes; want 200 and a body", path, resp.StatusCode, len(body))
			}
			if path == "/statz" && !strings.Contains(string(body), "goroutines") {
				t.Errorf("/statz = %s", body)
			}
		}
	})
}
