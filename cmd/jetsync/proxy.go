package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const proxySummary = `A plain TCP round-robin proxy, for development and demos: each new
connection goes to the next -backend in turn (the next one after, when that
one refuses it), with no stickiness, since any view-syncer can serve any
client group (it relays a connection to the group's owner itself).
docker-compose.yml puts it in front of the view-syncers; production setups
use their own load balancer.`

// DefaultProxyDialTimeout bounds a connection attempt to one backend.
const DefaultProxyDialTimeout = 2 * time.Second

type proxyFlags struct {
	common
	listen   string
	backends []string
}

// cmdProxy runs the round-robin proxy until a signal.
func cmdProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c proxyFlags
	e := newEnv()
	fs := flag.NewFlagSet("jetsync proxy", flag.ContinueOnError)
	e.strVar(fs, &c.logLevel, "ZERO_LOG_LEVEL", "info")
	e.strVar(fs, &c.logFormat, "ZERO_LOG_FORMAT", "text")
	e.strVar(fs, &c.listen, "JETSYNC_PROXY_LISTEN", fmt.Sprintf(":%d", DefaultPort))
	for b := range strings.SplitSeq(e.str("JETSYNC_PROXY_BACKENDS", ""), ",") {
		if b = strings.TrimSpace(b); b != "" {
			c.backends = append(c.backends, b)
		}
	}
	fromEnv := true
	fs.Func(settingFor("JETSYNC_PROXY_BACKENDS").flag, settingFor("JETSYNC_PROXY_BACKENDS").usageText(""), func(v string) error {
		if fromEnv {
			c.backends, fromEnv = nil, false
		}
		c.backends = append(c.backends, v)
		return nil
	})
	if err := parseFlags(fs, e, stdout, proxySummary, args); err != nil {
		return err
	}
	if len(c.backends) == 0 {
		return usageError("proxy needs at least one backend: -backend host:port or JETSYNC_PROXY_BACKENDS")
	}
	for _, b := range c.backends {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return usageError("backend %q: %v", b, err)
		}
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	ctx, stop := notifyContext(ctx, log)
	defer stop()
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("proxy listen: %w", err)
	}
	p := &proxy{ln: ln, backends: c.backends, dialTimeout: DefaultProxyDialTimeout, log: log}
	log.Info("proxy listening", "addr", ln.Addr().String(), "port", ln.Addr().(*net.TCPAddr).Port, "backends", strings.Join(c.backends, ","))
	return p.Run(ctx)
}

// proxy hands each accepted connection to the next backend in turn.
type proxy struct {
	ln          net.Listener
	backends    []string
	dialTimeout time.Duration
	log         *slog.Logger
	next        atomic.Uint64
}

// Run accepts connections until ctx ends, then closes the listener and
// every connection in flight, and waits for their goroutines.
func (p *proxy) Run(ctx context.Context) error {
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	track := func(c net.Conn, add bool) bool {
		mu.Lock()
		defer mu.Unlock()
		if !add {
			delete(conns, c)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		conns[c] = struct{}{}
		return true
	}
	stopped := context.AfterFunc(ctx, func() {
		p.ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			c.Close()
		}
	})
	defer stopped()
	var err error
	for {
		var c net.Conn
		c, err = p.ln.Accept()
		if err != nil {
			break
		}
		wg.Go(func() {
			if !track(c, true) {
				c.Close()
				return
			}
			defer track(c, false)
			p.serve(ctx, c, func(b net.Conn) bool { return track(b, true) }, func(b net.Conn) { track(b, false) })
		})
	}
	p.ln.Close()
	wg.Wait()
	if ctx.Err() != nil {
		p.log.Info("proxy stopped")
		return nil
	}
	return fmt.Errorf("proxy accept: %w", err)
}

// serve connects c to a backend and copies both ways until either side
// closes. A backend that refuses the connection passes it to the next.
func (p *proxy) serve(ctx context.Context, c net.Conn, track func(net.Conn) bool, untrack func(net.Conn)) {
	defer c.Close()
	first := int(p.next.Add(1)-1) % len(p.backends)
	var b net.Conn
	for i := range p.backends {
		addr := p.backends[(first+i)%len(p.backends)]
		d := net.Dialer{Timeout: p.dialTimeout}
		var err error
		b, err = d.DialContext(ctx, "tcp", addr)
		if err == nil {
			p.log.Debug("proxy connection", "remote_addr", c.RemoteAddr().String(), "backend", addr)
			break
		}
		p.log.Warn("proxy backend unreachable; trying the next", "backend", addr, "err", err)
	}
	if b == nil {
		p.log.Warn("proxy: no backend reachable; closing the connection", "remote_addr", c.RemoteAddr().String())
		return
	}
	defer b.Close()
	if !track(b) {
		return
	}
	defer untrack(b)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Pass the half-close on, so that each side sees the other's EOF.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go pipe(b, c)
	go pipe(c, b)
	<-done
	<-done
}
