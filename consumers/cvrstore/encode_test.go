package cvrstore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/jetsync/jetsync/streams"
)

// TestEncodeUpdate checks that encodeUpdate writes what the contract
// writes, and returns what a reader decodes from it.
func TestEncodeUpdate(t *testing.T) {
	at := 12.5
	rows := func(n int, key func(i int) string, refs map[string]int) []streams.CVREvent {
		var evs []streams.CVREvent
		for i := range n {
			evs = append(evs, streams.CVREvent{Op: streams.CVROpPutRow, Row: &streams.CVRRow{
				Table: "issue", Key: json.RawMessage(key(i)), RowVersion: fmt.Sprintf("v%03d", i%7), PatchVersion: "0a:01", Refs: refs,
			}})
		}
		return evs
	}
	plainKey := func(i int) string { return fmt.Sprintf(`{"id":"i%07d"}`, i) }
	shared := func(n int, key func(i int) string, refs map[string]int, patch string) streams.CVREvent {
		r := &streams.CVRRows{Table: "issue", PatchVersion: patch, Refs: refs}
		for i := range n {
			r.Keys = append(r.Keys, json.RawMessage(key(i)))
			r.RowVersions = append(r.RowVersions, fmt.Sprintf("v%03d", i%7))
		}
		return streams.CVREvent{Op: streams.CVROpPutRows, Rows: r}
	}
	config := []streams.CVREvent{
		{Op: streams.CVROpInstance, Instance: &streams.CVRInstance{Version: "0a:01", TTLClockMs: 1.25, LastActiveMs: 99}},
		{Op: streams.CVROpClientSchema, ClientSchema: json.RawMessage(`{"tables": {"a<b": {}}}`)},
		{Op: streams.CVROpPutClient, Client: &streams.CVRClient{ID: "c\xff1"}},
		{Op: streams.CVROpPutDesire, Desire: &streams.CVRDesire{ClientID: "c", Hash: "h", TTLMs: 5, InactivatedAtMs: &at}},
		{Op: streams.CVROpPutQuery, Query: &streams.CVRQuery{Hash: "h", AST: json.RawMessage(`{"table":"issue"}`), Got: true}},
	}
	tests := []struct {
		name   string
		hdr    streams.CVRMessage
		events []streams.CVREvent
		max    int
	}{
		{"Empty", streams.CVRMessage{Group: "g", Version: "01"}, nil, 0},
		{"Config", streams.CVRMessage{Group: "g", Owner: "o", Version: "01", Prev: 7}, config, 0},
		{"Rows", streams.CVRMessage{Group: "g", Version: "01", Prev: 3}, rows(50, plainKey, map[string]int{"b": 1, "a": 2}), 0},
		{"Split", streams.CVRMessage{Group: "g", Owner: "o", Version: "01", Prev: 3},
			append(append([]streams.CVREvent{{Op: streams.CVROpSnapshot, Snapshot: &streams.CVRSnapshot{Version: "01"}}}, config...),
				rows(300, plainKey, map[string]int{"q1": 1})...), 2000},
		{"Tombstones", streams.CVRMessage{Group: "g", Version: "01"}, rows(20, plainKey, nil), 500},
		{"EmptyRefs", streams.CVRMessage{Group: "g", Version: "01"}, rows(3, plainKey, map[string]int{}), 0},
		{"EscapedKeys", streams.CVRMessage{Group: "g", Version: "01"},
			rows(30, func(i int) string { return fmt.Sprintf(`{"id":"a<%d> &é \"x\"","n":%d}`, i, i) }, map[string]int{"h<": 1}), 700},
		{"SpacedKey", streams.CVRMessage{Group: "g", Version: "01"}, rows(2, func(int) string { return `{ "id" : "x" }` }, nil), 0},
		{"SharedRows", streams.CVRMessage{Group: "g", Version: "01"}, []streams.CVREvent{
			shared(40, plainKey, map[string]int{"q1": 1}, "0a:01"), shared(3, plainKey, nil, ""),
			shared(5, plainKey, map[string]int{}, "0a:01")}, 1500},
		{"SharedRowsEscaped", streams.CVRMessage{Group: "g", Version: "01"}, []streams.CVREvent{
			shared(4, func(i int) string { return fmt.Sprintf(`{ "id" : "a<%d>" }`, i) }, map[string]int{"h": 1}, "0a:01")}, 0},
		{"OddGroup", streams.CVRMessage{Group: "g\xfe<1>", Owner: "ö", Version: "01"}, rows(5, plainKey, map[string]int{"a": 1}), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := streams.EncodeCVRUpdate(tt.hdr, tt.events, tt.max)
			if err != nil {
				t.Fatal(err)
			}
			got, msgs, err := encodeUpdate(tt.hdr, tt.events, tt.max)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%d messages; want %d", len(got), len(want))
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Fatalf("message %d:\n got %s\nwant %s", i, got[i], want[i])
				}
				dec, err := streams.DecodeCVR(want[i])
				if err != nil {
					t.Fatal(err)
				}
				if len(dec.Events) == 0 {
					dec.Events = nil
				}
				if diff := cmp.Diff(dec, msgs[i]); diff != "" {
					t.Errorf("message %d as applied (-decoded +applied):\n%s", i, diff)
				}
			}
		})
	}
}

// TestEncodeUpdate_Invalid checks that encodeUpdate refuses what the
// contract refuses.
func TestEncodeUpdate_Invalid(t *testing.T) {
	row := &streams.CVRRow{Table: "t", Key: json.RawMessage(`{"id":"x"}`)}
	tests := []struct {
		name   string
		hdr    streams.CVRMessage
		events []streams.CVREvent
	}{
		{"NoGroup", streams.CVRMessage{}, nil},
		{"NoTable", streams.CVRMessage{Group: "g"}, []streams.CVREvent{{Op: streams.CVROpPutRow, Row: &streams.CVRRow{Key: row.Key}}}},
		{"KeyNotObject", streams.CVRMessage{Group: "g"}, []streams.CVREvent{{Op: streams.CVROpPutRow, Row: &streams.CVRRow{Table: "t", Key: json.RawMessage(`"x"`)}}}},
		{"ExtraField", streams.CVRMessage{Group: "g"}, []streams.CVREvent{{Op: streams.CVROpPutRow, Row: row, Client: &streams.CVRClient{ID: "c"}}}},
		{"LateSnapshot", streams.CVRMessage{Group: "g"}, []streams.CVREvent{{Op: streams.CVROpPutRow, Row: row},
			{Op: streams.CVROpSnapshot, Snapshot: &streams.CVRSnapshot{}}}},
		{"RowsUneven", streams.CVRMessage{Group: "g"}, []streams.CVREvent{{Op: streams.CVROpPutRows, Rows: &streams.CVRRows{Table: "t",
			Keys: []json.RawMessage{row.Key}, RowVersions: []string{"a", "b"}}}}},
		{"RowsKeyNotObject", streams.CVRMessage{Group: "g"}, []streams.CVREvent{{Op: streams.CVROpPutRows, Rows: &streams.CVRRows{Table: "t",
			Keys: []json.RawMessage{row.Key, json.RawMessage(`1`)}, RowVersions: []string{"a", "b"}}}}},
		{"RowsAndRow", streams.CVRMessage{Group: "g"}, []streams.CVREvent{{Op: streams.CVROpPutRows, Row: row, Rows: &streams.CVRRows{Table: "t",
			Keys: []json.RawMessage{row.Key}, RowVersions: []string{"a"}}}}},
		{"TooBig", streams.CVRMessage{Group: "g"}, []streams.CVREvent{{Op: streams.CVROpPutRow, Row: &streams.CVRRow{Table: "t",
			Key: json.RawMessage(`{"id":"` + string(bytes.Repeat([]byte("x"), streams.CVRMaxMessageBytes)) + `"}`)}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := streams.EncodeCVRUpdate(tt.hdr, tt.events, 0); err == nil {
				t.Fatal("the contract accepts it")
			}
			if _, _, err := encodeUpdate(tt.hdr, tt.events, 0); err == nil {
				t.Fatal("encodeUpdate accepts it")
			}
		})
	}
}
