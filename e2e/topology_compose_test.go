package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
)

// composeFile is the part of docker-compose.yml the test checks.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
	Configs  map[string]struct {
		Content string `yaml:"content"`
	} `yaml:"configs"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(b, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return cf
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       string            `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// composeCommands are the commands README.md's walk-through must name.
var composeCommands = []string{
	"docker compose up -d --build",
	"docker compose ps",
	"docker compose logs -f change-streamer",
	"docker compose kill nats2",
	"docker compose start nats2",
	"docker compose restart view-syncer-1",
	"docker compose down",
}

// TestTopology_Compose is issue 8 acceptance point 4: docker-compose.yml
// describes exactly the topology that the process-level topology tests run
// (topologyServices): the same services, commands, environment, ports and
// dependencies, each one waiting for what it depends on to be healthy. The
// README's walk-through names the same commands.
func TestTopology_Compose(t *testing.T) {
	cf := readCompose(t)
	svcs := topologyServices()
	var want []string
	for _, s := range svcs {
		want = append(want, s.name)
	}
	var got []string
	for name := range cf.Services {
		got = append(got, name)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("compose services %v; the topology has %v", got, want)
	}
	r := renderer{compose: true}
	for _, s := range svcs {
		t.Run(s.name, func(t *testing.T) {
			c := cf.Services[s.name]
			switch s.image {
			case "jetsync":
				if c.Image != "jetsync:dev" || c.Build != "." {
					t.Errorf("image %q built from %q; want jetsync:dev built from .", c.Image, c.Build)
				}
			case "nats":
				if !strings.HasPrefix(c.Image, "nats:") {
					t.Errorf("image %q; want nats:…", c.Image)
				}
				if mount := "./nats-config/cluster:" + composeConfDir + ":ro"; !slices.Contains(c.Volumes, mount) {
					t.Errorf("volumes %v; want %s", c.Volumes, mount)
				}
			case "postgres":
				if !strings.HasPrefix(c.Image, "postgres:15") {
					t.Errorf("image %q; want postgres:15…", c.Image)
				}
				if !slices.Contains(c.Command, "wal_level=logical") {
					t.Errorf("command %v does not set wal_level=logical", c.Command)
				}
				if got := c.Environment["POSTGRES_DB"]; !strings.HasSuffix(composeUpstream, "/"+got) {
					t.Errorf("POSTGRES_DB %q; the upstream URL is %s", got, composeUpstream)
				}
			}
			if s.image != "postgres" {
				if diff := cmp.Diff(r.command(t, s), c.Command); diff != "" {
					t.Errorf("command (-topology +compose):\n%s", diff)
				}
				if diff := cmp.Diff(r.env(t, s), c.Environment, cmpEmptyMap); diff != "" {
					t.Errorf("environment (-topology +compose):\n%s", diff)
				}
			}
			var ports []string
			for _, p := range s.publish {
				ports = append(ports, fmt.Sprintf("%d:%d", p, p))
			}
			if !slices.Equal(c.Ports, ports) {
				t.Errorf("ports %v; want %v", c.Ports, ports)
			}
			var deps []string
			for name, d := range c.DependsOn {
				deps = append(deps, name)
				if d.Condition != "service_healthy" {
					t.Errorf("depends on %s until %q; want service_healthy", name, d.Condition)
				}
			}
			slices.Sort(deps)
			if w := slices.Sorted(slices.Values(s.dependsOn)); !slices.Equal(deps, w) {
				t.Errorf("depends on %v; want %v", deps, w)
			}
			if c.Healthcheck == nil || len(c.Healthcheck.Test) < 2 {
				t.Fatal("no health check")
			}
			// A health check probes the service's own port.
			probe := strings.Join(c.Healthcheck.Test, " ")
			if s.image != "postgres" && !strings.Contains(probe, fmt.Sprintf("localhost:%d/", s.listens[len(s.listens)-1])) {
				t.Errorf("health check %q probes none of the ports %v", probe, s.listens)
			}
			if s.image != "jetsync" || s.name != "proxy" {
				var data bool
				for _, v := range c.Volumes {
					vol, _, _ := strings.Cut(v, ":")
					if _, ok := cf.Volumes[vol]; ok {
						data = true
					}
				}
				if !data {
					t.Errorf("volumes %v: none is a named volume", c.Volumes)
				}
			}
		})
	}

	t.Run("Dockerfile", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"CGO_ENABLED=0", "./cmd/jetsync", `ENTRYPOINT ["jetsync"]`} {
			if !strings.Contains(string(b), want) {
				t.Errorf("Dockerfile lacks %q", want)
			}
		}
	})
	t.Run("README", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join("..", "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		_, section, ok := strings.Cut(string(b), "## Running on a cluster")
		if !ok {
			t.Fatal(`README.md has no "## Running on a cluster" section`)
		}
		if i := strings.Index(section, "\n## "); i >= 0 {
			section = section[:i]
		}
		for _, c := range composeCommands {
			if !strings.Contains(section, c) {
				t.Errorf("the README's cluster walk-through does not name %q", c)
			}
		}
		for _, s := range svcs {
			if !strings.Contains(section, s.name) {
				t.Errorf("the README's cluster walk-through does not name the service %s", s.name)
			}
		}
	})
}

// cmpEmptyMap equates a nil map with an empty one.
var cmpEmptyMap = cmp.FilterValues(func(a, b map[string]string) bool { return len(a) == 0 && len(b) == 0 }, cmp.Ignore())
