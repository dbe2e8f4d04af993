package natstest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsconfig "github.com/jetsync/jetsync/nats-config"
)

// ClusterSize is the number of nodes of nats-config/cluster.
const ClusterSize = 3

// Cluster is the three-node cluster of nats-config/cluster, run in the test
// process on 127.0.0.1.
type Cluster struct {
	t       testing.TB
	Servers []*server.Server
	opts    []*server.Options
}

// ClusterConfDir is the directory of the cluster's config files.
func ClusterConfDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "cluster")
}

// FreePort returns a TCP port free on every interface at the time of the
// call. It is taken below the kernel's ephemeral range when there is room
// there: a port the kernel handed out for ":0" can go to an outgoing
// connection before the caller's server binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	if lo := ephemeralLow(); lo > 12000 {
		for range 200 {
			p := 10000 + rand.IntN(lo-10000)
			if ln, err := net.Listen("tcp", ":"+strconv.Itoa(p)); err == nil {
				ln.Close()
				return p
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// ephemeralLow is the first port of the kernel's ephemeral range, or 0
// when it can't be read.
var ephemeralLow = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
})

// StartCluster runs nats-config/cluster/node{1,2,3}.conf with the client
// and cluster listeners moved to free 127.0.0.1 ports, the routes between
// them, and each store in a test temp dir; monitoring is off. It returns
// once the cluster has a JetStream meta leader.
func StartCluster(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	clusterPorts := make([]int, ClusterSize)
	var routes []*url.URL
	for i := range clusterPorts {
		clusterPorts[i] = FreePort(t)
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: "127.0.0.1:" + strconv.Itoa(clusterPorts[i])})
	}
	// The nodes' shared settings without auth.conf's users: the in-process
	// cluster tests replication, and its clients connect as anyone.
	confDir := t.TempDir()
	shared, err := os.ReadFile(filepath.Join(ClusterConfDir(), "cluster.conf"))
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	if err := os.WriteFile(filepath.Join(confDir, "cluster.conf"), shared, 0o600); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	for i := range ClusterSize {
		conf := filepath.Join(confDir, fmt.Sprintf("node%d.conf", i+1))
		body := fmt.Sprintf("server_name: nats%d\ninclude ./cluster.conf\n", i+1)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatalf("natstest: %v", err)
		}
		o := &server.Options{}
		if err := o.ProcessConfigFile(conf); err != nil {
			t.Fatalf("natstest: %v", err)
		}
		o.Host, o.Port = "127.0.0.1", FreePort(t)
		o.HTTPHost, o.HTTPPort = "", 0
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", clusterPorts[i]
		o.Routes = routes
		o.StoreDir = t.TempDir()
		o.NoLog, o.NoSigs = true, true
		for _, f := range opts {
			f(o)
		}
		c.opts = append(c.opts, o)
	}
	// The nodes start together: none is ready for JetStream before a
	// quorum of them is up.
	c.Servers = make([]*server.Server, ClusterSize)
	for i, o := range c.opts {
		ns, err := server.NewServer(o)
		if err != nil {
			t.Fatalf("natstest: node %d: %v", i+1, err)
		}
		ns.Start()
		c.Servers[i] = ns
	}
	t.Cleanup(func() {
		for _, ns := range c.Servers {
			if ns != nil {
				ns.Shutdown()
				ns.WaitForShutdown()
			}
		}
	})
	for i, ns := range c.Servers {
		if !ns.ReadyForConnections(natsconfig.ReadyTimeout) {
			t.Fatalf("natstest: node %d not ready", i+1)
		}
	}
	c.WaitJetStream()
	return c
}

// URLs is the client URLs of all nodes, comma-separated, as nats.Connect
// takes them.
func (c *Cluster) URLs() string {
	var s string
	for i, o := range c.opts {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("nats://127.0.0.1:%d", o.Port)
	}
	return s
}

// Stop shuts node i (0-based) down.
func (c *Cluster) Stop(i int) {
	if ns := c.Servers[i]; ns != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		c.Servers[i] = nil
	}
}

// Restart starts node i (0-based) again on its ports and store, stopping it
// first if it runs.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.Stop(i)
	o := c.opts[i].Clone()
	ns, err := natsconfig.StartOptions(o, nil)
	if err != nil {
		c.t.Fatalf("natstest: restart node %d: %v", i+1, err)
	}
	c.Servers[i] = ns
}

// WaitJetStream waits until the cluster answers JetStream requests, which
// it does once it has elected a meta leader.
func (c *Cluster) WaitJetStream() {
	c.t.Helper()
	nc, err := nats.Connect(c.URLs())
	if err != nil {
		c.t.Fatalf("natstest: connect: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatalf("natstest: jetstream: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("natstest: no jetstream meta leader: %v", err)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			time.Sleep(50 * time.Millisecond) // polling with a deadline
		}
	}
}

// Connect opens a connection to every node of c that keeps reconnecting,
// and closes it when the test ends.
func (c *Cluster) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(c.URLs(),
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
