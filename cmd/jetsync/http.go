package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// httpServer serves zero-cache's health check at / and metrics at /metrics.
// Roles add their own routes (the view-syncer's sync endpoint) with Handle
// before Run.
type httpServer struct {
	ln  net.Listener
	mux *http.ServeMux
	log *slog.Logger
}

// listenHTTP binds port at once, so that the address is known (port 0 picks a
// free one) and a busy port fails startup rather than a later goroutine.
func listenHTTP(port int, reg prometheus.Gatherer, log *slog.Logger) (*httpServer, error) {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("listen on port %d: %w", port, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("OK"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn), ErrorHandling: promhttp.ContinueOnError}))
	h := &httpServer{ln: ln, mux: mux, log: log}
	log.Info("http listening", "addr", ln.Addr().String(), "port", h.Port(),
		"metrics", fmt.Sprintf("http://127.0.0.1:%d/metrics", h.Port()))
	return h, nil
}

// Port is the bound port.
func (h *httpServer) Port() int { return h.ln.Addr().(*net.TCPAddr).Port }

// Handle adds a route.
func (h *httpServer) Handle(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

// Run serves until ctx is cancelled, then gives open requests a few seconds.
func (h *httpServer) Run(ctx context.Context) error {
	srv := &http.Server{
		Handler:           h.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(h.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http serve: %w", err)
	}
	return nil
}

// Close releases the listener of a server that never ran.
func (h *httpServer) Close() error { return h.ln.Close() }
