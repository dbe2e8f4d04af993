package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetsync/jetsync/internal/logkey"
)

// demoMutatePath is where `jetsync run` serves the demo app's push endpoint:
// the API server that ZERO_MUTATE_URL points at when the demo page is on and
// no mutate URL is set.
const demoMutatePath = "/demo/api/mutate"

// demoAPI runs the demo app's custom mutators (web/demo/src/mutators.ts runs
// the same ones optimistically in the browser) against the upstream, as
// zero's server-side push handler does: each mutation in its own
// transaction, together with the client's lastMutationID bump; a mutator
// that fails is rolled back and its error recorded, in a second
// transaction, as a <shard>.mutations row that reaches the client through
// replication.
type demoAPI struct {
	db    *pgxpool.Pool
	shard string // <app>_<num>: the schema of clients and mutations
	log   *slog.Logger
}

func newDemoAPI(ctx context.Context, upstream, shardSchema string, log *slog.Logger) (*demoAPI, error) {
	cfg, err := pgxpool.ParseConfig(upstream)
	if err != nil {
		return nil, fmt.Errorf("demo api: %w", err)
	}
	cfg.MaxConns = 4
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("demo api: %w", err)
	}
	return &demoAPI{db: db, shard: shardSchema, log: log}, nil
}

func (d *demoAPI) Close() { d.db.Close() }

// The push body and the answers, as docs/protocol.md §4.5 and §14 give them.
type demoPush struct {
	ClientGroupID string         `json:"clientGroupID"`
	PushVersion   int            `json:"pushVersion"`
	Mutations     []demoMutation `json:"mutations"`
}

type demoMutation struct {
	Type     string            `json:"type"`
	ID       int64             `json:"id"`
	ClientID string            `json:"clientID"`
	Name     string            `json:"name"`
	Args     []json.RawMessage `json:"args"`
}

type demoMutationID struct {
	ClientID string `json:"clientID"`
	ID       int64  `json:"id"`
}

type demoResult struct {
	ID     demoMutationID `json:"id"`
	Result map[string]any `json:"result"`
}

type demoPushFailed struct {
	Kind        string           `json:"kind"`
	Origin      string           `json:"origin"`
	Reason      string           `json:"reason"`
	Message     string           `json:"message"`
	MutationIDs []demoMutationID `json:"mutationIDs"`
}

// errOutOfOrder stops a push: a later mutation can't run before an earlier
// one that never arrived.
var errOutOfOrder = errors.New("out of order mutation")

// errNotCustom fails a push holding a CRUD mutation: the demo has none.
var errNotCustom = errors.New("not a custom mutation")

// errAlreadyProcessed answers a mutation pushed again after it committed.
var errAlreadyProcessed = errors.New("mutation already processed")

func (d *demoAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reply := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	var push demoPush
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err == nil {
		err = json.Unmarshal(body, &push)
	}
	ids := make([]demoMutationID, len(push.Mutations))
	for i, m := range push.Mutations {
		ids[i] = demoMutationID{ClientID: m.ClientID, ID: m.ID}
	}
	failed := func(reason, msg string, ids []demoMutationID) demoPushFailed {
		if ids == nil {
			ids = []demoMutationID{}
		}
		return demoPushFailed{Kind: "PushFailed", Origin: "server", Reason: reason, Message: msg, MutationIDs: ids}
	}
	if err != nil {
		reply(failed("parse", "Failed to parse push body: "+err.Error(), ids))
		return
	}
	if s := r.URL.Query().Get("schema"); s != "" && s != d.shard {
		reply(failed("parse", fmt.Sprintf("schema %q is not this app's %q", s, d.shard), ids))
		return
	}
	if push.PushVersion != 1 {
		reply(failed("unsupportedPushVersion", fmt.Sprintf("Unsupported push version: %d", push.PushVersion), ids))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), demoTimeout)
	defer cancel()
	results := []demoResult{}
	for i, m := range push.Mutations {
		if m.Type == "custom" && m.Name == "_zero_cleanupResults" {
			if err := d.cleanup(ctx, m); err != nil {
				d.log.Warn("demo api: cleanup results", "err", err)
			}
			continue
		}
		res, err := d.apply(ctx, push.ClientGroupID, m)
		if err != nil {
			reason := "database"
			switch {
			case errors.Is(err, errOutOfOrder):
				reason = "oooMutation"
			case errors.Is(err, errNotCustom):
				reason = "internal"
			}
			d.log.Warn("demo api: push failed", logkey.ClientGroup, push.ClientGroupID, "mutation", m.ID, "err", err)
			reply(failed(reason, err.Error(), ids[i:]))
			return
		}
		results = append(results, res)
	}
	reply(map[string]any{"kind": "MutateResponse", "mutations": results})
}

// apply runs one mutation. A mutator's error is the app's: it is recorded
// with the lastMutationID bump in a transaction of its own, and answered as
// an "app" result; only a failure of that bookkeeping fails the push.
func (d *demoAPI) apply(ctx context.Context, group string, m demoMutation) (demoResult, error) {
	res := demoResult{ID: demoMutationID{ClientID: m.ClientID, ID: m.ID}, Result: map[string]any{}}
	if m.Type != "custom" {
		return res, fmt.Errorf("%w: mutation %d is %q", errNotCustom, m.ID, m.Type)
	}
	var args json.RawMessage
	if len(m.Args) > 0 {
		args = m.Args[0]
	}
	appErr := d.transact(ctx, group, m, func(tx pgx.Tx) error { return runDemoMutator(ctx, tx, m.Name, args) })
	switch {
	case appErr == nil:
		return res, nil
	case errors.Is(appErr, errAlreadyProcessed):
		res.Result = map[string]any{"error": "alreadyProcessed", "details": appErr.Error()}
		return res, nil
	case errors.Is(appErr, errOutOfOrder):
		return res, appErr
	}
	res.Result = map[string]any{"error": "app", "message": appErr.Error()}
	result, _ := json.Marshal(res.Result)
	err := d.transact(ctx, group, m, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{d.shard}.Sanitize()+`.mutations
			("clientGroupID", "clientID", "mutationID", "result") VALUES ($1, $2, $3, $4::text::json)`,
			group, m.ClientID, m.ID, string(result))
		return err
	})
	switch {
	case err == nil, errors.Is(err, errAlreadyProcessed):
		return res, nil
	default:
		return res, err
	}
}

// transact runs fn in one transaction with the client's lastMutationID bump,
// which must land exactly on the mutation's ID.
func (d *demoAPI) transact(ctx context.Context, group string, m demoMutation, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, d.db, func(tx pgx.Tx) error {
		var lmid int64
		err := tx.QueryRow(ctx, `INSERT INTO `+pgx.Identifier{d.shard}.Sanitize()+`.clients AS current
			("clientGroupID", "clientID", "lastMutationID") VALUES ($1, $2, 1)
			ON CONFLICT ("clientGroupID", "clientID")
			DO UPDATE SET "lastMutationID" = current."lastMutationID" + 1
			RETURNING "lastMutationID"`, group, m.ClientID).Scan(&lmid)
		if err != nil {
			return err
		}
		switch {
		case m.ID < lmid:
			return fmt.Errorf("%w: client %s sent mutation ID %d but expected %d", errAlreadyProcessed, m.ClientID, m.ID, lmid)
		case m.ID > lmid:
			return fmt.Errorf("%w: client %s sent mutation ID %d but expected %d", errOutOfOrder, m.ClientID, m.ID, lmid)
		}
		return fn(tx)
	})
}

// cleanup deletes the mutation results the client acknowledged.
func (d *demoAPI) cleanup(ctx context.Context, m demoMutation) error {
	if len(m.Args) == 0 {
		return errors.New("no args")
	}
	var a struct {
		Type           string   `json:"type"`
		ClientGroupID  string   `json:"clientGroupID"`
		ClientID       string   `json:"clientID"`
		ClientIDs      []string `json:"clientIDs"`
		UpToMutationID *int64   `json:"upToMutationID"`
	}
	if err := json.Unmarshal(m.Args[0], &a); err != nil {
		return err
	}
	table := pgx.Identifier{d.shard}.Sanitize() + `.mutations`
	if a.Type == "bulk" {
		_, err := d.db.Exec(ctx, `DELETE FROM `+table+` WHERE "clientGroupID" = $1 AND "clientID" = ANY($2)`, a.ClientGroupID, a.ClientIDs)
		return err
	}
	if a.UpToMutationID == nil {
		return errors.New("cleanup without upToMutationID")
	}
	_, err := d.db.Exec(ctx, `DELETE FROM `+table+` WHERE "clientGroupID" = $1 AND "clientID" = $2 AND "mutationID" <= $3`,
		a.ClientGroupID, a.ClientID, *a.UpToMutationID)
	return err
}

// The demo's mutators: the server side of web/demo/src/mutators.ts. Times
// travel as epoch milliseconds, as the client's schema holds them.
type demoIssueArgs struct {
	ID       string   `json:"id"`
	Title    *string  `json:"title"`
	Open     *bool    `json:"open"`
	OwnerID  *string  `json:"owner_id"`
	Modified float64  `json:"modified"`
	Created  *float64 `json:"created"`
}

type demoCommentArgs struct {
	ID      string  `json:"id"`
	IssueID string  `json:"issue_id"`
	Body    string  `json:"body"`
	Created float64 `json:"created"`
}

func runDemoMutator(ctx context.Context, tx pgx.Tx, name string, raw json.RawMessage) error {
	exec := func(sql string, args ...any) error {
		tag, err := tx.Exec(ctx, sql, args...)
		if err == nil && tag.RowsAffected() == 0 && strings.HasPrefix(sql, "UPDATE") {
			return errors.New("no such issue")
		}
		return err
	}
	switch name {
	case "issue.create", "issue.update", "issue.setOpen":
		var a demoIssueArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return fmt.Errorf("%s: bad args: %w", name, err)
		}
		if a.ID == "" {
			return fmt.Errorf("%s: no id", name)
		}
		switch name {
		case "issue.create":
			if a.Title == nil || strings.TrimSpace(*a.Title) == "" {
				return errors.New("an issue needs a title")
			}
			created := a.Modified
			if a.Created != nil {
				created = *a.Created
			}
			return exec(`INSERT INTO issue (id, title, open, modified, owner_id, created)
				VALUES ($1, $2, true, $3, $4, to_timestamp($5 / 1000.0))`, a.ID, *a.Title, a.Modified, a.OwnerID, created)
		case "issue.update":
			if a.Title == nil || strings.TrimSpace(*a.Title) == "" {
				return errors.New("an issue needs a title")
			}
			return exec(`UPDATE issue SET title = $2, modified = $3 WHERE id = $1`, a.ID, *a.Title, a.Modified)
		default:
			if a.Open == nil {
				return errors.New("issue.setOpen: no open")
			}
			return exec(`UPDATE issue SET open = $2, modified = $3 WHERE id = $1`, a.ID, *a.Open, a.Modified)
		}
	case "comment.add":
		var a demoCommentArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return fmt.Errorf("%s: bad args: %w", name, err)
		}
		if a.ID == "" || a.IssueID == "" || strings.TrimSpace(a.Body) == "" {
			return errors.New("a comment needs an id, an issue and a body")
		}
		return exec(`INSERT INTO comment (id, issue_id, body, created) VALUES ($1, $2, $3, to_timestamp($4 / 1000.0))`,
			a.ID, a.IssueID, a.Body, a.Created)
	}
	return fmt.Errorf("unknown mutator %q", name)
}

// demoTimeout bounds one push: the client pushes again after a reconnect.
const demoTimeout = 30 * time.Second
