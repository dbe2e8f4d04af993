package mutagen_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetsync/jetsync/consumers/mutagen"
	"github.com/jetsync/jetsync/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The app and shard tables as jetsync's change-streamer creates them.
const setupSQL = `
CREATE SCHEMA zero;
CREATE TABLE zero.permissions ("permissions" JSONB, "hash" TEXT, "lock" BOOL PRIMARY KEY DEFAULT true CHECK (lock));
CREATE SCHEMA zero_0;
CREATE TABLE zero_0.clients ("clientGroupID" TEXT NOT NULL, "clientID" TEXT NOT NULL, "lastMutationID" BIGINT NOT NULL, "userID" TEXT, PRIMARY KEY ("clientGroupID", "clientID"));
CREATE TABLE "user" (id TEXT PRIMARY KEY, role TEXT NOT NULL);
CREATE TABLE issue (id TEXT PRIMARY KEY, title TEXT NOT NULL, owner_id TEXT, n INT, meta JSONB, created TIMESTAMPTZ);
CREATE TABLE secret (id TEXT PRIMARY KEY);
INSERT INTO "user" VALUES ('alice', 'admin'), ('bob', 'member');
CREATE SCHEMA other;
CREATE TABLE other.note (id TEXT PRIMARY KEY, author TEXT);
`

// Rules: an issue's owner may update it and may not give it away; anyone
// may insert an issue they own; only admins (a user row with role admin,
// through EXISTS) may delete. secret has no rules.
const rulesJSON = `{"tables": {"issue": {"row": {
	"insert": [["allow", {"type": "simple", "left": {"type": "column", "name": "owner_id"}, "op": "=", "right": {"type": "static", "anchor": "authData", "field": "sub"}}]],
	"update": {
		"preMutation": [["allow", {"type": "simple", "left": {"type": "column", "name": "owner_id"}, "op": "=", "right": {"type": "static", "anchor": "authData", "field": "sub"}}]],
		"postMutation": [["allow", {"type": "simple", "left": {"type": "column", "name": "owner_id"}, "op": "=", "right": {"type": "static", "anchor": "authData", "field": "sub"}}]]
	},
	"delete": [["allow", {"type": "correlatedSubquery", "op": "EXISTS",
		"related": {"correlation": {"parentField": ["owner_id"], "childField": ["id"]},
			"subquery": {"table": "user", "alias": "zsubq_owner", "where": {"type": "simple", "left": {"type": "column", "name": "role"}, "op": "=", "right": {"type": "literal", "value": "admin"}}}}}]]
}},
	"other.note": {"row": {"insert": [["allow", {"type": "simple", "left": {"type": "column", "name": "author"}, "op": "=", "right": {"type": "static", "anchor": "authData", "field": "sub"}}]]}}
}}`

type fixture struct {
	t    *testing.T
	pool *pgxpool.Pool
	m    *mutagen.Mutagen
	ctx  context.Context
	// custom says custom mutators are configured beside CRUD.
	custom bool
}

func newFixture(t *testing.T, cfg mutagen.Config) *fixture {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	url := pgtest.NewDB(t, pgtest.Start(t))
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, setupSQL); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO zero.permissions (permissions) VALUES ($1::jsonb)`, rulesJSON); err != nil {
		t.Fatal(err)
	}
	cfg.AppID = "zero"
	return &fixture{t: t, pool: pool, m: mutagen.New(pool, cfg), ctx: ctx}
}

func (f *fixture) push(client string, id int64, sub string, ops ...mutagen.Op) (*mutagen.MutationError, error) {
	f.t.Helper()
	args, _ := json.Marshal([]any{map[string]any{"ops": ops}})
	var auth map[string]any
	if sub != "" {
		auth = map[string]any{"sub": sub}
	}
	return f.m.Process(f.ctx, "cg1", mutagen.Mutation{ID: id, ClientID: client, Args: args}, auth, f.custom)
}

func (f *fixture) mustPush(client string, id int64, sub string, ops ...mutagen.Op) {
	f.t.Helper()
	merr, err := f.push(client, id, sub, ops...)
	if err != nil || merr != nil {
		f.t.Fatalf("mutation %d: %v %+v", id, err, merr)
	}
}

func (f *fixture) scalar(q string, args ...any) any {
	f.t.Helper()
	var v any
	if err := f.pool.QueryRow(f.ctx, q, args...).Scan(&v); err != nil {
		f.t.Fatalf("%s: %v", q, err)
	}
	return v
}

func (f *fixture) lastMutationID(client string) int64 {
	f.t.Helper()
	var v int64
	err := f.pool.QueryRow(f.ctx, `SELECT "lastMutationID" FROM zero_0.clients WHERE "clientGroupID" = 'cg1' AND "clientID" = $1`, client).Scan(&v)
	if err != nil {
		f.t.Fatal(err)
	}
	return v
}

func issueOp(op, id string, value map[string]any) mutagen.Op {
	v := map[string]any{"id": id}
	for k, x := range value {
		v[k] = x
	}
	return mutagen.Op{Op: op, TableName: "issue", PrimaryKey: []string{"id"}, Value: v}
}

func TestProcess_OpsAndRules(t *testing.T) {
	f := newFixture(t, mutagen.Config{})
	count := func() int64 { return f.scalar(`SELECT count(*) FROM issue`).(int64) }

	// Insert allowed for the owner, with JSON and numbers.
	f.mustPush("c1", 1, "alice", issueOp("insert", "i1", map[string]any{"title": "a", "owner_id": "alice", "n": float64(3), "meta": map[string]any{"k": []any{1.0}}, "created": float64(1764504000123)}))
	if got := f.scalar(`SELECT title || n || meta::text || (extract(epoch FROM created) * 1000)::bigint FROM issue WHERE id = 'i1'`); got != `a3{"k": [1]}1764504000123` {
		t.Fatalf("inserted row: %v", got)
	}
	// An insert owned by someone else is denied: id consumed, no row.
	f.mustPush("c1", 2, "alice", issueOp("insert", "i2", map[string]any{"title": "b", "owner_id": "bob"}))
	if count() != 1 || f.lastMutationID("c1") != 2 {
		t.Fatalf("denied insert: %d rows, lmid %d", count(), f.lastMutationID("c1"))
	}
	// preMutation: bob may not update alice's issue; alice may.
	f.mustPush("c2", 1, "bob", issueOp("update", "i1", map[string]any{"title": "by bob"}))
	f.mustPush("c1", 3, "alice", issueOp("update", "i1", map[string]any{"title": "by alice"}))
	if got := f.scalar(`SELECT title FROM issue WHERE id = 'i1'`); got != "by alice" {
		t.Fatalf("title after updates: %v", got)
	}
	// postMutation: alice may not give her issue to bob.
	f.mustPush("c1", 4, "alice", issueOp("update", "i1", map[string]any{"owner_id": "bob", "title": "given"}))
	if got := f.scalar(`SELECT owner_id || title FROM issue WHERE id = 'i1'`); got != "aliceby alice" {
		t.Fatalf("row after denied postMutation: %v", got)
	}
	// Upsert of an existing row is checked as an update.
	f.mustPush("c1", 5, "alice", issueOp("upsert", "i1", map[string]any{"title": "upserted", "owner_id": "alice"}))
	f.mustPush("c2", 2, "bob", issueOp("upsert", "i1", map[string]any{"title": "bob's", "owner_id": "bob"}))
	if got := f.scalar(`SELECT title FROM issue WHERE id = 'i1'`); got != "upserted" {
		t.Fatalf("title after upserts: %v", got)
	}
	// Delete through EXISTS: the owner alice is an admin.
	f.mustPush("c2", 3, "bob", issueOp("insert", "i3", map[string]any{"title": "bob's", "owner_id": "bob"}))
	f.mustPush("c2", 4, "bob", issueOp("delete", "i3", nil))
	f.mustPush("c1", 6, "alice", issueOp("delete", "i1", nil))
	if got := f.scalar(`SELECT string_agg(id, ',') FROM issue`); got != "i3" {
		t.Fatalf("rows after deletes: %v", got)
	}
	// A table without rules denies.
	f.mustPush("c1", 7, "alice", mutagen.Op{Op: "insert", TableName: "secret", PrimaryKey: []string{"id"}, Value: map[string]any{"id": "s"}})
	if n := f.scalar(`SELECT count(*) FROM secret`).(int64); n != 0 || f.lastMutationID("c1") != 7 {
		t.Fatalf("secret: %d rows, lmid %d", n, f.lastMutationID("c1"))
	}
	// A table outside public is named schema.table.
	note := func(id, author string) mutagen.Op {
		return mutagen.Op{Op: "insert", TableName: "other.note", PrimaryKey: []string{"id"}, Value: map[string]any{"id": id, "author": author}}
	}
	f.mustPush("c1", 8, "alice", note("n1", "alice"), note("n2", "bob"))
	f.mustPush("c1", 9, "alice", note("n3", "alice"))
	if got := f.scalar(`SELECT string_agg(id, ',' ORDER BY id) FROM other.note`); got != "n3" {
		t.Fatalf("other.note: %v (a mutation with one denied op writes none)", got)
	}
	// Without authData, the owner rule matches nothing.
	f.mustPush("c3", 1, "", issueOp("insert", "i4", map[string]any{"title": "anon", "owner_id": nil}))
	if count() != 1 {
		t.Fatalf("anonymous insert went through")
	}
}

func TestProcess_MutationIDs(t *testing.T) {
	f := newFixture(t, mutagen.Config{})
	ins := issueOp("insert", "i1", map[string]any{"title": "a", "owner_id": "alice"})
	f.mustPush("c1", 1, "alice", ins)
	f.mustPush("c1", 2, "alice", issueOp("delete", "i1", nil))
	// A replay of 1 is skipped: the row stays deleted.
	f.mustPush("c1", 1, "alice", ins)
	if n := f.scalar(`SELECT count(*) FROM issue`).(int64); n != 0 || f.lastMutationID("c1") != 2 {
		t.Fatalf("after replay: %d rows, lmid %d", n, f.lastMutationID("c1"))
	}
	// Skipping ahead stops the push with InvalidPush and changes nothing.
	_, err := f.push("c1", 5, "alice", ins)
	var pe *mutagen.PushError
	if !errors.As(err, &pe) || pe.Kind != "InvalidPush" || !strings.Contains(pe.Message, "Expected mutation id 3") {
		t.Fatalf("out of order: %v", err)
	}
	if f.lastMutationID("c1") != 2 {
		t.Fatalf("lmid after out-of-order: %d", f.lastMutationID("c1"))
	}
	// Beside custom mutators, a gap is waited on: the API server may be
	// about to commit the missing id.
	f.custom = true
	done := make(chan error, 1)
	go func() {
		merr, err := f.push("c1", 4, "alice", issueOp("insert", "i4", map[string]any{"title": "late", "owner_id": "alice"}))
		if merr != nil {
			err = errors.New(merr.Message)
		}
		done <- err
	}()
	if _, err := f.pool.Exec(f.ctx, `UPDATE zero_0.clients SET "lastMutationID" = 3 WHERE "clientID" = 'c1'`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("mutation after the custom one: %v", err)
	}
	if n := f.scalar(`SELECT count(*) FROM issue WHERE id = 'i4'`).(int64); n != 1 {
		t.Fatalf("mutation after the custom one not applied")
	}
}

func TestProcess_Failures(t *testing.T) {
	f := newFixture(t, mutagen.Config{LimitMax: 3, LimitWindow: time.Hour})
	// A failed write (NOT NULL) is MutationFailed, and its id is consumed.
	merr, err := f.push("c1", 1, "alice", issueOp("insert", "i1", map[string]any{"owner_id": "alice"}))
	if err != nil || merr == nil || merr.Kind != "MutationFailed" || !strings.Contains(merr.Message, "null value") {
		t.Fatalf("not-null: %v %+v", err, merr)
	}
	// So is a table that does not exist.
	merr, err = f.push("c1", 2, "alice", mutagen.Op{Op: "insert", TableName: "nope", PrimaryKey: []string{"id"}, Value: map[string]any{"id": "x"}})
	if err != nil || merr == nil || merr.Message != "Error: Table 'nope' is not a valid table." {
		t.Fatalf("unknown table: %v %+v", err, merr)
	}
	// And an update of a row that is not there.
	merr, err = f.push("c1", 3, "alice", issueOp("update", "zz", map[string]any{"title": "x"}))
	if err != nil || merr == nil || !strings.Contains(merr.Message, "Pre-mutation row not found") {
		t.Fatalf("missing row: %v %+v", err, merr)
	}
	if f.lastMutationID("c1") != 3 {
		t.Fatalf("lmid: %d", f.lastMutationID("c1"))
	}
	// The fourth mutation in the window is rate limited, id not consumed.
	merr, err = f.push("c1", 4, "alice", issueOp("insert", "i1", map[string]any{"title": "t", "owner_id": "alice"}))
	if err != nil || merr == nil || merr.Kind != "MutationRateLimited" || merr.Message != "Rate limit exceeded" {
		t.Fatalf("rate limit: %v %+v", err, merr)
	}
	if f.lastMutationID("c1") != 3 {
		t.Fatalf("lmid after rate limit: %d", f.lastMutationID("c1"))
	}
}

// TestProcess_Timeout holds a row lock upstream: a mutation that waits on
// it fails after the timeout, its id consumed, and the next one goes on.
func TestProcess_Timeout(t *testing.T) {
	f := newFixture(t, mutagen.Config{Timeout: 500 * time.Millisecond})
	f.mustPush("c1", 1, "alice", issueOp("insert", "i1", map[string]any{"title": "a", "owner_id": "alice"}))
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(f.ctx) }()
	if _, err := tx.Exec(f.ctx, `SELECT * FROM issue WHERE id = 'i1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	merr, err := f.push("c1", 2, "alice", issueOp("update", "i1", map[string]any{"title": "b"}))
	if err != nil || merr == nil || merr.Kind != "MutationFailed" || merr.Message != "Error: mutation timed out after 500ms" {
		t.Fatalf("locked row: %v %+v; want MutationFailed, timed out", err, merr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the mutation failed after %v; want near its 500ms timeout", d)
	}
	if got := f.lastMutationID("c1"); got != 2 {
		t.Errorf("lmid %d after the timed-out mutation; want 2, its id consumed", got)
	}
	if err := tx.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.mustPush("c1", 3, "alice", issueOp("update", "i1", map[string]any{"title": "c"}))
	if got := f.scalar(`SELECT title FROM issue WHERE id = 'i1'`); got != "c" {
		t.Errorf("title %v after the lock went; want c", got)
	}
}
