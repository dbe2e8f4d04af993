package natsconfig_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/nats-config/natstest"
)

// TestClusterConf checks what docker-compose's nodes run with: the shared
// settings of cluster.conf reach every node through its include.
func TestClusterConf(t *testing.T) {
	setClusterPasswords(t)
	for i := 1; i <= natstest.ClusterSize; i++ {
		t.Run(fmt.Sprintf("node%d", i), func(t *testing.T) {
			o := &server.Options{}
			if err := o.ProcessConfigFile(filepath.Join(natstest.ClusterConfDir(), fmt.Sprintf("node%d.conf", i))); err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("nats%d", i); o.ServerName != want {
				t.Errorf("server_name = %q; want %q", o.ServerName, want)
			}
			if !o.JetStream || !o.SyncAlways || o.StoreDir != "" {
				t.Errorf("jetstream %v, sync always %v, store %q; want on, on, left to -sd", o.JetStream, o.SyncAlways, o.StoreDir)
			}
			if o.MaxPayload != 1<<20 {
				t.Errorf("max payload = %d; want 1MB", o.MaxPayload)
			}
			if o.Cluster.Name != "jetsync" || o.Cluster.Port != 6222 || len(o.Routes) != 3 {
				t.Errorf("cluster %q port %d with %d routes; want jetsync, 6222, 3", o.Cluster.Name, o.Cluster.Port, len(o.Routes))
			}
			if len(o.Users) != 4 || o.SystemAccount != "SYS" {
				t.Errorf("%d users, system account %q; want auth.conf's 4 and SYS", len(o.Users), o.SystemAccount)
			}
			if o.Port != 4222 || o.HTTPPort != 8222 {
				t.Errorf("client port %d, monitoring port %d; want 4222, 8222", o.Port, o.HTTPPort)
			}
		})
	}
}

// TestCluster runs the three nodes in process: an R3 stream keeps taking
// writes with one node down and the node catches up when it returns.
func TestCluster(t *testing.T) {
	c := natstest.StartCluster(t)
	_, js := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	sent := 0
	publish := func(n int) {
		t.Helper()
		for range n {
			sent++
			i := sent
			// A publish right after the leader went away waits for the
			// election: retried, with the message ID deduplicating.
			id := jetstream.WithMsgID(fmt.Sprint(i))
			for {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(pctx, "r3.x", []byte{byte(i)}, id)
				cancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("publish: %v", err)
				}
			}
		}
	}
	publish(10)
	c.Stop(0)
	publish(10)
	c.Restart(0)
	publish(10)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 30 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Errorf("stream holds %d messages on %+v; want 30 on a leader and two replicas", info.State.Msgs, info.Cluster)
	}
}
