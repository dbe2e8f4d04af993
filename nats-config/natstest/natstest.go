// Package natstest runs a real embedded JetStream server for tests, as
// net/http/httptest runs a real HTTP server.
package natstest

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsconfig "github.com/jetsync/jetsync/nats-config"
)

// Option adjusts the test server.
type Option func(*server.Options)

// SyncAlways makes the server fsync every write, as production does. Tests
// leave it off for speed.
func SyncAlways() Option {
	return func(o *server.Options) { o.SyncAlways = true }
}

// Start runs a JetStream server on a free 127.0.0.1 port with its store in
// a test temp dir, and shuts it down when the test ends.
func Start(t testing.TB, opts ...Option) *server.Server {
	t.Helper()
	o := &server.Options{
		ServerName: "natstest",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoLog:      true,
		NoSigs:     true,
	}
	for _, f := range opts {
		f(o)
	}
	return start(t, o)
}

func start(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	ns, err := natsconfig.StartOptions(o, nil)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns
}

// Restart shuts ns down and starts a new server on the same port and store,
// so clients from Connect reconnect to it and find their streams.
func Restart(t testing.TB, ns *server.Server) *server.Server {
	t.Helper()
	addr, ok := ns.Addr().(*net.TCPAddr)
	if !ok {
		t.Fatal("natstest: Restart needs a listening server")
	}
	jsc := ns.JetStreamConfig()
	if jsc == nil {
		t.Fatal("natstest: Restart needs JetStream")
	}
	o := &server.Options{
		ServerName: ns.Name(),
		Host:       "127.0.0.1",
		Port:       addr.Port,
		JetStream:  true,
		// The server keeps its streams in StoreDir/jetstream.
		StoreDir:   filepath.Dir(jsc.StoreDir),
		SyncAlways: jsc.SyncAlways,
		NoLog:      true,
		NoSigs:     true,
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	return start(t, o)
}

// Connect opens a TCP connection to ns that keeps reconnecting (across a
// Restart), and closes it when the test ends.
func Connect(t testing.TB, ns *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectJitter(0, 0),
	)
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}
