package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDemoPage_Routes checks where the demo page answers: / gives it to a
// browser asking for HTML and keeps the readiness answer for every other
// request (load balancers, tests, curl), before and after the replica is
// there; /demo serves it too. Built or not, the page is HTML: the bundle,
// or the note saying how to build it.
func TestDemoPage_Routes(t *testing.T) {
	h, err := listenHTTP(0, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ready := false
	h.SetReady(func() bool { return ready })
	a := &syncFlags{}
	closeDemo, err := serveDemo(context.Background(), h, a, "postgres://127.0.0.1:1/none", "zero_0", true, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeDemo()
	base := "http://127.0.0.1:" + strconv.Itoa(h.Port())
	if want := base + demoMutatePath; len(a.api.Mutate.URLs) != 1 || a.api.Mutate.URLs[0] != want {
		t.Errorf("mutate URLs = %q; want the built-in endpoint %q", a.api.Mutate.URLs, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	get := func(path, accept string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	const browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
	isPage := func(code int, ctype, body string) bool {
		return code == 200 && strings.HasPrefix(ctype, "text/html") && strings.Contains(body, "jetsync")
	}
	if code, _, body := get("/", ""); code != http.StatusServiceUnavailable {
		t.Errorf("GET / before ready = %d %q; want 503", code, body)
	}
	if code, _, body := get("/", "*/*"); code != http.StatusServiceUnavailable {
		t.Errorf("GET / (Accept */*) before ready = %d %q; want 503", code, body)
	}
	if code, ctype, body := get("/", browser); !isPage(code, ctype, body) {
		t.Errorf("GET / from a browser = %d %s %.80q; want the page", code, ctype, body)
	}
	ready = true
	if code, _, body := get("/", ""); code != 200 || body != "OK" {
		t.Errorf("GET / when ready = %d %q; want 200 OK", code, body)
	}
	for _, p := range []string{"/demo", "/demo/"} {
		if code, ctype, body := get(p, ""); !isPage(code, ctype, body) {
			t.Errorf("GET %s = %d %s %.80q; want the page", p, code, ctype, body)
		}
	}
	if code, _, _ := get("/demo/README.md", ""); code != http.StatusNotFound && demoPageBuilt() {
		t.Errorf("GET /demo/README.md = %d; want 404", code)
	}
	if demoPageBuilt() {
		if code, ctype, body := get("/demo/demo.js", ""); code != 200 || !strings.Contains(ctype, "javascript") || len(body) < 1000 {
			t.Errorf("GET /demo/demo.js = %d %s, %d bytes; want the bundle", code, ctype, len(body))
		}
	}
}

// TestDemoPage_KeepsMutateURL checks that a configured ZERO_MUTATE_URL wins
// over the built-in endpoint.
func TestDemoPage_KeepsMutateURL(t *testing.T) {
	h, err := listenHTTP(0, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	a := &syncFlags{}
	a.api.Mutate.URLs = []string{"http://api.example/mutate"}
	closeDemo, err := serveDemo(context.Background(), h, a, "", "zero_0", false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeDemo()
	if len(a.api.Mutate.URLs) != 1 || a.api.Mutate.URLs[0] != "http://api.example/mutate" {
		t.Errorf("mutate URLs = %q; want the configured one kept", a.api.Mutate.URLs)
	}
	if h.rootPage != nil {
		t.Error("a real upstream's / serves the page; want it at /demo only")
	}
}
