package benchenv

import (
	"log/slog"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsconfig "github.com/jetsync/jetsync/nats-config"
)

// NATS is an embedded server from server.conf, as `jetsync run` starts it,
// and an in-process connection to it.
type NATS struct {
	Server *server.Server
	Conn   *nats.Conn
	JS     jetstream.JetStream
}

// StartNATS starts a server storing under dir and logging to log (nil means
// slog.Default()), and connects to it.
func StartNATS(dir string, log *slog.Logger) (*NATS, error) {
	ns, err := natsconfig.Start(natsconfig.Config{StoreDir: dir, Logger: log})
	if err != nil {
		return nil, err
	}
	nc, err := natsconfig.Connect(ns)
	if err != nil {
		ns.Shutdown()
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		ns.Shutdown()
		return nil, err
	}
	return &NATS{Server: ns, Conn: nc, JS: js}, nil
}

// Close closes the connection, then shuts the server down and waits for it.
func (n *NATS) Close() {
	n.Conn.Close()
	n.Server.Shutdown()
	n.Server.WaitForShutdown()
}
