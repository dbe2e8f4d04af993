package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/jetsync/jetsync/internal/pgtest"
)

// TestSettings_ZeroCacheEnv runs `jetsync run` with settings from a
// zero-cache environment file: those with no effect here are logged at
// startup with why and what replaces them, naming the stream and bucket,
// and the process serves as usual; a refused one stops a view-syncer before
// it does anything, with the reason.
func TestSettings_ZeroCacheEnv(t *testing.T) {
	upstream := pgtest.NewDB(t, pgtest.Start(t))
	root := dataRoot(t)
	srv := start(t, []string{
		"JETSYNC_DATA_DIR=" + filepath.Join(root, "data"),
		"ZERO_UPSTREAM_DB=" + upstream,
		"ZERO_PORT=0",
		"JETSYNC_NATS_LISTEN=",
		"ZERO_LOG_FORMAT=json",
		"ZERO_APP_ID=envapp",
		"ZERO_CVR_DB=postgres://zero:cvr-topsecret@cvr-db/zero_cvr",
		"ZERO_CHANGE_DB=postgres://zero:cdc-topsecret@cdc-db/zero_cdc",
		"ZERO_LITESTREAM_BACKUP_URL=s3://bucket/replica",
		"ZERO_NUM_SYNC_WORKERS=4",
	}, "run")
	srv.logRecord(t, "jetsync running", 90*time.Second)
	byName := map[string]map[string]any{}
	for _, r := range srv.logRecords("zero-cache setting has no effect in jetsync") {
		byName[str(t, r, "setting")] = r
	}
	for setting, want := range map[string][]string{
		"ZERO_CVR_DB":                {"JETSYNC_envapp_0_CVR", "jetsync_envapp_0_owners"},
		"ZERO_CHANGE_DB":             {"JETSYNC_envapp_0_CHANGES", "jetsync_envapp_0_state"},
		"ZERO_LITESTREAM_BACKUP_URL": {"jetsync_envapp_0_snapshots"},
		"ZERO_NUM_SYNC_WORKERS":      {"goroutines"},
	} {
		r, ok := byName[setting]
		if !ok {
			t.Errorf("no startup log line for %s", setting)
			continue
		}
		for _, w := range want {
			if why, _ := r["why"].(string); !strings.Contains(why, w) {
				t.Errorf("%s: why %q does not name %s", setting, why, w)
			}
		}
	}
	if strings.Contains(srv.stderr.String(), "topsecret") {
		t.Errorf("a password from an ignored setting reached the log")
	}

	// A view-syncer given zero-cache's change-streamer URI and no NATS URL
	// would look for NATS on localhost forever: it refuses, exit 2.
	cmd := exec.Command(jetsyncBin, "view-syncer")
	cmd.Env = append(baseEnv(), "JETSYNC_DATA_DIR="+filepath.Join(root, "vs"), "ZERO_CHANGE_STREAMER_URI=ws://replication-manager:4849")
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 2 {
		t.Fatalf("view-syncer with ZERO_CHANGE_STREAMER_URI: exit %d (%v), want 2:\n%s", code, err, out)
	}
	if !strings.Contains(string(out), "ZERO_CHANGE_STREAMER_URI is set") || !strings.Contains(string(out), "JETSYNC_NATS_URL") {
		t.Errorf("the refusal does not say what to set:\n%s", out)
	}
}

// logRecords returns every JSON log line with this msg so far.
func (p *proc) logRecords(msg string) []map[string]any {
	var recs []map[string]any
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil && r["msg"] == msg {
			recs = append(recs, r)
		}
	}
	return recs
}

// TestSettings_WebsocketMaxPayload: ZERO_WEBSOCKET_MAX_PAYLOAD_BYTES is
// honoured as zero-cache honours it: a client message over the limit closes
// its connection with 1009 (message too big), one under it is served.
func TestSettings_WebsocketMaxPayload(t *testing.T) {
	upstream := pgtest.NewDB(t, pgtest.Start(t))
	p := start(t, runEnv(t, upstream, 0, "ZERO_APP_PUBLICATIONS=", "ZERO_WEBSOCKET_MAX_PAYLOAD_BYTES=4000"), "run")
	port := int(p.logRecord(t, "http listening", 60*time.Second)["port"].(float64))
	srv := &syncServer{url: fmt.Sprintf("http://127.0.0.1:%d", port), proc: p}
	waitHealthy(t, p, srv.url, 90*time.Second)

	c := dialSync(t, srv, "g1", "c1", "", "")
	ping := func(pad int) error {
		return c.ws.WriteMessage(websocket.TextMessage, []byte(`["ping",{"pad":"`+strings.Repeat("x", pad)+`"}]`))
	}
	// readTag reads frames until one tagged want, or the socket's error.
	readTag := func(want string) error {
		for {
			_ = c.ws.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, data, err := c.ws.ReadMessage()
			if err != nil {
				return err
			}
			if strings.HasPrefix(string(data), `["`+want+`"`) {
				return nil
			}
		}
	}
	if err := ping(3000); err != nil {
		t.Fatal(err)
	}
	if err := readTag("pong"); err != nil {
		t.Fatalf("a 3000-byte ping under the 4000-byte limit: %v", err)
	}
	if err := ping(5000); err != nil {
		t.Fatal(err)
	}
	err := readTag("pong")
	if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
		t.Fatalf("a 5000-byte ping over the 4000-byte limit: %v; want close %d", err, websocket.CloseMessageTooBig)
	}
}
