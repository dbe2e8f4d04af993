package streams

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The CVR stream holds every client group's Client View Record
// (docs/protocol.md §6.4) as events, one subject per group, so
// that any view-syncer can rebuild a group's CVR and catch its clients up.
// README.md, section "CVR stream", documents it.

// CVRMaxMessageBytes bounds an encoded CVR message. A larger update spans
// several messages, published as one atomic batch.
const CVRMaxMessageBytes = 512 << 10

// MaxGroupIDBytes bounds a client group ID, so that its escaped subject
// token and KV key stay far below NATS's limits.
const MaxGroupIDBytes = 256

// DefaultOwnersTTL is how long the owners bucket keeps a record nobody
// writes: it only cleans up after view-syncers that vanished, since a
// lease's own expiry is in its record.
const DefaultOwnersTTL = time.Hour

// ErrBadGroupID reports a client group ID that cannot be stored.
var ErrBadGroupID = errors.New("bad client group id")

// CheckGroupID reports whether id can name a client group.
func CheckGroupID(id string) error {
	if id == "" || len(id) > MaxGroupIDBytes {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrBadGroupID, len(id), MaxGroupIDBytes)
	}
	return nil
}

// CVRStream is the name of the CVR stream.
func (s Shard) CVRStream() string { return "JETSYNC_" + s.ID() + "_CVR" }

// CVRFilter matches every subject of the CVR stream.
func (s Shard) CVRFilter() string { return s.Prefix() + ".cvr.*" }

// CVRSubject is where a client group's CVR events go:
// jetsync.<app>_<num>.cvr.<group>, the group ID escaped by SubjectToken.
func (s Shard) CVRSubject(groupID string) string {
	return s.Prefix() + ".cvr." + SubjectToken(groupID)
}

// OwnersBucket is the KV bucket of client-group leases.
func (s Shard) OwnersBucket() string { return "jetsync_" + s.ID() + "_owners" }

// OwnerKey is a group's key in the owners bucket. KV keys allow fewer bytes
// than subject tokens ([-/_=.A-Za-z0-9]), so bytes outside [A-Za-z0-9_-]
// become =XX ("=" itself included, which keeps the escape reversible).
func OwnerKey(groupID string) string {
	if groupID == "" {
		return "="
	}
	var b []byte
	for i := 0; i < len(groupID); i++ {
		c := groupID[i]
		if tokenByte(c) {
			if b != nil {
				b = append(b, c)
			}
			continue
		}
		if b == nil {
			b = append(make([]byte, 0, len(groupID)+8), groupID[:i]...)
		}
		b = append(b, '=', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
	}
	if b == nil {
		return groupID
	}
	return string(b)
}

// CVRStreamConfig is the CVR stream's definition. It keeps every message
// of a subject: a group is rebuilt from its last snapshot plus everything
// after it, and compaction purges what lies before that snapshot. Config's
// MaxAge, meant for the change stream, does not apply: dropping old events
// would corrupt a group rather than shorten its history. Should an operator
// set byte limits, DiscardNew makes writes fail instead.
func (c Config) CVRStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              c.Shard.CVRStream(),
		Description:       "jetsync client view records for shard " + c.Shard.ID(),
		Subjects:          []string{c.Shard.CVRFilter()},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Discard:           jetstream.DiscardNew,
		MaxMsgsPerSubject: -1,
		Replicas:          max(c.Replicas, 1),
		MaxMsgSize:        CVRMaxMessageBytes + 64<<10,
		// An update larger than one message is one atomic batch, so the
		// stream never holds half of one.
		AllowAtomicPublish: true,
	}
}

// OwnersBucketConfig is the owners bucket's definition.
func (c Config) OwnersBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      c.Shard.OwnersBucket(),
		Description: "jetsync client-group leases for shard " + c.Shard.ID(),
		Storage:     jetstream.FileStorage,
		Replicas:    max(c.Replicas, 1),
		History:     1,
		TTL:         DefaultOwnersTTL,
	}
}

// EnsureCVR creates the CVR stream and the owners bucket, or brings
// existing ones to this definition.
func EnsureCVR(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Stream, jetstream.KeyValue, error) {
	if err := c.Shard.Validate(); err != nil {
		return nil, nil, err
	}
	c, err := c.WithReplicas(ctx, js)
	if err != nil {
		return nil, nil, err
	}
	s, err := js.CreateOrUpdateStream(ctx, c.CVRStreamConfig())
	if err != nil {
		return nil, nil, fmt.Errorf("ensure stream %s: %w", c.Shard.CVRStream(), err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, c.OwnersBucketConfig())
	if err != nil {
		return nil, nil, fmt.Errorf("ensure bucket %s: %w", c.Shard.OwnersBucket(), err)
	}
	if err := allowAtomic(ctx, js, "KV_"+c.Shard.OwnersBucket()); err != nil {
		return nil, nil, fmt.Errorf("ensure bucket %s: %w", c.Shard.OwnersBucket(), err)
	}
	return s, kv, nil
}

// allowAtomic lets the named stream take atomic batches: a view-syncer
// renews its leases in one. KeyValueConfig cannot say so, and updating the
// bucket clears it for a moment; a batch refused meanwhile is published
// one record at a time, so only the batching is lost.
func allowAtomic(ctx context.Context, js jetstream.JetStream, name string) error {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return err
	}
	cfg := s.CachedInfo().Config
	if cfg.AllowAtomicPublish {
		return nil
	}
	cfg.AllowAtomicPublish = true
	_, err = js.UpdateStream(ctx, cfg)
	return err
}

// CVRHeaderDeleted marks a garbage collector's tombstone: the group's
// history was purged and the message holds only a snapshot whose instance
// is Deleted. Readers that only list the stream (headers only) see it.
const CVRHeaderDeleted = "Jetsync-Cvr-Deleted"

// CVRGCLockKey is the owners bucket's key for the garbage-collection lock,
// a CVROwner record like a group's lease. OwnerKey never yields a '.', so
// it names no group.
const CVRGCLockKey = "gc.lock"

// CVROwner is a lease record in the owners bucket: which view-syncer owns a
// group, where peers reach it, and until when.
type CVROwner struct {
	ID string `json:"id"`
	// Address is where a peer forwards the group's connections.
	Address string `json:"address,omitempty"`
	// ExpiresMs is when the lease lapses unless renewed, in Unix ms of the
	// owner's clock.
	ExpiresMs int64 `json:"expiresMs"`
	// GrantedMs is when this owner first acquired the lease.
	GrantedMs int64 `json:"grantedMs,omitempty"`
	// Sig is the owner's HMAC-SHA256 over the record and its key, with the
	// deployment's peer secret (base64url, unpadded): a peer relays
	// connections to Address only if it checks.
	Sig string `json:"sig,omitempty"`
}

// CVROp names a CVR event.
type CVROp string

// CVR events. put-* events carry the whole record and replace it; del-*
// events remove a record outright (a client-visible deletion is a put with
// its del state, so that catch-up can report it).
const (
	// CVROpSnapshot opens a snapshot: the update it starts holds the whole
	// CVR, so everything before it is replaced.
	CVROpSnapshot     CVROp = "snapshot"
	CVROpInstance     CVROp = "instance"
	CVROpClientSchema CVROp = "client-schema"
	CVROpPutClient    CVROp = "put-client"
	CVROpDelClient    CVROp = "del-client"
	CVROpPutQuery     CVROp = "put-query"
	// CVROpGot changes only a query's got state, leaving its identity.
	CVROpGot       CVROp = "got"
	CVROpDelQuery  CVROp = "del-query"
	CVROpPutDesire CVROp = "put-desire"
	CVROpDelDesire CVROp = "del-desire"
	CVROpPutRow    CVROp = "put-row"
	CVROpDelRow    CVROp = "del-row"
	// CVROpPutRows is put-row for many rows that share their table, patch
	// version and refs, as a hydration's rows do: a fraction of the bytes.
	CVROpPutRows CVROp = "put-rows"
)

// CVRMessage is one message on a group's subject: a CVR update, or one
// part of a large one.
type CVRMessage struct {
	Group string `json:"group"`
	// Owner is the writer's lease ID.
	Owner string `json:"owner,omitempty"`
	// Version is the CVR version after the update.
	Version string `json:"version"`
	// Prev is the stream sequence of the group's message before this
	// update (0 for the first), as the writer expected it. A reader whose
	// last applied sequence differs has missed messages.
	Prev uint64 `json:"prev"`
	// Part numbers the update's messages from 0; Last marks its final one.
	Part   int        `json:"part"`
	Last   bool       `json:"last"`
	Events []CVREvent `json:"events"`
}

// CVREvent is one change to a CVR. Exactly the field its Op names is set.
type CVREvent struct {
	Op           CVROp           `json:"op"`
	Snapshot     *CVRSnapshot    `json:"snapshot,omitempty"`
	Instance     *CVRInstance    `json:"instance,omitempty"`
	ClientSchema json.RawMessage `json:"clientSchema,omitempty"`
	Client       *CVRClient      `json:"client,omitempty"`
	Query        *CVRQuery       `json:"query,omitempty"`
	Got          *CVRGot         `json:"got,omitempty"`
	Desire       *CVRDesire      `json:"desire,omitempty"`
	Row          *CVRRow         `json:"row,omitempty"`
	Rows         *CVRRows        `json:"rows,omitempty"`
}

// CVRSnapshot opens a snapshot at a CVR version.
type CVRSnapshot struct {
	Version string `json:"version"`
}

// CVRInstance is the group's own record (zero-cache's CVR instance row).
type CVRInstance struct {
	Version        string `json:"version"`
	ReplicaVersion string `json:"replicaVersion,omitempty"`
	// TTLClockMs is the group's TTL clock (docs/protocol.md §12).
	TTLClockMs   float64 `json:"ttlClockMs"`
	LastActiveMs int64   `json:"lastActiveMs"`
	Owner        string  `json:"owner,omitempty"`
	GrantedAtMs  int64   `json:"grantedAtMs,omitempty"`
	ProfileID    string  `json:"profileID,omitempty"`
	UserID       string  `json:"userID,omitempty"`
	// Deleted tombstones a group purged by garbage collection.
	Deleted bool `json:"deleted,omitempty"`
}

// CVRClient is a client of the group; del-client carries only ID.
type CVRClient struct {
	ID string `json:"id"`
	// Deleted clients keep their inactive desires until the TTLs run out.
	Deleted bool `json:"deleted,omitempty"`
}

// CVRQuery is a query the group knows; del-query carries only Hash.
// PatchVersion is when Got last changed, "" while the query was never got.
type CVRQuery struct {
	Hash string `json:"hash"`
	// AST is a legacy or internal query's AST; Name and Args name a
	// custom query.
	AST                   json.RawMessage `json:"ast,omitempty"`
	Name                  string          `json:"name,omitempty"`
	Args                  json.RawMessage `json:"args,omitempty"`
	TransformationHash    string          `json:"transformationHash,omitempty"`
	TransformationVersion string          `json:"transformationVersion,omitempty"`
	Internal              bool            `json:"internal,omitempty"`
	Got                   bool            `json:"got,omitempty"`
	PatchVersion          string          `json:"patchVersion,omitempty"`
}

// CVRGot sets a query's got state.
type CVRGot struct {
	Hash         string `json:"hash"`
	Got          bool   `json:"got"`
	PatchVersion string `json:"patchVersion,omitempty"`
}

// CVRDesire is one client's wish for one query; del-desire carries only
// ClientID and Hash. InactivatedAtMs, on the group's TTL clock, is nil while
// the client wants the query (a desired put) and set once it does not (a
// del).
type CVRDesire struct {
	ClientID        string   `json:"clientID"`
	Hash            string   `json:"hash"`
	TTLMs           int64    `json:"ttlMs,omitempty"`
	InactivatedAtMs *float64 `json:"inactivatedAtMs,omitempty"`
	// Cleared desires expire at once.
	Cleared      bool   `json:"cleared,omitempty"`
	PatchVersion string `json:"patchVersion,omitempty"`
}

// CVRRow is a row the group's clients have or had: its identity, version
// and references, never its contents (catch-up reads those from the
// replica). del-row carries only Table and Key.
type CVRRow struct {
	Table string `json:"table"`
	// Key is the row's primary key as a JSON object; writers must encode
	// it canonically (CVRRowKey), since it is the row's identity.
	Key          json.RawMessage `json:"key"`
	RowVersion   string          `json:"rowVersion,omitempty"`
	PatchVersion string          `json:"patchVersion,omitempty"`
	// Refs counts, per got query, its references to the row; nil is a
	// tombstone (encoded as null): the row was deleted from the clients at
	// PatchVersion.
	Refs map[string]int `json:"refs"`
}

// CVRRows is the put-row of each key with the rowVersion at the same index,
// and Table, PatchVersion and Refs as given.
type CVRRows struct {
	Table        string            `json:"table"`
	PatchVersion string            `json:"patchVersion,omitempty"`
	Refs         map[string]int    `json:"refs"`
	Keys         []json.RawMessage `json:"keys"`
	RowVersions  []string          `json:"rowVersions"`
}

// CVRRowEvents builds the events of many put-rows, joining consecutive rows
// that share their table, patch version and refs into put-rows events of at
// most about 64 KiB of keys and versions. The zero value is ready to use.
type CVRRowEvents struct {
	events []CVREvent
	run    *CVRRows
	bytes  int
}

// maxPutRowsBytes bounds the keys and versions of one put-rows event, far
// inside a CVR message.
const maxPutRowsBytes = 64 << 10

// Add appends the put-row of r. Its Refs map is kept, not copied.
func (b *CVRRowEvents) Add(r CVRRow) {
	n := len(r.Key) + len(r.RowVersion) + 4
	if run := b.run; run != nil && run.Table == r.Table && run.PatchVersion == r.PatchVersion &&
		(run.Refs == nil) == (r.Refs == nil) && maps.Equal(run.Refs, r.Refs) && b.bytes+n <= maxPutRowsBytes {
		run.Keys = append(run.Keys, r.Key)
		run.RowVersions = append(run.RowVersions, r.RowVersion)
		b.bytes += n
		return
	}
	b.run = &CVRRows{Table: r.Table, PatchVersion: r.PatchVersion, Refs: r.Refs,
		Keys: []json.RawMessage{r.Key}, RowVersions: []string{r.RowVersion}}
	b.bytes = n
	b.events = append(b.events, CVREvent{Op: CVROpPutRows, Rows: b.run})
}

// Events returns the events added, a row alone in its run as a put-row.
func (b *CVRRowEvents) Events() []CVREvent {
	for i := range b.events {
		if r := b.events[i].Rows; len(r.Keys) == 1 {
			b.events[i] = CVREvent{Op: CVROpPutRow, Row: &CVRRow{
				Table: r.Table, Key: r.Keys[0], RowVersion: r.RowVersions[0], PatchVersion: r.PatchVersion, Refs: r.Refs,
			}}
		}
	}
	evs := b.events
	*b = CVRRowEvents{}
	return evs
}

// CVRRowKey encodes a primary key canonically: a JSON object, keys sorted.
func CVRRowKey(key map[string]any) (json.RawMessage, error) {
	b, err := json.Marshal(key)
	if err != nil {
		return nil, fmt.Errorf("row key: %w", err)
	}
	return b, nil
}

// EncodeCVR encodes one CVR message.
func EncodeCVR(m *CVRMessage) ([]byte, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode cvr message: %w", err)
	}
	return b, nil
}

// EncodeCVRUpdate encodes an update as messages of at most maxBytes each
// (CVRMaxMessageBytes when 0), setting Part and Last. An update always
// yields at least one message, so that even an empty one records its
// version. One event larger than the limit is an error.
func EncodeCVRUpdate(hdr CVRMessage, events []CVREvent, maxBytes int) ([][]byte, error) {
	if maxBytes <= 0 {
		maxBytes = CVRMaxMessageBytes
	}
	hdr.Events = events
	if err := hdr.validate(); err != nil {
		return nil, err
	}
	enc := make([]json.RawMessage, len(events))
	for i := range events {
		b, err := json.Marshal(&events[i])
		if err != nil {
			return nil, fmt.Errorf("encode cvr event %d (%s): %w", i, events[i].Op, err)
		}
		enc[i] = b
	}
	var out [][]byte
	part := func(evs []json.RawMessage, last bool) ([]byte, error) {
		h := hdr
		h.Events, h.Part, h.Last = nil, len(out), last
		b, err := json.Marshal(cvrHeader{h.Group, h.Owner, h.Version, h.Prev, h.Part, h.Last})
		if err != nil {
			return nil, fmt.Errorf("encode cvr message: %w", err)
		}
		b = append(b[:len(b)-1], `,"events":[`...)
		for i, e := range evs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, e...)
		}
		return append(b, "]}"...), nil
	}
	// The header's size with the largest part number this update can
	// reach stands in for every part's header.
	base, err := part(nil, false)
	if err != nil {
		return nil, err
	}
	overhead := len(base) + len(strconv.Itoa(len(events)))
	start, size := 0, overhead
	for i, e := range enc {
		if overhead+len(e) > maxBytes {
			return nil, fmt.Errorf("%w: cvr event %d (%s) is %d bytes, over %d", ErrMalformed, i, events[i].Op, len(e), maxBytes)
		}
		if i > start && size+1+len(e) > maxBytes {
			b, err := part(enc[start:i], false)
			if err != nil {
				return nil, err
			}
			out = append(out, b)
			start, size = i, overhead
		}
		size += 1 + len(e)
	}
	b, err := part(enc[start:], true)
	if err != nil {
		return nil, err
	}
	return append(out, b), nil
}

type cvrHeader struct {
	Group   string `json:"group"`
	Owner   string `json:"owner,omitempty"`
	Version string `json:"version"`
	Prev    uint64 `json:"prev"`
	Part    int    `json:"part"`
	Last    bool   `json:"last"`
}

// DecodeCVR decodes and checks one CVR message.
func DecodeCVR(b []byte) (*CVRMessage, error) {
	var m CVRMessage
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: cvr message: %v", ErrMalformed, err)
	}
	if d.More() {
		return nil, fmt.Errorf("%w: cvr message: trailing data", ErrMalformed)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

func (m *CVRMessage) validate() error {
	if err := CheckGroupID(m.Group); err != nil {
		return fmt.Errorf("%w: cvr message: %v", ErrMalformed, err)
	}
	if m.Part < 0 {
		return fmt.Errorf("%w: cvr message: part %d", ErrMalformed, m.Part)
	}
	for i := range m.Events {
		if err := m.Events[i].Validate(); err != nil {
			return fmt.Errorf("%w: cvr event %d: %v", ErrMalformed, i, err)
		}
		if m.Events[i].Op == CVROpSnapshot && (i > 0 || m.Part > 0) {
			return fmt.Errorf("%w: cvr event %d: snapshot must open an update", ErrMalformed, i)
		}
	}
	return nil
}

// Validate reports an event that the contract refuses: an unknown op, or
// fields missing or extra for its op.
func (e *CVREvent) Validate() error {
	n := 0
	for _, set := range []bool{e.Snapshot != nil, e.Instance != nil, e.ClientSchema != nil, e.Client != nil,
		e.Query != nil, e.Got != nil, e.Desire != nil, e.Row != nil, e.Rows != nil} {
		if set {
			n++
		}
	}
	var ok bool
	switch e.Op {
	case CVROpSnapshot:
		ok = e.Snapshot != nil
	case CVROpInstance:
		ok = e.Instance != nil
	case CVROpClientSchema:
		ok = e.ClientSchema != nil && json.Valid(e.ClientSchema)
	case CVROpPutClient, CVROpDelClient:
		ok = e.Client != nil && e.Client.ID != ""
	case CVROpPutQuery, CVROpDelQuery:
		ok = e.Query != nil && e.Query.Hash != ""
	case CVROpGot:
		ok = e.Got != nil && e.Got.Hash != ""
	case CVROpPutDesire, CVROpDelDesire:
		ok = e.Desire != nil && e.Desire.ClientID != "" && e.Desire.Hash != ""
	case CVROpPutRow, CVROpDelRow:
		ok = e.Row != nil && e.Row.Table != "" && isJSONObject(e.Row.Key)
	case CVROpPutRows:
		r := e.Rows
		ok = r != nil && r.Table != "" && len(r.Keys) > 0 && len(r.Keys) == len(r.RowVersions)
		for i := 0; ok && i < len(r.Keys); i++ {
			ok = isJSONObject(r.Keys[i])
		}
	default:
		return fmt.Errorf("unknown op %q", e.Op)
	}
	if !ok || n != 1 {
		return fmt.Errorf("op %q: missing or extra fields", e.Op)
	}
	return nil
}

func isJSONObject(b json.RawMessage) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}
