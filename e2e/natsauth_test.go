package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetsync/jetsync/nats-config/natstest"
)

// TestNATSAuth_CredsTLS is issue 16's NATS acceptance: a change-streamer and
// a view-syncer reach a NATS server that wants TLS with client certificates
// and decentralized (operator JWT) auth, with a creds file, and the real Zero
// client still syncs a row inserted with SQL.
func TestNATSAuth_CredsTLS(t *testing.T) {
	app := newCVRApp(t, 50)
	ns := natstest.StartSecure(t, natstest.Operator)
	nats := []string{
		"JETSYNC_NATS_URL=" + ns.URL,
		"JETSYNC_NATS_CREDS=" + ns.Creds,
		"JETSYNC_NATS_TLS_CA=" + ns.CA,
		"JETSYNC_NATS_TLS_CERT=" + ns.Cert,
		"JETSYNC_NATS_TLS_KEY=" + ns.Key,
	}
	root := t.TempDir()
	cs := start(t, append(app.runEnv(t, 0, nats...), "JETSYNC_DATA_DIR="+filepath.Join(root, "cs")), "change-streamer")
	port := freePort(t)
	vs := start(t, append(app.runEnv(t, port, nats...), "JETSYNC_DATA_DIR="+filepath.Join(root, "vs"), "ZERO_TASK_ID=vs-1"), "view-syncer")
	for _, p := range []*proc{cs, vs} {
		rec := p.logRecord(t, "nats connecting", 30*time.Second)
		if rec["auth"] != "creds" || rec["tls_cert"] != ns.Cert {
			t.Errorf("%v: connect line %v: want auth=creds and the client certificate", p.cmd.Args, rec)
		}
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, vs, url, 90*time.Second)

	d := startDriver(t, app.node)
	d.openWired(t, "a", url, "u000001", "a")
	d.waitState(t, "a", "connected", 30*time.Second)
	d.do(t, map[string]any{"cmd": "query", "client": "a", "id": "open10", "table": "issue",
		"where": openIssuesQuery["where"], "orderBy": openIssuesQuery["orderBy"], "limit": 10})
	d.waitRowsEqual(t, "a", "open10", app.want(t))

	ids := app.windowIDs(t)
	app.exec(t, `UPDATE issue SET title = 'through TLS and creds' WHERE id = $1`, ids[0])
	d.waitRowsEqual(t, "a", "open10", app.want(t))

	creds, err := os.ReadFile(ns.Creds)
	if err != nil {
		t.Fatal(err)
	}
	var seed string
	for _, l := range strings.Split(string(creds), "\n") {
		if strings.HasPrefix(l, "SU") {
			seed = l
		}
	}
	if seed == "" {
		t.Fatalf("no user seed in %s", ns.Creds)
	}
	for _, p := range []*proc{vs, cs} {
		if strings.Contains(p.stderr.String(), seed) {
			t.Errorf("%v logged the creds' seed", p.cmd.Args)
		}
		if code := p.stop(t, 30*time.Second); code != 0 {
			t.Errorf("%v exit code %d after SIGTERM\n%s", p.cmd.Args, code, p.stderr.String())
		}
	}
}
