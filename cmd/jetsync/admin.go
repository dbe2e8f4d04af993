package main

import (
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jetsync/jetsync/consumers/viewsyncer"
)

// adminAuth is ZERO_ADMIN_PASSWORD and development mode (NODE_ENV), which
// decide who gets /statz and /heapz, by zero-cache's rule.
type adminAuth struct {
	password string
	dev      bool
}

// allow checks the request's basic-auth password (any user name); a
// refusal is answered as zero-cache answers it.
func (a adminAuth) allow(w http.ResponseWriter, r *http.Request, realm string) bool {
	_, pass, _ := r.BasicAuth()
	if viewsyncer.AdminPasswordValid(viewsyncer.Config{AdminPassword: a.password, DevelopmentMode: a.dev}, pass) {
		return true
	}
	w.Header().Set("WWW-Authenticate", fmt.Sprintf("Basic realm=%q", realm))
	http.Error(w, "Unauthorized", http.StatusUnauthorized)
	return false
}

var processStart = time.Now()

// statz is zero-cache's /statz in spirit: plain-text groups of statistics.
// jetsync has no CVR or change-log database to count, so it reports the
// process and the Go runtime.
func (h *httpServer) statz(w http.ResponseWriter, r *http.Request) {
	if !h.admin.allow(w, r, "Statz Protected Area") {
		return
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	host, _ := os.Hostname()
	var b strings.Builder
	group := func(name string, kv ...any) {
		fmt.Fprintf(&b, "\n=== %s ===\n", name)
		for i := 0; i+1 < len(kv); i += 2 {
			fmt.Fprintf(&b, "%s: %v\n", kv[i], kv[i+1])
		}
	}
	v := readVersion()
	group("version", "jetsync", v.Module, "revision", v.revision(), "go", v.Go,
		"sync protocol", fmt.Sprintf("%d-%d", v.MinProto, v.MaxProto))
	group("os", "hostname", host, "platform", runtime.GOOS, "arch", runtime.GOARCH,
		"cpus", runtime.NumCPU(), "gomaxprocs", runtime.GOMAXPROCS(0),
		"pid", os.Getpid(), "uptime", time.Since(processStart).Round(time.Second))
	group("go runtime", "goroutines", runtime.NumGoroutine(),
		"heap alloc", ms.HeapAlloc, "heap in use", ms.HeapInuse, "heap objects", ms.HeapObjects,
		"sys", ms.Sys, "gc cycles", ms.NumGC, "gc pause total", time.Duration(ms.PauseTotalNs))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

// heapz sends a heap profile: Go's pprof format, where zero-cache sends a
// V8 heap snapshot.
func (h *httpServer) heapz(w http.ResponseWriter, r *http.Request) {
	if !h.admin.allow(w, r, "Heapz Protected Area") {
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", "attachment; filename=jetsync.heap.pb.gz")
	if err := pprof.Lookup("heap").WriteTo(w, 0); err != nil {
		h.log.Warn("heapz", "err", err)
	}
}
