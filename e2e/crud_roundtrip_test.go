package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pgtest"
)

// TestCRUDRoundTrip measures a CRUD write's round trip over a raw socket:
// from the push until a poke carries the client's new lastMutationID. It
// runs against jetsync, and against zero-cache 1.9.0 too with
// JETSYNC_E2E_REFERENCE=1; JETSYNC_E2E_CRUD_ROUNDTRIP=1 turns it on.
func TestCRUDRoundTrip(t *testing.T) {
	if os.Getenv("JETSYNC_E2E_CRUD_ROUNDTRIP") != "1" {
		t.Skip("set JETSYNC_E2E_CRUD_ROUNDTRIP=1 to measure")
	}
	servers := map[string]serverUnderTest{"jetsync": startJetsyncSyncer}
	if os.Getenv("JETSYNC_E2E_REFERENCE") == "1" {
		servers["zero-cache"] = startZeroCache
	}
	for name, start := range servers {
		t.Run(name, func(t *testing.T) {
			upstream := pgtest.NewDB(t, pgtest.Start(t))
			seedBench(t, pgBin(t), upstream, 20)
			deployPermissions(t, nodeBin(t), upstream, "app/crud-schema.mjs")
			srv := start(t, upstream)
			var own string
			if err := pgxQueryRow(t, upstream, `SELECT id FROM issue WHERE owner_id = 'u000001' ORDER BY id LIMIT 1`, &own); err != nil {
				t.Fatal(err)
			}
			ws := dialSync(t, srv, "rt-group", "rt-client", "", initConnection())
			const n = 300
			var took []time.Duration
			for id := 1; id <= n; id++ {
				frame := fmt.Sprintf(`["push",{"clientGroupID":"rt-group","mutations":[{"type":"crud","id":%d,"clientID":"rt-client","name":"_zero_crud","args":[{"ops":[{"op":"update","tableName":"issue","primaryKey":["id"],"value":{"id":%q,"title":"rt %d"}}]}],"timestamp":%d}],"pushVersion":1,"timestamp":%d,"requestID":"r%d"}]`,
					id, own, id, time.Now().UnixMilli(), time.Now().UnixMilli(), id)
				t0 := time.Now()
				if err := ws.ws.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
					t.Fatal(err)
				}
				for done := false; !done; {
					tag, body := ws.next(30 * time.Second)
					switch tag {
					case "error", "close":
						t.Fatalf("%s %s", tag, body)
					case "pokePart":
						var p struct {
							LastMutationIDChanges map[string]int `json:"lastMutationIDChanges"`
						}
						_ = json.Unmarshal(body, &p)
						done = p.LastMutationIDChanges["rt-client"] >= id
					}
				}
				took = append(took, time.Since(t0))
			}
			sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
			t.Logf("%s: CRUD update round trip over %d writes: p50 %v, p99 %v", name, n, took[n/2], took[n*99/100])
		})
	}
}

func pgxQueryRow(t *testing.T, url, q string, dst any) error {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.QueryRow(ctx, q).Scan(dst)
}
