package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCVR_Rebuild is issue 5's acceptance point 3: a view-syncer whose
// local CVR projection (JETSYNC_CVR_FILE) was deleted rebuilds it from the
// CVR stream on restart, and serves the same catch-up as one that kept it:
// the real client, reconnecting with its cookie, gets exactly the change it
// missed.
func TestCVR_Rebuild(t *testing.T) {
	app := newCVRApp(t, 200)
	port := freePort(t)
	cvrFile := filepath.Join(t.TempDir(), "cvr", "projection.db")
	env := app.runEnv(t, port, "JETSYNC_CVR_FILE="+cvrFile, "ZERO_LOG_LEVEL=debug")
	if err := os.MkdirAll(filepath.Dir(cvrFile), 0o755); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := start(t, env, "run")
	waitHealthy(t, srv, url, 90*time.Second)

	d := startDriver(t, app.node)
	d.openWired(t, "a", url, "u000001", "a")
	d.do(t, map[string]any{"cmd": "query", "client": "a", "id": "open10", "table": "issue",
		"where": openIssuesQuery["where"], "orderBy": openIssuesQuery["orderBy"], "limit": 10})
	d.waitRowsEqual(t, "a", "open10", app.want(t))
	group := d.groups["a"]
	ids := app.windowIDs(t)

	// restart stops jetsync, makes the write it misses, optionally deletes
	// the projection, starts it again and checks the client's catch-up.
	// It returns how the group was loaded.
	restart := func(t *testing.T, n int, deleteProjection bool) cvrLoaded {
		base := d.lastCookie(t, "a")
		if code := srv.stop(t, 60*time.Second); code != 0 {
			t.Fatalf("jetsync run exit code %d after SIGTERM", code)
		}
		mark := d.mark()
		app.exec(t, `UPDATE issue SET title = $1 WHERE id = $2`, fmt.Sprintf("missed %d", n), ids[n])
		if deleteProjection {
			for _, suffix := range []string{"", "-wal", "-shm"} {
				if err := os.Remove(cvrFile + suffix); err != nil && !os.IsNotExist(err) {
					t.Fatal(err)
				}
			}
		}
		srv = start(t, env, "run")
		waitHealthy(t, srv, url, 90*time.Second)
		d.waitRowsEqual(t, "a", "open10", app.want(t))
		checkCatchup(t, d.wire(t, "a", mark), base, []string{"put:issue:" + ids[n]})
		return loadedLog(t, srv, group)
	}

	t.Run("Kept", func(t *testing.T) {
		l := restart(t, 1, false)
		if l.From == 0 || l.Rebuilt {
			t.Errorf("group loaded %+v with its projection kept; want it read from the local file", l)
		}
	})
	t.Run("Deleted", func(t *testing.T) {
		l := restart(t, 2, true)
		if l.From != 0 || l.Replayed == 0 {
			t.Errorf("group loaded %+v after its projection was deleted; want it replayed from the stream", l)
		}
		if _, err := os.Stat(cvrFile); err != nil {
			t.Errorf("no projection rebuilt at %s: %v", cvrFile, err)
		}
	})
}

// cvrLoaded is the view-syncer's "cvr loaded" debug record of a group.
type cvrLoaded struct {
	From     uint64 `json:"from"`
	Replayed int    `json:"replayed"`
	Rebuilt  bool   `json:"rebuilt"`
	Seq      uint64 `json:"seq"`
}

func loadedLog(t *testing.T, p *proc, group string) cvrLoaded {
	t.Helper()
	var l cvrLoaded
	found := false
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r struct {
			Msg   string `json:"msg"`
			Group string `json:"client_group"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Msg == "cvr loaded" && r.Group == group {
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatal(err)
			}
			found = true
		}
	}
	if !found {
		t.Fatalf("no \"cvr loaded\" record for group %s", group)
	}
	return l
}
