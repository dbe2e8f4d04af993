package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestHTTPHealth checks that / answers OK only once the replica is ready,
// while /keepalive answers OK throughout.
func TestHTTPHealth(t *testing.T) {
	h, err := listenHTTP(0, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	h.SetReady(ready.Load)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	base := "http://127.0.0.1:" + strconv.Itoa(h.Port())
	if code, body := getBody(t, base+"/"); code != http.StatusServiceUnavailable {
		t.Errorf("GET / before ready = %d %q; want 503", code, body)
	}
	if code, body := getBody(t, base+"/keepalive"); code != http.StatusOK || body != "OK" {
		t.Errorf("GET /keepalive before ready = %d %q; want 200 OK", code, body)
	}
	ready.Store(true)
	if code, body := getBody(t, base+"/"); code != http.StatusOK || body != "OK" {
		t.Errorf("GET / when ready = %d %q; want 200 OK", code, body)
	}
}

// TestKeepaliveDrains checks zero-cache's heartbeat monitor: off until the
// first /keepalive, then a drain once they stop for the timeout.
func TestKeepaliveDrains(t *testing.T) {
	const timeout = 400 * time.Millisecond
	h, err := listenHTTP(0, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	drained := make(chan time.Time, 1)
	h.keepalive = timeout
	h.drain = func() { drained <- time.Now() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	base := "http://127.0.0.1:" + strconv.Itoa(h.Port())
	// No heartbeat yet: the monitor is off.
	select {
	case <-drained:
		t.Fatal("drained before any /keepalive")
	case <-time.After(2 * timeout):
	}
	// Heartbeats more often than the timeout keep it serving.
	var last time.Time
	for range 6 {
		last = time.Now() // no later than the server's heartbeat
		if code, _ := getBody(t, base+"/keepalive"); code != http.StatusOK {
			t.Fatalf("GET /keepalive = %d", code)
		}
		select {
		case <-drained:
			t.Fatal("drained while /keepalive was called")
		case <-time.After(timeout / 4):
		}
	}
	select {
	case at := <-drained:
		if gap := at.Sub(last); gap < timeout {
			t.Errorf("drained %v after the last heartbeat; want at least %v", gap, timeout)
		}
	case <-time.After(10 * timeout):
		t.Fatal("no drain after the heartbeats stopped")
	}
}

// TestMetricsListen: with JETSYNC_METRICS_LISTEN, /metrics is served on
// its own listener and no longer on the port; without, on the port.
func TestMetricsListen(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "jetsync_test_total", Help: "A test counter."}))
	for _, moved := range []bool{false, true} {
		rf := &roleFlags{}
		if moved {
			rf.metricsListen = "127.0.0.1:0"
		}
		h, err := rf.listenHTTP(reg, slog.New(slog.DiscardHandler), func() bool { return true })
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- h.Run(ctx) }()
		port := "http://127.0.0.1:" + strconv.Itoa(h.Port()) + "/metrics"
		code, body := getBody(t, port)
		switch {
		case !moved && (code != http.StatusOK || !strings.Contains(body, "jetsync_test_total")):
			t.Errorf("GET %s = %d %.200q; want the metrics", port, code, body)
		case moved && code != http.StatusNotFound:
			t.Errorf("GET %s with the metrics moved = %d; want 404", port, code)
		}
		if moved {
			own := "http://" + h.MetricsAddr() + "/metrics"
			if code, body := getBody(t, own); code != http.StatusOK || !strings.Contains(body, "jetsync_test_total") {
				t.Errorf("GET %s = %d %.200q; want the metrics", own, code, body)
			}
		} else if h.MetricsAddr() != "" {
			t.Errorf("metrics listener %s; want none", h.MetricsAddr())
		}
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
