package natsconfig_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	natsconfig "github.com/jetsync/jetsync/nats-config"
	"github.com/jetsync/jetsync/nats-config/natstest"
)

func TestOptions(t *testing.T) {
	opts, err := natsconfig.Options(natsconfig.Config{StoreDir: "/x", Listen: natsconfig.DefaultListen})
	if err != nil {
		t.Fatal(err)
	}
	if !opts.SyncAlways || !opts.JetStream || opts.StoreDir != "/x" || opts.Host != "127.0.0.1" || opts.Port != 4222 {
		t.Errorf("Options = sync always %v, jetstream %v, store %q, %s:%d", opts.SyncAlways, opts.JetStream, opts.StoreDir, opts.Host, opts.Port)
	}
	if opts.MaxPayload != 1<<20 {
		t.Errorf("max payload = %d; want 1MB", opts.MaxPayload)
	}
	for _, bad := range []natsconfig.Config{{}, {StoreDir: "/x", Listen: "nohost"}, {StoreDir: "/x", Listen: "h:99999"}} {
		if _, err := natsconfig.Options(bad); err == nil {
			t.Errorf("Options(%+v) succeeded", bad)
		}
	}
}

func TestStart(t *testing.T) {
	t.Run("InProcessOnly", func(t *testing.T) {
		ns := startEmbedded(t, "")
		if ns.Addr() != nil || natsconfig.ListenURL(ns) != "" {
			t.Errorf("Listen \"\" has a listener at %v", ns.Addr())
		}
		if jsc := ns.JetStreamConfig(); jsc == nil || !jsc.SyncAlways {
			t.Errorf("JetStreamConfig = %+v; want sync always", jsc)
		}
		nc, err := natsconfig.Connect(ns)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}}); err != nil {
			t.Fatalf("create stream: %v", err)
		}
		if _, err := js.Publish(context.Background(), "s", []byte("x")); err != nil {
			t.Fatalf("publish: %v", err)
		}
	})
	t.Run("FreePort", func(t *testing.T) {
		ns := startEmbedded(t, "127.0.0.1:0")
		u := natsconfig.ListenURL(ns)
		addr, ok := ns.Addr().(*net.TCPAddr)
		if !ok || addr.Port == 0 || addr.Port == 4222 || !strings.HasPrefix(u, "nats://127.0.0.1:") {
			t.Fatalf("ListenURL = %q, addr %v; want a free port", u, ns.Addr())
		}
		nc, err := nats.Connect(u)
		if err != nil {
			t.Fatalf("connect over TCP: %v", err)
		}
		nc.Close()
	})
}

func startEmbedded(t *testing.T, listen string) *server.Server {
	t.Helper()
	ns, err := natsconfig.Start(natsconfig.Config{StoreDir: t.TempDir(), Listen: listen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

func TestNatstestRestart(t *testing.T) {
	ns := natstest.Start(t)
	nc, js := natstest.Connect(t, ns)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s", []byte("x")); err != nil {
		t.Fatal(err)
	}
	before := nc.Stats().Reconnects
	ns2 := natstest.Restart(t, ns)
	polltest.Until(t, 10*time.Second, "a reconnect after the restart", func() bool {
		return nc.Stats().Reconnects != before && nc.IsConnected()
	})
	if ns2.ClientURL() != ns.ClientURL() {
		t.Errorf("restarted at %s; want %s", ns2.ClientURL(), ns.ClientURL())
	}
	// The old connection has reconnected and finds the stream and its
	// message.
	s, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("messages after restart = %d; want 1", n)
	}
}
