package e2e

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

// The topology tests (issue 8) run the cluster topology of
// ../docker-compose.yml as processes on 127.0.0.1: three nats-servers from
// nats-config/cluster, a change-streamer, two view-syncers and `jetsync
// proxy`. topologyServices describes it once; TestTopology_Compose checks
// that docker-compose.yml says the same, and startTopology runs it.

// topoService is one service of the topology. Commands and environment
// values may hold placeholders that each world renders its own way:
//
//	{addr:SVC:PORT}   compose "SVC:PORT"; processes "127.0.0.1:<free port>"
//	{port:SVC:PORT}   compose "PORT";     processes "<free port>"
//	{listen:SVC:PORT} compose ":PORT";    processes "127.0.0.1:<free port>"
//	{data}            compose "/data";    processes a directory per service
//	{conf}            compose the mount of nats-config/cluster; processes that directory
//	{upstream}        compose the postgres service's URL; processes the test's database
type topoService struct {
	name  string
	image string // jetsync, nats or postgres
	// command is the container's command; for jetsync, the arguments of
	// the image's entrypoint, the jetsync binary.
	command   []string
	env       map[string]string
	listens   []int // ports the service listens on
	publish   []int // of those, the ones compose publishes on the host
	dependsOn []string
}

const (
	composeUpstream = "postgres://postgres:postgres@postgres:5432/jetsync"
	composeConfDir  = "/etc/nats-cluster"
	// topoAuthSecret signs the clients' tokens, as in docker-compose.yml.
	topoAuthSecret = "jetsync-dev-secret-change-me-0123456789"
	// topoPeerSecret lets the view-syncers relay to each other, as in
	// docker-compose.yml.
	topoPeerSecret = "jetsync-dev-peer-secret-change-me"
)

// topoNATSPasswords are the passwords of nats-config/cluster/auth.conf's
// users, which the nats servers read from their environment, as in
// docker-compose.yml. The roles connect as their own user; the test as
// admin.
var topoNATSPasswords = map[string]string{
	"NATS_CHANGE_STREAMER_PASSWORD": "jetsync-dev-nats-change-streamer-change-me",
	"NATS_VIEW_SYNCER_PASSWORD":     "jetsync-dev-nats-view-syncer-change-me",
	"NATS_ADMIN_PASSWORD":           "jetsync-dev-nats-admin-change-me",
	"NATS_SYS_PASSWORD":             "jetsync-dev-nats-sys-change-me",
}

// topologyServices is the topology both worlds run, in start order.
func topologyServices() []topoService {
	natsURL := "nats://{addr:nats1:4222},nats://{addr:nats2:4222},nats://{addr:nats3:4222}"
	svcs := []topoService{{name: "postgres", image: "postgres", listens: []int{5432}, publish: []int{5432}}}
	for i := 1; i <= 3; i++ {
		s := topoService{
			name: fmt.Sprintf("nats%d", i), image: "nats",
			command: []string{"nats-server", "-c", fmt.Sprintf("{conf}/node%d.conf", i), "-sd", "{data}"},
			listens: []int{4222, 6222, 8222},
			env:     maps.Clone(topoNATSPasswords),
			// No port published: NATS is jetsync's inside. The nats CLI and
			// `jetsync tail` attach from a container on the network (README).
		}
		svcs = append(svcs, s)
	}
	roleEnv := func(name, user string, extra map[string]string) map[string]string {
		env := map[string]string{
			"JETSYNC_NATS_URL":         natsURL,
			"JETSYNC_NATS_USER":        user,
			"JETSYNC_NATS_PASSWORD":    topoNATSPasswords["NATS_"+strings.ToUpper(strings.ReplaceAll(user, "-", "_"))+"_PASSWORD"],
			"JETSYNC_NATS_MONITOR_URL": "http://{addr:nats1:8222}",
			"JETSYNC_STREAM_REPLICAS":  "3",
			"JETSYNC_DATA_DIR":         "{data}",
			"ZERO_TASK_ID":             name,
			"ZERO_LOG_FORMAT":          "json",
		}
		maps.Copy(env, extra)
		return env
	}
	svcs = append(svcs, topoService{
		name: "change-streamer", image: "jetsync", command: []string{"change-streamer"},
		env: roleEnv("change-streamer", "change-streamer", map[string]string{
			"ZERO_UPSTREAM_DB": "{upstream}",
			"ZERO_PORT":        "{port:change-streamer:4849}",
		}),
		listens:   []int{4849},
		dependsOn: []string{"postgres", "nats1", "nats2", "nats3"},
	})
	// The demo page's API server: the push endpoint of its custom mutators,
	// which the view-syncers forward pushes to. It writes to the shard's
	// tables, which the change-streamer creates.
	svcs = append(svcs, topoService{
		name: "demo-api", image: "jetsync", command: []string{"demo-api"},
		env: map[string]string{
			"ZERO_UPSTREAM_DB": "{upstream}",
			"ZERO_PORT":        "{port:demo-api:4851}",
			"JETSYNC_DATA_DIR": "{data}",
			"ZERO_TASK_ID":     "demo-api",
			"ZERO_LOG_FORMAT":  "json",
		},
		listens:   []int{4851},
		dependsOn: []string{"change-streamer"},
	})
	for _, vs := range []string{"view-syncer-1", "view-syncer-2"} {
		svcs = append(svcs, topoService{
			name: vs, image: "jetsync", command: []string{"view-syncer"},
			env: roleEnv(vs, "view-syncer", map[string]string{
				"ZERO_PORT":                 "{port:" + vs + ":4848}",
				"JETSYNC_ADVERTISE_ADDRESS": "ws://{addr:" + vs + ":4848}",
				"JETSYNC_CVR_LEASE_TTL":     "5s",
				"ZERO_AUTH_SECRET":          topoAuthSecret,
				"JETSYNC_PEER_SECRET":       topoPeerSecret,
				// The demo page at /demo, its pushes to demo-api.
				"JETSYNC_DEMO_PAGE": "true",
				"ZERO_MUTATE_URL":   "http://{addr:demo-api:4851}" + demoMutatePath,
			}),
			listens:   []int{4848},
			dependsOn: []string{"change-streamer", "demo-api"},
		})
	}
	svcs = append(svcs, topoService{
		name: "proxy", image: "jetsync",
		command: []string{"proxy", "-listen", "{listen:proxy:4848}",
			"-backend", "{addr:view-syncer-1:4848}", "-backend", "{addr:view-syncer-2:4848}"},
		env:       map[string]string{"ZERO_LOG_FORMAT": "json"},
		listens:   []int{4848},
		publish:   []int{4848},
		dependsOn: []string{"view-syncer-1", "view-syncer-2"},
	})
	return svcs
}

var placeholderRe = regexp.MustCompile(`\{(?:(addr|port|listen):([a-z0-9-]+):(\d+)|(data|conf|upstream))\}`)

// renderer resolves placeholders for one world.
type renderer struct {
	compose  bool
	ports    map[string]int // "svc:port" → host port, processes only
	root     string         // data directories, processes only
	upstream string
}

func (r renderer) render(t *testing.T, svc, s string) string {
	t.Helper()
	return placeholderRe.ReplaceAllStringFunc(s, func(m string) string {
		g := placeholderRe.FindStringSubmatch(m)
		if g[4] != "" {
			switch {
			case g[4] == "data" && r.compose:
				return "/data"
			case g[4] == "data":
				return filepath.Join(r.root, svc)
			case g[4] == "conf" && r.compose:
				return composeConfDir
			case g[4] == "conf":
				return natstest.ClusterConfDir()
			case r.compose:
				return composeUpstream
			default:
				return r.upstream
			}
		}
		key := g[2] + ":" + g[3]
		if r.compose {
			switch g[1] {
			case "addr":
				return key
			case "port":
				return g[3]
			default:
				return ":" + g[3]
			}
		}
		port, ok := r.ports[key]
		if !ok {
			t.Fatalf("placeholder %s: %s does not listen on %s", m, g[2], g[3])
		}
		if g[1] == "port" {
			return strconv.Itoa(port)
		}
		return "127.0.0.1:" + strconv.Itoa(port)
	})
}

func (r renderer) command(t *testing.T, s topoService) []string {
	var out []string
	for _, a := range s.command {
		out = append(out, r.render(t, s.name, a))
	}
	return out
}

func (r renderer) env(t *testing.T, s topoService) map[string]string {
	out := map[string]string{}
	for k, v := range s.env {
		out[k] = r.render(t, s.name, v)
	}
	return out
}

// topology is the description running as processes.
type topology struct {
	t     *testing.T
	r     renderer
	svcs  map[string]topoService
	procs map[string]*proc
	js    jetstream.JetStream
	shard streams.Shard
}

// newTopology allocates the ports of every service and the data root,
// starting nothing.
func newTopology(t *testing.T, upstream string) *topology {
	t.Helper()
	tp := &topology{
		t:     t,
		r:     renderer{ports: map[string]int{}, root: dataRoot(t), upstream: upstream},
		svcs:  map[string]topoService{},
		procs: map[string]*proc{},
		shard: streams.Shard{App: "zero", Num: 0},
	}
	for _, s := range topologyServices() {
		tp.svcs[s.name] = s
		for _, p := range s.listens {
			tp.r.ports[s.name+":"+strconv.Itoa(p)] = freePort(t)
		}
	}
	return tp
}

func (tp *topology) port(svc string, port int) int { return tp.r.ports[svc+":"+strconv.Itoa(port)] }

func (tp *topology) url(svc string, port int) string {
	return fmt.Sprintf("http://127.0.0.1:%d", tp.port(svc, port))
}

// start starts services in order, each once healthy, as compose's
// depends_on: service_healthy does. Postgres is the test's own.
func (tp *topology) start(names ...string) {
	tp.t.Helper()
	for _, n := range names {
		s, ok := tp.svcs[n]
		if !ok {
			tp.t.Fatalf("no service %s", n)
		}
		switch s.image {
		case "nats":
			tp.startNATS(s)
		case "jetsync":
			tp.startJetsync(s, s)
		}
	}
}

// natsArgs is the nats service's command, with the addresses that compose
// gets from each container's own network moved to free local ports.
func (tp *topology) natsArgs(s topoService) []string {
	args := tp.r.command(tp.t, s)[1:]
	var routes []string
	for i := 1; i <= 3; i++ {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", tp.port(fmt.Sprintf("nats%d", i), 6222)))
	}
	return append(args,
		"-a", "127.0.0.1", "-p", strconv.Itoa(tp.port(s.name, 4222)),
		"-m", strconv.Itoa(tp.port(s.name, 8222)),
		"--cluster", fmt.Sprintf("nats://127.0.0.1:%d", tp.port(s.name, 6222)),
		"--routes", strings.Join(routes, ","))
}

func (tp *topology) startNATS(s topoService) {
	tp.t.Helper()
	cmd := exec.Command(natsServerBin(tp.t), tp.natsArgs(s)...)
	cmd.Env = baseEnv()
	for k, v := range tp.r.env(tp.t, s) {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := startProc(tp.t, s.name, cmd)
	tp.procs[s.name] = p
	polltest.Until(tp.t, 30*time.Second, s.name+" ready", func() bool {
		if p.exited() {
			tp.t.Fatalf("%s exited: %v\n%s", s.name, p.err, p.stderr.String())
		}
		return strings.Contains(p.stderr.String(), "Server is ready")
	})
	if s.name == "nats3" || tp.js != nil {
		tp.waitJetStream()
	}
}

// waitJetStream connects the test to the cluster once, then waits until
// it answers JetStream requests (a meta leader is elected), as compose's
// /healthz check does.
func (tp *topology) waitJetStream() {
	tp.t.Helper()
	if tp.js == nil {
		var urls []string
		for i := 1; i <= 3; i++ {
			urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", tp.port(fmt.Sprintf("nats%d", i), 4222)))
		}
		nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
			nats.UserInfo("admin", topoNATSPasswords["NATS_ADMIN_PASSWORD"]))
		if err != nil {
			tp.t.Fatal(err)
		}
		tp.t.Cleanup(nc.Close)
		if tp.js, err = jetstream.New(nc); err != nil {
			tp.t.Fatal(err)
		}
	}
	polltest.Until(tp.t, 30*time.Second, "a jetstream meta leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := tp.js.AccountInfo(ctx)
		return err == nil
	})
}

// startJetsync runs service as, configured as s: a second instance of a
// service is s under another name, with its own data dir and task ID.
func (tp *topology) startJetsync(s, as topoService) *proc {
	tp.t.Helper()
	env := tp.r.env(tp.t, s)
	if as.name != s.name {
		env["JETSYNC_DATA_DIR"] = filepath.Join(tp.r.root, as.name)
		env["ZERO_TASK_ID"] = as.name
	}
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		kv = append(kv, k+"="+env[k])
	}
	p := start(tp.t, kv, tp.r.command(tp.t, s)...)
	tp.procs[as.name] = p
	if s.name == "proxy" {
		p.logRecord(tp.t, "proxy listening", 30*time.Second)
	} else {
		waitHealthy(tp.t, p, tp.url(s.name, s.listens[0]), 2*time.Minute)
	}
	return p
}

// restart starts a stopped service again, on its ports and data.
func (tp *topology) restart(name string) {
	tp.t.Helper()
	if p := tp.procs[name]; p != nil && !p.exited() {
		tp.t.Fatalf("restart %s: still running", name)
	}
	tp.start(name)
}

// kill SIGKILLs a service.
func (tp *topology) kill(name string) { kill(tp.t, tp.procs[name]) }
