package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetsync/jetsync/producers/pgrepl/pgtest"
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
