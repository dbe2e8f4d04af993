package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetsync/jetsync/streams"
)

func TestRedact(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"NoSecret", "postgres://user@host:5432/db", "postgres://user@host:5432/db"},
		{"URLPassword", "postgres://user:s3cret@host:5432/db?sslmode=disable", "postgres://user:xxxxx@host:5432/db?sslmode=disable"},
		{"NATSPassword", "dial nats://a:b@127.0.0.1:4222: refused", "dial nats://a:xxxxx@127.0.0.1:4222: refused"},
		{"NATSPasswords", "nats://a:b@h1:4222,nats://a:b@h2:4222", "nats://a:xxxxx@h1:4222,nats://a:xxxxx@h2:4222"},
		{"NATSToken", "nats://t0ken@127.0.0.1:4222,tls://t0ken@h:4222", "nats://xxxxx@127.0.0.1:4222,tls://xxxxx@h:4222"},
		{"QueryPassword", "postgres://u@h/db?password=pw&sslmode=disable", "postgres://u@h/db?password=xxxxx&sslmode=disable"},
		{"KeyValue", "host=h user=u password=pw dbname=d", "host=h user=u password=xxxxx dbname=d"},
		{"KeyValueQuoted", "host=h password='p w' dbname=d", "host=h password=xxxxx dbname=d"},
		{"Plain", "nothing here", "nothing here"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := redact(tc.in)
			if got != tc.want {
				t.Errorf("redact(%q) = %q; want %q", tc.in, got, tc.want)
			}
			if strings.Contains(got, "s3cret") || strings.Contains(got, ":b@") {
				t.Errorf("redact(%q) leaks a secret: %q", tc.in, got)
			}
		})
	}
}

func TestLogger_RedactsSecrets(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			c := common{logLevel: "info", logFormat: format}
			log, err := c.logger(&buf)
			if err != nil {
				t.Fatal(err)
			}
			defer slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
			log.Info("connect", "db", "postgres://u:hunter2@h/db", "err", errors.New("dial postgres://u:hunter2@h/db: refused"))
			if strings.Contains(buf.String(), "hunter2") {
				t.Errorf("log leaks the password: %s", buf.String())
			}
		})
	}
}

func TestEnv_Precedence(t *testing.T) {
	vars := map[string]string{"ZERO_PORT": "5000", "JETSYNC_NATS_LISTEN": "", "ZERO_APP_ID": "myapp"}
	newFS := func() (*flag.FlagSet, *env, *runFlags) {
		e := &env{lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
		fs := flag.NewFlagSet("jetsync run", flag.ContinueOnError)
		var c runFlags
		c.roleFlags.register(fs, e, DefaultPort, "replica.db")
		c.upstreamFlags.register(fs, e, "upstream")
		fs.StringVar(&c.natsListen, "nats-listen", e.str("JETSYNC_NATS_LISTEN", DefaultNATSListen), "")
		return fs, e, &c
	}

	fs, e, c := newFS()
	if err := parseFlags(fs, e, &bytes.Buffer{}, "", nil); err != nil {
		t.Fatal(err)
	}
	if c.port != 5000 {
		t.Errorf("port = %d; want 5000 from ZERO_PORT", c.port)
	}
	if c.natsListen != "" {
		t.Errorf("nats listen = %q; want empty: set but empty means in-process only", c.natsListen)
	}
	if c.appID != "myapp" || c.dataDir != DefaultDataDir {
		t.Errorf("app id, data dir = %q, %q; want myapp, %q", c.appID, c.dataDir, DefaultDataDir)
	}

	fs, e, c = newFS()
	if err := parseFlags(fs, e, &bytes.Buffer{}, "", []string{"--port", "6000", "-upstream-db", "postgres://x"}); err != nil {
		t.Fatal(err)
	}
	if c.port != 6000 || c.upstreamDB != "postgres://x" {
		t.Errorf("port, upstream = %d, %q; want the flags to win", c.port, c.upstreamDB)
	}

	vars["ZERO_PORT"] = "nope"
	fs, e, _ = newFS()
	if err := parseFlags(fs, e, &bytes.Buffer{}, "", nil); !errors.Is(err, errUsage) {
		t.Errorf("parse with ZERO_PORT=nope = %v; want a usage error", err)
	}
}

func TestMainExit(t *testing.T) {
	t.Setenv("ZERO_UPSTREAM_DB", "postgres://u:topsecret@h/db")
	tests := []struct {
		args       []string
		code       int
		wantStdout string
	}{
		{[]string{"--help"}, 0, "Commands:"},
		{[]string{"-h"}, 0, "Commands:"},
		{[]string{"run", "-h"}, 0, "ZERO_UPSTREAM_DB"},
		{[]string{"run", "--help"}, 0, "JETSYNC_NATS_LISTEN"},
		{[]string{"help", "tail"}, 0, "JETSYNC_NATS_URL"},
		{[]string{"replay", "-h"}, 0, "--into"},
		{[]string{"change-streamer", "-h"}, 0, "JETSYNC_NATS_MONITOR_URL"},
		{[]string{"replicator", "-h"}, 0, "ZERO_REPLICA_FILE"},
		{[]string{"view-syncer", "-h"}, 0, "ZERO_PORT"},
		{nil, 2, ""},
		{[]string{"bogus"}, 2, ""},
		{[]string{"run", "-bogus"}, 2, ""},
		{[]string{"run", "extra"}, 2, ""},
		{[]string{"tail", "--table", "a.b.c"}, 2, ""},
		{[]string{"replay", "--from", "yesterday"}, 2, ""},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := mainExit(context.Background(), tc.args, &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d; want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout lacks %q:\n%s", tc.wantStdout, stdout.String())
			}
			if strings.Contains(stdout.String()+stderr.String(), "topsecret") {
				t.Errorf("output leaks ZERO_UPSTREAM_DB's password")
			}
		})
	}
}

func TestTaskID(t *testing.T) {
	dir := t.TempDir()
	id, err := taskID(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if !taskIDRe.MatchString(id) {
		t.Fatalf("taskID = %q; not a valid consumer name part", id)
	}
	again, err := taskID(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if again != id {
		t.Errorf("taskID after restart = %q; want the persisted %q", again, id)
	}
	if other, _ := taskID(t.TempDir(), ""); other == id {
		t.Errorf("two data dirs got the same task id %q", id)
	}
	if got, err := taskID(dir, "given-1"); err != nil || got != "given-1" {
		t.Errorf("taskID(given-1) = %q, %v; want given-1", got, err)
	}
	if _, err := taskID(dir, "has.dot"); err == nil {
		t.Error("taskID(has.dot) succeeded; a dot would break durable consumer names")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "task-id")); strings.TrimSpace(string(b)) != id {
		t.Errorf("task-id file holds %q; want %q", b, id)
	}
}

func TestParsePosition(t *testing.T) {
	ts := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	wm := streams.Lexi(0x1A2B3C4D)
	tests := []struct {
		in   string
		want position
		err  bool
	}{
		{"42", position{kind: posSeq, seq: 42}, false},
		{"seq:7", position{kind: posSeq, seq: 7}, false},
		{"2024-01-02T03:04:05Z", position{kind: posTime, t: ts}, false},
		{"time:2024-01-02T03:04:05Z", position{kind: posTime, t: ts}, false},
		{wm, position{kind: posWatermark, wm: wm}, false},
		{"wm:" + wm, position{kind: posWatermark, wm: wm}, false},
		{"wm:!!", position{}, true},
		{"seq:x", position{}, true},
		{"yesterday", position{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parsePosition(tc.in)
			if (err != nil) != tc.err {
				t.Fatalf("parsePosition(%q) error = %v; want error %v", tc.in, err, tc.err)
			}
			if got.kind != tc.want.kind || got.seq != tc.want.seq || !got.t.Equal(tc.want.t) || got.wm != tc.want.wm {
				t.Errorf("parsePosition(%q) = %+v; want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseVarz(t *testing.T) {
	tests := []struct {
		name, body string
		want       syncPolicy
		err        bool
	}{
		{"Always", `{"jetstream":{"config":{"sync_always":true,"store_dir":"/x"}}}`, syncPolicy{SyncAlways: true}, false},
		{"Interval", `{"jetstream":{"config":{"sync_interval":10000000000}}}`, syncPolicy{SyncInterval: 10 * time.Second}, false},
		{"Default", `{"jetstream":{"config":{"max_memory":1}}}`, syncPolicy{SyncInterval: 2 * time.Minute}, false},
		{"NoJetStream", `{"server_id":"x"}`, syncPolicy{}, true},
		{"NotJSON", `<html>`, syncPolicy{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseVarz(strings.NewReader(tc.body))
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("parseVarz(%s) = %+v, %v; want %+v, error %v", tc.body, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestParseTable(t *testing.T) {
	tests := []struct{ in, schema, table string }{
		{"issue", "public", "issue"},
		{"app.issue", "app", "issue"},
		{"", "", ""},
	}
	for _, tc := range tests {
		s, tb, err := parseTable(tc.in)
		if err != nil || s != tc.schema || tb != tc.table {
			t.Errorf("parseTable(%q) = %q, %q, %v; want %q, %q", tc.in, s, tb, err, tc.schema, tc.table)
		}
	}
	for _, bad := range []string{".x", "x.", "a.b.c"} {
		if _, _, err := parseTable(bad); err == nil {
			t.Errorf("parseTable(%q) succeeded; want an error", bad)
		}
	}
}

func TestRunStages_StopsInOrder(t *testing.T) {
	var order []string
	mk := func(name string) component {
		return component{name, func(ctx context.Context) error {
			<-ctx.Done()
			order = append(order, name) // stages stop one at a time
			return nil
		}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runStages(ctx, slog.New(slog.DiscardHandler), []component{mk("producer")}, []component{mk("consumer")}, []component{mk("http")})
	}()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("runStages = %v; want nil after cancel", err)
	}
	if got := strings.Join(order, ","); got != "producer,consumer,http" {
		t.Errorf("stop order = %s; want producer,consumer,http", got)
	}
}

func TestRunStages_FailureStopsAll(t *testing.T) {
	boom := errors.New("boom")
	stopped := make(chan string, 2)
	wait := func(name string) component {
		return component{name, func(ctx context.Context) error { <-ctx.Done(); stopped <- name; return ctx.Err() }}
	}
	err := runStages(context.Background(), slog.New(slog.DiscardHandler),
		[]component{{"producer", func(context.Context) error { return boom }}},
		[]component{wait("consumer")},
		[]component{wait("http")},
	)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "producer") {
		t.Errorf("runStages = %v; want the producer's error", err)
	}
	if len(stopped) != 2 {
		t.Errorf("%d components stopped; want 2", len(stopped))
	}

	err = runStages(context.Background(), slog.New(slog.DiscardHandler),
		[]component{{"quitter", func(context.Context) error { return nil }}})
	if err == nil || !strings.Contains(err.Error(), "stopped unexpectedly") {
		t.Errorf("runStages with a component that returns early = %v; want an error", err)
	}
}
