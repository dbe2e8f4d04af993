package streams

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/nats-config/natstest"
)

func TestShard_CVRNames(t *testing.T) {
	s := Shard{App: "zero", Num: 0}
	for got, want := range map[string]string{
		s.CVRStream():                    "JETSYNC_zero_0_CVR",
		s.CVRFilter():                    "jetsync.zero_0.cvr.*",
		s.CVRSubject("cg1"):              "jetsync.zero_0.cvr.cg1",
		s.CVRSubject("a.b*>c d%"):        "jetsync.zero_0.cvr.a%2Eb%2A%3Ec%20d%25",
		s.CVRSubject(""):                 "jetsync.zero_0.cvr.%",
		s.OwnersBucket():                 "jetsync_zero_0_owners",
		OwnerKey("cg1"):                  "cg1",
		OwnerKey("a.b*>c d=%"):           "a=2Eb=2A=3Ec=20d=3D=25",
		OwnerKey(""):                     "=",
		OwnerKey("\xff-_Zz09"):           "=FF-_Zz09",
		OwnerKey(strings.Repeat("/", 2)): "=2F=2F",
	} {
		if got != want {
			t.Errorf("got %q; want %q", got, want)
		}
	}
	if err := CheckGroupID(strings.Repeat("x", MaxGroupIDBytes+1)); !errors.Is(err, ErrBadGroupID) {
		t.Errorf("CheckGroupID(long) = %v; want ErrBadGroupID", err)
	}
}

func ptr[T any](v T) *T { return &v }

// cvrEvents has one event of every op.
func cvrEvents() []CVREvent {
	return []CVREvent{
		{Op: CVROpSnapshot, Snapshot: &CVRSnapshot{Version: "4gc4w8:01"}},
		{Op: CVROpInstance, Instance: &CVRInstance{Version: "4gc4w8:01", ReplicaVersion: "4gc000", TTLClockMs: 1234.5,
			LastActiveMs: 1764504000123, Owner: "vs1", GrantedAtMs: 1764504000000, ProfileID: "pA1", UserID: "u1"}},
		{Op: CVROpInstance, Instance: &CVRInstance{Version: "00", Deleted: true}},
		{Op: CVROpClientSchema, ClientSchema: json.RawMessage(`{"tables":{"issue":{"columns":{"id":{"type":"string"}},"primaryKey":["id"]}}}`)},
		{Op: CVROpPutClient, Client: &CVRClient{ID: "c1"}},
		{Op: CVROpPutClient, Client: &CVRClient{ID: "c2", Deleted: true}},
		{Op: CVROpDelClient, Client: &CVRClient{ID: "c3"}},
		{Op: CVROpPutQuery, Query: &CVRQuery{Hash: "h1", AST: json.RawMessage(`{"table":"issue"}`), TransformationHash: "t1",
			TransformationVersion: "4gc4w8", Got: true, PatchVersion: "4gc4w8"}},
		{Op: CVROpPutQuery, Query: &CVRQuery{Hash: "h2", Name: "issuesByStatus", Args: json.RawMessage(`["open"]`)}},
		{Op: CVROpPutQuery, Query: &CVRQuery{Hash: "lmids", AST: json.RawMessage(`{"table":"zero_0.clients"}`), Internal: true}},
		{Op: CVROpGot, Got: &CVRGot{Hash: "h1", Got: false, PatchVersion: "4gc54g:02"}},
		{Op: CVROpDelQuery, Query: &CVRQuery{Hash: "h3"}},
		{Op: CVROpPutDesire, Desire: &CVRDesire{ClientID: "c1", Hash: "h1", TTLMs: 300000, PatchVersion: "00:01"}},
		{Op: CVROpPutDesire, Desire: &CVRDesire{ClientID: "c1", Hash: "h2", TTLMs: 300000, InactivatedAtMs: ptr(99.25), Cleared: true, PatchVersion: "00:02"}},
		{Op: CVROpDelDesire, Desire: &CVRDesire{ClientID: "c1", Hash: "h3"}},
		{Op: CVROpPutRow, Row: &CVRRow{Table: "issue", Key: json.RawMessage(`{"id":"i1"}`), RowVersion: "4gc4w8", PatchVersion: "4gc4w8",
			Refs: map[string]int{"h1": 1, "h2": 2}}},
		{Op: CVROpPutRow, Row: &CVRRow{Table: "issue", Key: json.RawMessage(`{"id":"i2"}`), RowVersion: "4gc4w8", PatchVersion: "4gc54g"}},
		{Op: CVROpPutRow, Row: &CVRRow{Table: "issue", Key: json.RawMessage(`{"id":"i4"}`), Refs: map[string]int{}}},
		{Op: CVROpDelRow, Row: &CVRRow{Table: "issue", Key: json.RawMessage(`{"a":1,"b":"x"}`)}},
		{Op: CVROpPutRows, Rows: &CVRRows{Table: "issue", PatchVersion: "4gc54g", Refs: map[string]int{"h1": 1},
			Keys: []json.RawMessage{json.RawMessage(`{"id":"i5"}`), json.RawMessage(`{"id":"i6"}`)}, RowVersions: []string{"4gc4w8", "4gc54g"}}},
		{Op: CVROpPutRows, Rows: &CVRRows{Table: "issue", PatchVersion: "4gc54g",
			Keys: []json.RawMessage{json.RawMessage(`{"id":"i7"}`)}, RowVersions: []string{""}}},
	}
}

func TestCVR_RoundTrip(t *testing.T) {
	for _, ev := range cvrEvents() {
		t.Run(string(ev.Op), func(t *testing.T) {
			in := &CVRMessage{Group: "cg 1", Owner: "vs1", Version: "4gc4w8", Prev: 7, Part: 0, Last: true, Events: []CVREvent{ev}}
			b, err := EncodeCVR(in)
			if err != nil {
				t.Fatalf("EncodeCVR: %v", err)
			}
			out, err := DecodeCVR(b)
			if err != nil {
				t.Fatalf("DecodeCVR(%s): %v", b, err)
			}
			if d := cmp.Diff(in, out); d != "" {
				t.Errorf("round trip (-in +out):\n%s", d)
			}
		})
	}
}

func TestEncodeCVRUpdate(t *testing.T) {
	var evs []CVREvent
	for range 50 {
		evs = append(evs, cvrEvents()[1:]...)
	}
	hdr := CVRMessage{Group: "cg1", Owner: "vs1", Version: "4gc54g", Prev: 3}
	for _, max := range []int{0, 2048, 700} {
		msgs, err := EncodeCVRUpdate(hdr, evs, max)
		if err != nil {
			t.Fatalf("EncodeCVRUpdate(max %d): %v", max, err)
		}
		if max > 0 && len(msgs) < 2 {
			t.Errorf("max %d: %d messages; want several", max, len(msgs))
		}
		var got []CVREvent
		for i, b := range msgs {
			if max > 0 && len(b) > max {
				t.Errorf("max %d: message %d is %d bytes", max, i, len(b))
			}
			m, err := DecodeCVR(b)
			if err != nil {
				t.Fatalf("DecodeCVR: %v", err)
			}
			if m.Part != i || m.Last != (i == len(msgs)-1) || m.Prev != 3 || m.Version != "4gc54g" || m.Group != "cg1" {
				t.Errorf("message %d header = %+v", i, m)
			}
			got = append(got, m.Events...)
		}
		if d := cmp.Diff(evs, got); d != "" {
			t.Errorf("max %d: events (-want +got):\n%s", max, d)
		}
	}
	if msgs, err := EncodeCVRUpdate(hdr, nil, 0); err != nil || len(msgs) != 1 {
		t.Errorf("empty update = %d messages, %v; want 1", len(msgs), err)
	}
	big := CVREvent{Op: CVROpClientSchema, ClientSchema: json.RawMessage(`"` + strings.Repeat("x", 1000) + `"`)}
	if _, err := EncodeCVRUpdate(hdr, []CVREvent{big}, 700); !errors.Is(err, ErrMalformed) {
		t.Errorf("oversized event: %v; want ErrMalformed", err)
	}
}

func TestDecodeCVR_Rejects(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"Empty", ``},
		{"NoGroup", `{"version":"00","events":[]}`},
		{"UnknownOp", `{"group":"g","events":[{"op":"nope"}]}`},
		{"MissingPayload", `{"group":"g","events":[{"op":"put-row"}]}`},
		{"ExtraPayload", `{"group":"g","events":[{"op":"put-client","client":{"id":"c"},"query":{"hash":"h"}}]}`},
		{"KeyNotObject", `{"group":"g","events":[{"op":"put-row","row":{"table":"t","key":[1]}}]}`},
		{"RowsKeyNotObject", `{"group":"g","events":[{"op":"put-rows","rows":{"table":"t","keys":[{"id":1},2],"rowVersions":["a","b"]}}]}`},
		{"RowsUneven", `{"group":"g","events":[{"op":"put-rows","rows":{"table":"t","keys":[{"id":1}],"rowVersions":["a","b"]}}]}`},
		{"RowsEmpty", `{"group":"g","events":[{"op":"put-rows","rows":{"table":"t","keys":[],"rowVersions":[]}}]}`},
		{"RowsNoTable", `{"group":"g","events":[{"op":"put-rows","rows":{"keys":[{"id":1}],"rowVersions":["a"]}}]}`},
		{"LateSnapshot", `{"group":"g","events":[{"op":"put-client","client":{"id":"c"}},{"op":"snapshot","snapshot":{}}]}`},
		{"Trailing", `{"group":"g","events":[]} {}`},
		{"NegativePart", `{"group":"g","part":-1,"events":[]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeCVR([]byte(tc.in)); !errors.Is(err, ErrMalformed) {
				t.Errorf("DecodeCVR(%s) = %v; want ErrMalformed", tc.in, err)
			}
		})
	}
}

func FuzzDecodeCVR(f *testing.F) {
	for _, ev := range cvrEvents() {
		b, err := EncodeCVR(&CVRMessage{Group: "cg1", Version: "01", Events: []CVREvent{ev}})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeCVR(b)
		if err != nil {
			return
		}
		enc, err := EncodeCVR(m)
		if err != nil {
			t.Fatalf("EncodeCVR of a decoded message: %v", err)
		}
		m2, err := DecodeCVR(enc)
		if err != nil {
			t.Fatalf("DecodeCVR(%s) of an encoded message: %v", enc, err)
		}
		enc2, err := EncodeCVR(m2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Errorf("not a fixed point:\n%s\n%s", enc, enc2)
		}
	})
}

func TestEnsureCVR(t *testing.T) {
	ns := natstest.Start(t)
	_, js := natstest.Connect(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := Config{Shard: Shard{App: "zero"}}
	s, kv, err := EnsureCVR(ctx, js, cfg)
	if err != nil {
		t.Fatalf("EnsureCVR: %v", err)
	}
	// A second call finds them as they are.
	if _, _, err := EnsureCVR(ctx, js, cfg); err != nil {
		t.Fatalf("EnsureCVR again: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Config.AllowAtomicPublish || info.Config.MaxMsgsPerSubject != -1 || info.Config.Discard != jetstream.DiscardNew {
		t.Errorf("stream config = %+v", info.Config)
	}
	if kv.Bucket() != "jetsync_zero_0_owners" {
		t.Errorf("bucket = %q", kv.Bucket())
	}
	// The owners bucket takes atomic batches, even one that was made
	// without them.
	kvInfo := func() jetstream.StreamConfig {
		ks, err := js.Stream(ctx, "KV_"+kv.Bucket())
		if err != nil {
			t.Fatal(err)
		}
		return ks.CachedInfo().Config
	}
	if !kvInfo().AllowAtomicPublish {
		t.Error("owners bucket refuses atomic batches")
	}
	old := kvInfo()
	old.AllowAtomicPublish = false
	if _, err := js.UpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, _, err := EnsureCVR(ctx, js, cfg); err != nil {
		t.Fatalf("EnsureCVR on the old bucket: %v", err)
	}
	if !kvInfo().AllowAtomicPublish {
		t.Error("an existing owners bucket still refuses atomic batches")
	}
	if _, err := kv.Create(ctx, OwnerKey("a.b c"), []byte(`{}`)); err != nil {
		t.Errorf("create escaped key: %v", err)
	}
	if _, err := js.Publish(ctx, cfg.Shard.CVRSubject("a.b c"), []byte(`{}`)); err != nil {
		t.Errorf("publish on escaped subject: %v", err)
	}
}

func TestCVRRowEvents(t *testing.T) {
	key := func(i int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"id":"i%d"}`, i)) }
	refs := map[string]int{"h": 1}
	var b CVRRowEvents
	b.Add(CVRRow{Table: "issue", Key: key(1), RowVersion: "a", PatchVersion: "p", Refs: refs})
	b.Add(CVRRow{Table: "issue", Key: key(2), RowVersion: "b", PatchVersion: "p", Refs: map[string]int{"h": 1}})
	b.Add(CVRRow{Table: "issue", Key: key(3), RowVersion: "c", PatchVersion: "p"}) // a tombstone
	b.Add(CVRRow{Table: "comment", Key: key(4), RowVersion: "d", PatchVersion: "p", Refs: refs})
	b.Add(CVRRow{Table: "comment", Key: key(5), RowVersion: "e", PatchVersion: "q", Refs: refs})
	b.Add(CVRRow{Table: "comment", Key: key(6), RowVersion: "f", PatchVersion: "q", Refs: refs})
	want := []CVREvent{
		{Op: CVROpPutRows, Rows: &CVRRows{Table: "issue", PatchVersion: "p", Refs: refs,
			Keys: []json.RawMessage{key(1), key(2)}, RowVersions: []string{"a", "b"}}},
		{Op: CVROpPutRow, Row: &CVRRow{Table: "issue", Key: key(3), RowVersion: "c", PatchVersion: "p"}},
		{Op: CVROpPutRow, Row: &CVRRow{Table: "comment", Key: key(4), RowVersion: "d", PatchVersion: "p", Refs: refs}},
		{Op: CVROpPutRows, Rows: &CVRRows{Table: "comment", PatchVersion: "q", Refs: refs,
			Keys: []json.RawMessage{key(5), key(6)}, RowVersions: []string{"e", "f"}}},
	}
	if d := cmp.Diff(want, b.Events()); d != "" {
		t.Errorf("events (-want +got):\n%s", d)
	}
	if evs := b.Events(); len(evs) != 0 {
		t.Errorf("Events again = %d events; want none (it resets)", len(evs))
	}

	// Runs are cut to keep each event far inside a message.
	big := json.RawMessage(`{"id":"` + strings.Repeat("x", 4000) + `"}`)
	for range 100 {
		b.Add(CVRRow{Table: "t", Key: big, RowVersion: "v", Refs: refs})
	}
	evs := b.Events()
	if len(evs) < 2 {
		t.Fatalf("100 rows of 4 kB keys in %d event(s); want them cut", len(evs))
	}
	msgs, err := EncodeCVRUpdate(CVRMessage{Group: "g", Version: "01"}, evs, 0)
	if err != nil {
		t.Fatalf("EncodeCVRUpdate: %v", err)
	}
	n := 0
	for _, m := range msgs {
		dec, err := DecodeCVR(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range dec.Events {
			n += len(e.Rows.Keys)
		}
	}
	if n != 100 {
		t.Errorf("%d rows after a round trip; want 100", n)
	}
}
