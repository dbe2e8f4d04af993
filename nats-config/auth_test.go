package natsconfig_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsconfig "github.com/jetsync/jetsync/nats-config"
	"github.com/jetsync/jetsync/nats-config/natstest"
)

var clusterPasswords = map[string]string{
	"NATS_CHANGE_STREAMER_PASSWORD": "cs-pw",
	"NATS_VIEW_SYNCER_PASSWORD":     "vs-pw",
	"NATS_ADMIN_PASSWORD":           "admin-pw",
	"NATS_SYS_PASSWORD":             "sys-pw",
}

func setClusterPasswords(t *testing.T) {
	for k, v := range clusterPasswords {
		t.Setenv(k, v)
	}
}

// startAuthServer runs one server with the cluster's auth.conf.
func startAuthServer(t *testing.T) string {
	t.Helper()
	setClusterPasswords(t)
	dir := t.TempDir()
	auth, err := os.ReadFile(filepath.Join(natstest.ClusterConfDir(), "auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "auth.conf"), auth, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "server.conf")
	body := fmt.Sprintf("listen: \"127.0.0.1:-1\"\njetstream { store_dir: %q }\ninclude ./auth.conf\n", filepath.Join(dir, "js"))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	o.NoLog, o.NoSigs = true, true
	ns, err := natsconfig.StartOptions(o, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return natsconfig.ListenURL(ns)
}

func connectAs(t *testing.T, url, user string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(user, clusterPasswords["NATS_"+map[string]string{
		"change-streamer": "CHANGE_STREAMER", "view-syncer": "VIEW_SYNCER", "admin": "ADMIN"}[user]+"_PASSWORD"]))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestClusterAuth runs auth.conf's users against a real server: each role
// can do its own part and not the others'. The full roles run with these
// users in e2e's topology tests.
func TestClusterAuth(t *testing.T) {
	url := startAuthServer(t)
	if _, err := nats.Connect(url); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connect: got %v, want an authorization error", err)
	}
	ctx := context.Background()
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	denied := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: allowed", what)
		}
	}
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Second) }

	cs := connectAs(t, url, "change-streamer")
	changes, err := cs.CreateStream(ctx, jetstream.StreamConfig{Name: "JETSYNC_zero_0_CHANGES", Subjects: []string{"jetsync.zero_0.changes.>"}})
	allowed("change-streamer creates the change stream", err)
	_, err = cs.Publish(ctx, "jetsync.zero_0.changes.public.issue", []byte("x"))
	allowed("change-streamer publishes a change", err)
	state, err := cs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "jetsync_zero_0_state"})
	allowed("change-streamer creates the state bucket", err)
	if state != nil {
		_, err = state.Put(ctx, "k", []byte("v"))
		allowed("change-streamer writes its state", err)
	}
	_, err = cs.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "jetsync_zero_0_snapshots"})
	allowed("change-streamer creates the snapshot store", err)
	if changes != nil {
		allowed("change-streamer purges the change stream", changes.Purge(ctx, jetstream.WithPurgeSequence(1)))
	}

	vs := connectAs(t, url, "view-syncer")
	c, err := vs.CreateOrUpdateConsumer(ctx, "JETSYNC_zero_0_CHANGES", jetstream.ConsumerConfig{Durable: "vs", FilterSubject: "jetsync.zero_0.changes.>"})
	allowed("view-syncer makes its durable consumer", err)
	if c != nil {
		_, err = c.Info(ctx)
		allowed("view-syncer reads its consumer", err)
	}
	_, err = vs.CreateStream(ctx, jetstream.StreamConfig{Name: "JETSYNC_zero_0_CVR", Subjects: []string{"jetsync.zero_0.cvr.*"}})
	allowed("view-syncer creates the CVR stream", err)
	_, err = vs.Publish(ctx, "jetsync.zero_0.cvr.g1", []byte("x"))
	allowed("view-syncer writes a CVR", err)
	owners, err := vs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "jetsync_zero_0_owners"})
	allowed("view-syncer creates the owners bucket", err)
	if owners != nil {
		_, err = owners.Put(ctx, "g1", []byte("me"))
		allowed("view-syncer writes an owner", err)
	}
	if state != nil {
		vstate, err := vs.KeyValue(ctx, "jetsync_zero_0_state")
		allowed("view-syncer opens the state bucket", err)
		if vstate != nil {
			_, err = vstate.Get(ctx, "k")
			allowed("view-syncer reads the state", err)
			sctx, cancel := short()
			_, err = vstate.Put(sctx, "k", []byte("forged"))
			cancel()
			denied("view-syncer writes the producer's state", err)
		}
	}
	sctx, cancel := short()
	_, err = vs.Publish(sctx, "jetsync.zero_0.changes.public.issue", []byte("forged"))
	cancel()
	denied("view-syncer publishes a change", err)
	vchanges, err := vs.Stream(ctx, "JETSYNC_zero_0_CHANGES")
	allowed("view-syncer reads the change stream's info", err)
	if vchanges != nil {
		sctx, cancel := short()
		denied("view-syncer purges the change stream", vchanges.Purge(sctx))
		cancel()
	}
	sctx, cancel = short()
	denied("view-syncer deletes the change stream", vs.DeleteStream(sctx, "JETSYNC_zero_0_CHANGES"))
	cancel()
	sctx, cancel = short()
	denied("change-streamer deletes a stream", cs.DeleteStream(sctx, "JETSYNC_zero_0_CVR"))
	cancel()

	admin := connectAs(t, url, "admin")
	allowed("admin deletes the change stream", admin.DeleteStream(ctx, "JETSYNC_zero_0_CHANGES"))
}
