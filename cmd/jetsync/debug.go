package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime/debug"
	"strconv"
	"strings"
)

// Process-wide settings read from the environment before any subcommand
// runs, since they concern the Go runtime rather than a component:
//
//   - JETSYNC_PPROF_ADDR: an address (such as 127.0.0.1:6060) to serve
//     net/http/pprof on; empty (the default) serves nothing. Profiles
//     expose internals: bind it to loopback.
//   - JETSYNC_MEMORY_LIMIT: the process's memory ceiling, in bytes or with
//     a KiB/MiB/GiB suffix. The Go runtime's soft limit (debug.SetMemoryLimit)
//     is set below it, so that the collector runs more often, trading CPU
//     for a lower peak, before the view-syncer starts shedding load
//     (viewsyncer.Config.MemoryLimit). Empty (the default) leaves Go's own
//     GOMEMLIMIT, unset meaning no limit.
const (
	envPprofAddr   = "JETSYNC_PPROF_ADDR"
	envMemoryLimit = "JETSYNC_MEMORY_LIMIT"
)

// setupRuntime applies the process-wide settings; it returns an error for a
// malformed one.
func setupRuntime(getenv func(string) string) error {
	if s := getenv(envMemoryLimit); s != "" {
		n, err := parseBytes(s)
		if err != nil {
			return fmt.Errorf("%s: %w", envMemoryLimit, err)
		}
		debug.SetMemoryLimit(softMemoryLimit(n))
	}
	if addr := getenv(envPprofAddr); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s: %w", envPprofAddr, err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		slog.Info("pprof listening", "addr", ln.Addr().String())
		// It lives as long as the process: a debugging aid with nothing to
		// flush.
		go func() { _ = http.Serve(ln, mux) }()
	}
	return nil
}

// softMemoryLimit is the Go runtime's share of the ceiling n: what is
// left covers the binary's mapped pages and the time the shedding takes to
// bite.
func softMemoryLimit(n int64) int64 { return n / 10 * 7 }

// parseBytes reads a byte count: digits, optionally followed by KiB, MiB or
// GiB.
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.n
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("want a positive byte count, such as 536870912 or 512MiB")
	}
	return n * mult, nil
}
