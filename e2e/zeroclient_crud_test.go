package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pgtest"
	"github.com/jetsync/jetsync/internal/polltest"
)

// TestZeroClient_CRUD: legacy CRUD mutators of the real client, with write
// rules deployed by zero-deploy-permissions (client/app/crud-schema.mjs),
// against `jetsync run`.
func TestZeroClient_CRUD(t *testing.T) { runCRUDSuite(t, startJetsyncSyncer) }

// TestZeroClient_CRUDReference runs the same cases against zero-cache 1.9.0.
func TestZeroClient_CRUDReference(t *testing.T) {
	if os.Getenv("JETSYNC_E2E_REFERENCE") != "1" {
		t.Skip("set JETSYNC_E2E_REFERENCE=1 (make e2e-reference) to run against zero-cache 1.9.0")
	}
	runCRUDSuite(t, startZeroCache)
}

func runCRUDSuite(t *testing.T, startServer serverUnderTest) {
	node := nodeBin(t)
	upstream := pgtest.NewDB(t, pgtest.Start(t))
	seedBench(t, pgBin(t), upstream, 20)
	deployPermissions(t, node, upstream, "app/crud-schema.mjs")
	ctx := context.Background()
	pg, err := pgx.Connect(ctx, upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(ctx) })
	srv := startServer(t, upstream)

	var own string // an issue of u000001's
	if err := pg.QueryRow(ctx, `SELECT id FROM issue WHERE owner_id = 'u000001' ORDER BY id LIMIT 1`).Scan(&own); err != nil {
		t.Fatal(err)
	}
	d := startDriver(t, node)
	open := func(client, user string) string {
		ack := d.do(t, map[string]any{"cmd": "open", "client": client, "server": srv.url, "userID": user,
			"auth": signToken(t, zeroSecret, user, time.Hour), "storageKey": client, "crud": true})
		d.waitState(t, client, "connected", 30*time.Second)
		return ack.ClientID
	}
	aID, bID := open("a", "u000001"), open("b", "u000002")
	// A third client, w, only watches: what it sees came by replication.
	open("w", "u000003")
	issueRows := func(id string) func() json.RawMessage {
		return func() json.RawMessage {
			return sqlRows(t, pg, `SELECT `+issueJSON+` FROM issue i WHERE i.id = '`+id+`'`)
		}
	}
	watch := func(id string) {
		d.do(t, map[string]any{"cmd": "query", "client": "w", "id": id, "table": "issue", "where": []any{"id", "=", id}})
		d.waitRowsEqual(t, "w", id, issueRows(id))
	}
	crud := func(client, table, op string, value map[string]any) {
		d.do(t, map[string]any{"cmd": "crud", "client": client, "table": table, "op": op, "value": value})
	}
	// applied waits until the server has taken client's mutations up to n.
	applied := func(clientID string, n int64) {
		t.Helper()
		polltest.Until(t, 30*time.Second, fmt.Sprintf("lastMutationID %d of %s", n, clientID), func() bool {
			var got int64
			err := pg.QueryRow(ctx, `SELECT "lastMutationID" FROM `+zeroAppID+`_0.clients WHERE "clientID" = $1`, clientID).Scan(&got)
			return err == nil && got >= n
		})
	}
	title := func(id string) string {
		var s string
		if err := pg.QueryRow(ctx, `SELECT title || '/' || coalesce(owner_id, '') FROM issue WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	stillConnected := func(client string, since int) {
		t.Helper()
		for _, ev := range d.since(since) {
			if ev.Client == client && (ev.Event == "connection" && ev.State != "connected" || ev.Event == "error") {
				t.Fatalf("%s left connected: %+v", client, ev)
			}
		}
	}
	watch(own)
	watch("crud-new")
	mark := d.mark()

	t.Run("Update", func(t *testing.T) {
		crud("a", "issue", "update", map[string]any{"id": own, "title": "crud updated"})
		applied(aID, 1)
		if got := title(own); got != "crud updated/u000001" {
			t.Fatalf("upstream: %s", got)
		}
		d.waitRowsEqual(t, "w", own, issueRows(own))
	})
	t.Run("Insert", func(t *testing.T) {
		crud("a", "issue", "insert", map[string]any{"id": "crud-new", "title": "crud inserted", "open": true,
			"modified": 7.5, "owner_id": "u000002", "created": 1764504000123.0})
		applied(aID, 2)
		d.waitRowsEqual(t, "w", "crud-new", issueRows("crud-new"))
		if got := title("crud-new"); got != "crud inserted/u000002" {
			t.Fatalf("upstream: %s", got)
		}
	})
	t.Run("Delete", func(t *testing.T) {
		crud("a", "issue", "delete", map[string]any{"id": "crud-new"})
		applied(aID, 3)
		d.waitRowsEqual(t, "w", "crud-new", issueRows("crud-new"))
		var n int
		if err := pg.QueryRow(ctx, `SELECT count(*) FROM issue WHERE id = 'crud-new'`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("crud-new still upstream: %d %v", n, err)
		}
	})
	t.Run("TableWithoutRuleDenied", func(t *testing.T) {
		crud("a", "label", "insert", map[string]any{"id": "crud-label", "name": "denied"})
		applied(aID, 4)
		var n int
		if err := pg.QueryRow(ctx, `SELECT count(*) FROM label WHERE id = 'crud-label'`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("denied label upstream: %d %v", n, err)
		}
		// Still connected: the next write goes through.
		crud("a", "issue", "update", map[string]any{"id": own, "title": "after denial"})
		applied(aID, 5)
		if got := title(own); got != "after denial/u000001" {
			t.Fatalf("upstream after denial: %s", got)
		}
		stillConnected("a", mark)
	})
	t.Run("RulesOnSub", func(t *testing.T) {
		// preMutation: the issue is not u000002's.
		crud("b", "issue", "update", map[string]any{"id": own, "title": "by b"})
		applied(bID, 1)
		// postMutation: u000001 may not give the issue away.
		crud("a", "issue", "update", map[string]any{"id": own, "owner_id": "u000002", "title": "given away"})
		applied(aID, 6)
		if got := title(own); got != "after denial/u000001" {
			t.Fatalf("upstream after denied updates: %s", got)
		}
		d.waitRowsEqual(t, "w", own, issueRows(own))
		// The owner's own update still goes through.
		crud("a", "issue", "update", map[string]any{"id": own, "title": "owner again"})
		applied(aID, 7)
		if got := title(own); got != "owner again/u000001" {
			t.Fatalf("upstream: %s", got)
		}
		stillConnected("a", mark)
		stillConnected("b", mark)
	})
	t.Run("ReplayedMutationID", func(t *testing.T) {
		ws := dialSync(t, srv, "crud-raw-group", "crud-raw-client", "", initConnection())
		push := func(id int, ops string) {
			t.Helper()
			frame := fmt.Sprintf(`["push",{"clientGroupID":"crud-raw-group","mutations":[{"type":"crud","id":%d,"clientID":"crud-raw-client","name":"_zero_crud","args":[{"ops":[%s]}],"timestamp":%d}],"pushVersion":1,"timestamp":%d,"requestID":"r%d"}]`,
				id, ops, time.Now().UnixMilli(), time.Now().UnixMilli(), id)
			if err := ws.ws.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
				t.Fatal(err)
			}
		}
		row := func(id, title string) string {
			return fmt.Sprintf(`{"op":"upsert","tableName":"issue","primaryKey":["id"],"value":{"id":%q,"title":%q,"open":true,"modified":1,"owner_id":"u000001","created":1764504000123}}`, id, title)
		}
		push(1, row("crud-replay", "first"))
		push(1, row("crud-replay", "replayed"))
		push(2, row("crud-replay-2", "second"))
		applied("crud-raw-client", 2)
		if got := title("crud-replay"); got != "first/u000001" {
			t.Fatalf("replayed mutation applied again: %s", got)
		}
		var lmid int64
		if err := pg.QueryRow(ctx, `SELECT "lastMutationID" FROM `+zeroAppID+`_0.clients WHERE "clientID" = 'crud-raw-client'`).Scan(&lmid); err != nil || lmid != 2 {
			t.Fatalf("lastMutationID %d %v, want 2", lmid, err)
		}
		// A failing write is a MutationFailed error frame; its id is used
		// and the connection carries on.
		push(3, `{"op":"insert","tableName":"issue","primaryKey":["id"],"value":{"id":"crud-fail","open":true,"modified":1,"created":1764504000123}}`)
		for {
			tag, body := ws.next(30 * time.Second)
			if tag == "close" {
				t.Fatalf("closed after a failed mutation: %s", body)
			}
			if tag == "error" {
				var e struct{ Kind, Message, Origin string }
				_ = json.Unmarshal(body, &e)
				if e.Kind != "MutationFailed" || !strings.HasPrefix(e.Message, "PostgresError: null value in column \"title\"") || e.Origin != "zeroCache" {
					t.Fatalf("error frame %s", body)
				}
				break
			}
		}
		push(4, row("crud-replay-2", "fourth"))
		applied("crud-raw-client", 4)
		if got := title("crud-replay-2"); got != "fourth/u000001" {
			t.Fatalf("after a failed mutation: %s", got)
		}
		// A gap is InvalidPush, and the connection ends.
		push(6, row("crud-replay", "gap"))
		for {
			tag, body := ws.next(30 * time.Second)
			if tag == "close" {
				t.Fatalf("closed without an error frame: %s", body)
			}
			if tag == "error" {
				if !strings.Contains(string(body), `"InvalidPush"`) || !strings.Contains(string(body), "Expected mutation id 5") {
					t.Fatalf("error frame %s", body)
				}
				break
			}
		}
		if got := title("crud-replay"); got != "first/u000001" {
			t.Fatalf("out-of-order mutation applied: %s", got)
		}
	})
}
