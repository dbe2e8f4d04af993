// Package natsconfig runs jetsync's embedded NATS server from server.conf,
// the same file docker-compose mounts into a standalone nats-server.
package natsconfig

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetsync/jetsync/internal/logkey"
)

// ServerConf is the text of server.conf.
//
//go:embed server.conf
var ServerConf string

// DefaultListen is where the server listens unless told otherwise.
const DefaultListen = "127.0.0.1:4222"

// ReadyTimeout bounds how long Start waits for the server to accept clients.
const ReadyTimeout = 10 * time.Second

// Config overrides the parts of server.conf that vary per deployment.
type Config struct {
	// StoreDir is the JetStream storage directory (required).
	StoreDir string
	// Listen is the client listen address. Empty means in-process
	// connections only; port 0 picks a free port.
	Listen string
	// Logger receives the server's log; nil means slog.Default().
	Logger *slog.Logger
}

// Validate checks c.
func (c Config) Validate() error {
	if c.StoreDir == "" {
		return errors.New("nats store dir is required")
	}
	if c.Listen != "" {
		if _, _, err := splitListen(c.Listen); err != nil {
			return err
		}
	}
	return nil
}

func splitListen(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("nats listen %q: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("nats listen %q: bad port", addr)
	}
	return host, port, nil
}

// Options parses the embedded server.conf and applies cfg to it.
func Options(cfg Config) (*server.Options, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := &server.Options{}
	if err := opts.ProcessConfigString(ServerConf); err != nil {
		return nil, fmt.Errorf("parse server.conf: %w", err)
	}
	opts.StoreDir = cfg.StoreDir
	opts.NoSigs = true
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, port, _ := splitListen(cfg.Listen)
		if port == 0 {
			// nats-server reads port 0 as its default, 4222.
			port = server.RANDOM_PORT
		}
		opts.Host, opts.Port = host, port
	}
	return opts, nil
}

// Start runs an embedded server configured by server.conf and cfg, and
// waits until it accepts clients.
func Start(cfg Config) (*server.Server, error) {
	opts, err := Options(cfg)
	if err != nil {
		return nil, err
	}
	return StartOptions(opts, cfg.Logger)
}

// StartOptions runs a server from opts, logging to logger (nil means
// slog.Default(); opts.NoLog silences it).
func StartOptions(opts *server.Options, logger *slog.Logger) (*server.Server, error) {
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	if !opts.NoLog {
		if logger == nil {
			logger = slog.Default()
		}
		debug := logger.Enabled(context.Background(), slog.LevelDebug)
		ns.SetLoggerV2(slogLogger{logger.With(logkey.Component, "nats-server")}, debug, false, false)
	}
	ns.Start()
	if !ns.ReadyForConnections(ReadyTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("nats server not ready after %s", ReadyTimeout)
	}
	if logger != nil {
		logger.Info("nats server started", "listen", ListenURL(ns), "store_dir", ns.StoreDir())
	}
	return ns, nil
}

// Connect opens an in-process connection to ns, which needs no listener.
func Connect(ns *server.Server, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(ns), nats.Name("jetsync")}, opts...)
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("connect in-process: %w", err)
	}
	return nc, nil
}

// ListenURL is the URL clients outside the process use, or "" when ns only
// takes in-process connections.
func ListenURL(ns *server.Server) string {
	addr, ok := ns.Addr().(*net.TCPAddr)
	if !ok || addr == nil {
		return ""
	}
	return "nats://" + addr.String()
}

// slogLogger routes nats-server's log to slog. Notices are the server's
// chatty startup banner and lifecycle, so they go to Debug; jetsync logs its
// own line when the server is up.
type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Noticef(format string, v ...any) { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s slogLogger) Warnf(format string, v ...any)   { s.l.Warn(fmt.Sprintf(format, v...)) }
func (s slogLogger) Fatalf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s slogLogger) Errorf(format string, v ...any)  { s.l.Error(fmt.Sprintf(format, v...)) }
func (s slogLogger) Debugf(format string, v ...any)  { s.l.Debug(fmt.Sprintf(format, v...)) }
func (s slogLogger) Tracef(format string, v ...any)  {}
