// Package streamstest is a hand-rolled change-stream producer for tests: it
// publishes on a shard's change stream what pgrepl would (resets, initial
// syncs, transactions) without a Postgres, so that consumer tests control
// every message. It imports only streams and nats.go; the caller brings the
// JetStream server (nats-config/natstest runs one).
package streamstest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/streams"
)

// Producer publishes on one shard's change stream and records the
// upstream in its KV bucket.
type Producer struct {
	T      testing.TB
	JS     jetstream.JetStream
	Stream jetstream.Stream
	KV     jetstream.KeyValue
	Shard  streams.Shard

	// LSN is the LSN of the newest watermark NextWM handed out.
	LSN uint64
	// WM is the last commit watermark published; Prev of the next one.
	WM string
	// Version is the replica version of the last reset.
	Version string
}

// Shard is the shard New uses.
var Shard = streams.Shard{App: "zero", Num: 0}

// New ensures the shard's stream and KV bucket on js.
func New(t testing.TB, js jetstream.JetStream) *Producer {
	t.Helper()
	s, kv, err := streams.Ensure(context.Background(), js, streams.Config{Shard: Shard})
	if err != nil {
		t.Fatal(err)
	}
	return &Producer{T: t, JS: js, Stream: s, KV: kv, Shard: Shard, LSN: 0x1000}
}

// NextWM hands out the next watermark, 8 past the last.
func (p *Producer) NextWM() string {
	p.LSN += 8
	return streams.Lexi(p.LSN)
}

// Publish encodes m and publishes it on its subject; it returns the
// stream sequence.
func (p *Producer) Publish(m *streams.Message) uint64 {
	p.T.Helper()
	data, err := streams.Encode(m)
	if err != nil {
		p.T.Fatal(err)
	}
	return p.PublishRaw(m.Schema, m.Table, data, m.Parts)
}

// PublishRaw publishes data as the message of schema.table ("" for the
// transaction subject), with the headers parts call for.
func (p *Producer) PublishRaw(schema, table string, data []byte, parts []streams.Part) uint64 {
	p.T.Helper()
	subj := p.Shard.TxSubject()
	if table != "" {
		subj = p.Shard.TableSubject(schema, table)
	}
	msg := &nats.Msg{Subject: subj, Data: data, Header: streams.Header(parts, p.Version)}
	ack, err := p.JS.PublishMsg(context.Background(), msg)
	if err != nil {
		p.T.Fatalf("publish: %v", err)
	}
	return ack.Sequence
}

// Copy is one message of an initial sync: changes on schema.table.
type Copy struct {
	Schema, Table string
	Changes       []streams.Change
}

// InitialSync publishes a reset under a new replica version, one message
// per copy (in order), and the closing part; it records the sync as the
// upstream's and returns the reset's sequence.
func (p *Producer) InitialSync(copies ...Copy) uint64 {
	p.T.Helper()
	v := p.NextWM()
	p.Version = v
	resetSeq := p.Publish(&streams.Message{Parts: []streams.Part{{Watermark: v, Prev: p.WM, Num: 0, Changes: []streams.Change{{
		Op: streams.OpReset, Reset: &streams.Reset{ReplicaVersion: v, Publications: []string{"zero_data"}, SystemID: "1", Slot: "s"},
	}}}}})
	num := 1
	for _, c := range copies {
		p.Publish(&streams.Message{Schema: c.Schema, Table: c.Table, Parts: []streams.Part{{Watermark: v, Num: num, Changes: c.Changes}}})
		num++
	}
	p.Publish(&streams.Message{Parts: []streams.Part{{Watermark: v, Num: num, Last: true, Changes: []streams.Change{}}}})
	p.WM = v
	p.PutUpstream(resetSeq)
	return resetSeq
}

// PutUpstream records the current replica version, reset at resetSeq, as
// the upstream's completed initial sync.
func (p *Producer) PutUpstream(resetSeq uint64) {
	p.T.Helper()
	b, _ := json.Marshal(streams.Upstream{SystemID: "1", Slot: "s", ReplicaVersion: p.Version, Publications: []string{"zero_data"}, ResetSeq: resetSeq, Complete: true})
	if _, err := p.KV.Put(context.Background(), streams.KeyUpstream, b); err != nil {
		p.T.Fatal(err)
	}
}

// Tx publishes a one-message transaction on schema.table and returns its
// sequence.
func (p *Producer) Tx(schema, table string, cs ...streams.Change) uint64 {
	p.T.Helper()
	wm := p.NextWM()
	seq := p.Publish(&streams.Message{Schema: schema, Table: table, Parts: []streams.Part{{Watermark: wm, Prev: p.WM, Num: 0, Last: true, CommitTimeMs: NowMs(), Changes: cs}}})
	p.WM = wm
	return seq
}

// Packed publishes several transactions on schema.table in one message.
func (p *Producer) Packed(schema, table string, txs ...[]streams.Change) uint64 {
	p.T.Helper()
	m := &streams.Message{Schema: schema, Table: table}
	for _, cs := range txs {
		wm := p.NextWM()
		m.Parts = append(m.Parts, streams.Part{Watermark: wm, Prev: p.WM, Num: 0, Last: true, CommitTimeMs: NowMs(), Changes: cs})
		p.WM = wm
	}
	return p.Publish(m)
}

// NowMs is the time as a commit's CommitTimeMs.
func NowMs() float64 { return float64(time.Now().UnixMicro()) / 1000 }

// Raw is v as JSON.
func Raw(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}
