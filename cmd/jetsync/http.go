package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// httpServer serves zero-cache's health check at /, its heartbeat at
// /keepalive and metrics at /metrics. Roles add their own routes (the
// view-syncer's sync endpoint) with Handle before Run.
type httpServer struct {
	ln  net.Listener
	mux *http.ServeMux
	log *slog.Logger
	// ready reports whether the process can serve a query (its replica
	// exists): zero-cache listens only then, so / answers OK only then.
	ready atomic.Pointer[func() bool]
	// keepalive, when set before Run, drains the process once /keepalive
	// stopped being called for that long, after it was called once.
	keepalive time.Duration
	heartbeat *heartbeat
	// drain starts a graceful shutdown; nil: SIGTERM to this process, as
	// zero-cache's heartbeat monitor does.
	drain func()
	// rootPage, when set before Run, answers a browser asking / for HTML
	// (the demo page); every other GET / keeps the readiness answer.
	rootPage http.Handler
	// admin guards /statz and /heapz (admin.go).
	admin adminAuth
	// metrics serves /metrics; metricsLn, when set before Run, is the
	// listener it moved to, and the port above no longer serves it.
	metrics   http.Handler
	metricsLn net.Listener
}

// listenHTTP binds port at once, so that the address is known (port 0 picks a
// free one) and a busy port fails startup rather than a later goroutine.
func listenHTTP(port int, reg prometheus.Gatherer, log *slog.Logger) (*httpServer, error) {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("listen on port %d: %w", port, err)
	}
	mux := http.NewServeMux()
	h := &httpServer{ln: ln, mux: mux, log: log}
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if h.rootPage != nil && wantsHTML(r) {
			h.rootPage.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ready := h.ready.Load(); ready != nil && !(*ready)() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("Not ready: no replica yet"))
			return
		}
		_, _ = w.Write([]byte("OK"))
	})
	mux.HandleFunc("GET /keepalive", func(w http.ResponseWriter, r *http.Request) {
		if hb := h.heartbeat; hb != nil {
			hb.beat(r)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("OK"))
	})
	mux.HandleFunc("GET /statz", h.statz)
	mux.HandleFunc("GET /heapz", h.heapz)
	h.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn), ErrorHandling: promhttp.ContinueOnError})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if h.metricsLn != nil {
			http.NotFound(w, r)
			return
		}
		h.metrics.ServeHTTP(w, r)
	})
	return h, nil
}

// logListening logs where the server listens, and where /metrics is.
func (h *httpServer) logListening() {
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", h.Port())
	if h.metricsLn != nil {
		metrics = "http://" + h.metricsLn.Addr().String() + "/metrics"
	}
	h.log.Info("http listening", "addr", h.ln.Addr().String(), "port", h.Port(), "metrics", metrics)
}

// moveMetrics binds addr (JETSYNC_METRICS_LISTEN) at once and serves
// /metrics there, and only there, from Run on.
func (h *httpServer) moveMetrics(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listen on %s: %w", addr, err)
	}
	h.metricsLn = ln
	return nil
}

// MetricsAddr is the metrics listener's address, or "" when /metrics is
// on the main port.
func (h *httpServer) MetricsAddr() string {
	if h.metricsLn == nil {
		return ""
	}
	return h.metricsLn.Addr().String()
}

// Port is the bound port.
func (h *httpServer) Port() int { return h.ln.Addr().(*net.TCPAddr).Port }

// SetReady makes / answer OK only while ready reports true.
func (h *httpServer) SetReady(ready func() bool) { h.ready.Store(&ready) }

// Handle adds a route.
func (h *httpServer) Handle(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

// Run serves until ctx is cancelled, then gives open requests a few seconds.
func (h *httpServer) Run(ctx context.Context) error {
	srv := &http.Server{
		Handler:           h.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	if h.keepalive > 0 {
		drain := h.drain
		if drain == nil {
			drain = func() { _ = syscall.Kill(os.Getpid(), syscall.SIGTERM) }
		}
		h.heartbeat = newHeartbeat(ctx, h.keepalive, h.log, drain)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(h.ln) }()
	var msrv *http.Server
	if h.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", h.metrics)
		msrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: srv.ErrorLog}
		go func() {
			if err := msrv.Serve(h.metricsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Warn("metrics serve", "err", err)
			}
		}()
	}
	select {
	case err := <-errc:
		if msrv != nil {
			_ = msrv.Close()
		}
		return fmt.Errorf("http serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if msrv != nil {
		// Scraped to the end: a last scrape sees the final figures.
		_ = msrv.Shutdown(sctx)
	}
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http serve: %w", err)
	}
	return nil
}

// heartbeat watches the /keepalive calls (zero-cache's
// ZERO_KEEPALIVE_TIMEOUT_MS, for load balancers such as ECS that signal a
// deregistered target only by no longer checking it): from the first call
// on, a gap of timeout drains the process, as SIGTERM does.
type heartbeat struct {
	mu      sync.Mutex
	last    time.Time
	started bool
	ctx     context.Context
	timeout time.Duration
	log     *slog.Logger
	drain   func()
}

func newHeartbeat(ctx context.Context, timeout time.Duration, log *slog.Logger, drain func()) *heartbeat {
	return &heartbeat{ctx: ctx, timeout: timeout, log: log, drain: drain}
}

func (hb *heartbeat) beat(r *http.Request) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	hb.last = time.Now()
	if hb.started {
		return
	}
	hb.started = true
	hb.log.Info("starting heartbeat monitor", "timeout", hb.timeout, "user_agent", r.UserAgent())
	go hb.watch()
}

func (hb *heartbeat) watch() {
	t := time.NewTicker(hb.timeout / 4)
	defer t.Stop()
	for {
		select {
		case <-hb.ctx.Done():
			return
		case <-t.C:
		}
		hb.mu.Lock()
		since := time.Since(hb.last)
		hb.mu.Unlock()
		if since >= hb.timeout {
			hb.log.Info("no heartbeat at /keepalive; draining", "since", since)
			hb.drain()
			return
		}
	}
}

// Close releases the listeners of a server that never ran.
func (h *httpServer) Close() error {
	if h.metricsLn != nil {
		_ = h.metricsLn.Close()
	}
	return h.ln.Close()
}
