package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/streams"
)

// TestCVR_Purge is issue 5's acceptance point 4: a client group inactive
// longer than ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS (a
// fraction of an hour here) is purged by garbage collection; its client,
// returning, is told so as zero-cache tells it (ClientNotFound, "Client has
// been purged due to inactivity"), and the real client starts a new group
// and syncs again.
func TestCVR_Purge(t *testing.T) {
	app := newCVRApp(t, 200)
	port := freePort(t)
	srv := start(t, app.runEnv(t, port,
		"JETSYNC_NATS_LISTEN=127.0.0.1:0", // the test watches the CVR stream
		// 1.8 s without a CVR write, checked twice a second; a group
		// without connections lets its lease go after 1 s.
		"ZERO_CVR_GARBAGE_COLLECTION_INACTIVITY_THRESHOLD_HOURS=0.0005",
		"ZERO_CVR_GARBAGE_COLLECTION_INITIAL_INTERVAL_SECONDS=0.5",
		"JETSYNC_GROUP_IDLE=1s",
	), "run")
	natsURL := str(t, srv.logRecord(t, "nats listening", 30*time.Second), "url")
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, srv, url, 90*time.Second)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	shard := streams.Shard{App: zeroAppID}

	d := startDriver(t, app.node)
	query := func(client string) {
		d.do(t, map[string]any{"cmd": "query", "client": client, "id": "open10", "table": "issue",
			"where": openIssuesQuery["where"], "orderBy": openIssuesQuery["orderBy"], "limit": 10})
	}
	d.openWired(t, "a", url, "u000001", "p")
	query("a")
	d.waitRowsEqual(t, "a", "open10", app.want(t))
	group := d.groups["a"]

	// While the client is connected, its group is owned and never purged,
	// however long it goes without a CVR write.
	idle := time.Now()
	polltest.Until(t, 10*time.Second, "garbage-collection passes with the client connected", func() bool {
		return time.Since(idle) > 4*time.Second
	})
	if tombstoned(t, js, shard, group) {
		t.Fatal("the group of a connected client was purged")
	}

	d.do(t, map[string]any{"cmd": "close", "client": "a"})
	polltest.Until(t, 30*time.Second, "garbage collection to purge the idle group", func() bool {
		return tombstoned(t, js, shard, group)
	})

	// The client comes back, as a reloaded tab would, to the same group.
	mark := d.mark()
	ack := d.openWired(t, "b", url, "u000001", "p")
	if ack.ClientGroupID != group {
		t.Fatalf("returning client's group %s; want the purged %s", ack.ClientGroupID, group)
	}
	polltest.Until(t, 30*time.Second, "client-state-not-found", func() bool { return d.wire(t, "b", mark).notFound > 0 })
	w := d.wire(t, "b", mark)
	if kinds := w.errorKinds(); len(kinds) == 0 || kinds[0] != "ClientNotFound: Client has been purged due to inactivity" {
		t.Errorf("the returning client got errors %v; want ClientNotFound: Client has been purged due to inactivity", kinds)
	}
	d.do(t, map[string]any{"cmd": "close", "client": "b"})

	// Zero's onClientStateNotFound reloads the page: a new instance on the
	// same storage starts a new group and syncs from scratch.
	ack = d.openWired(t, "c", url, "u000001", "p")
	if ack.ClientGroupID == group {
		t.Fatalf("after ClientNotFound the client kept the purged group %s", group)
	}
	query("c")
	d.waitRowsEqual(t, "c", "open10", app.want(t))
	d.waitState(t, "c", "connected", 30*time.Second)
}

// tombstoned reports whether a group's CVR subject ends in a garbage
// collector's tombstone.
func tombstoned(t *testing.T, js jetstream.JetStream, shard streams.Shard, group string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, shard.CVRStream())
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, shard.CVRSubject(group))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return m.Header.Get(streams.CVRHeaderDeleted) != ""
}
