package pgrepl

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/jetsync/jetsync/producers/pgvalue"
	"github.com/jetsync/jetsync/streams"
)

// pgoutput message builders for the fuzz seeds, per the protocol's
// documented layout.
func pgBegin(lsn uint64) []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = binary.BigEndian.AppendUint64(b, 0)
	return binary.BigEndian.AppendUint32(b, 7)
}

func pgCommit(lsn uint64) []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = binary.BigEndian.AppendUint64(b, lsn+8)
	return binary.BigEndian.AppendUint64(b, 0)
}

type pgCol struct {
	name string
	oid  uint32
	key  bool
}

func pgRelation(id uint32, schema, table string, cols []pgCol) []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, id)
	b = append(append(b, schema...), 0)
	b = append(append(b, table...), 0)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		var flags byte
		if c.key {
			flags = 1
		}
		b = append(b, flags)
		b = append(append(b, c.name...), 0)
		b = binary.BigEndian.AppendUint32(b, c.oid)
		b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	}
	return b
}

// pgTuple encodes values; nil is NULL and "\x00toast" an unchanged TOAST.
func pgTuple(vals ...any) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(vals)))
	for _, v := range vals {
		switch v := v.(type) {
		case nil:
			b = append(b, 'n')
		case string:
			if v == "\x00toast" {
				b = append(b, 'u')
				continue
			}
			b = append(b, 't')
			b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

func pgInsert(rel uint32, vals ...any) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'I'}, rel)
	return append(append(b, 'N'), pgTuple(vals...)...)
}

func pgUpdate(rel uint32, oldKey []any, vals ...any) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'U'}, rel)
	if oldKey != nil {
		b = append(append(b, 'K'), pgTuple(oldKey...)...)
	}
	return append(append(b, 'N'), pgTuple(vals...)...)
}

func pgDelete(rel uint32, key ...any) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'D'}, rel)
	return append(append(b, 'K'), pgTuple(key...)...)
}

// pgMessage is a transactional logical message.
func pgMessage(prefix, content string) []byte {
	b := []byte{'M', 1}
	b = binary.BigEndian.AppendUint64(b, 0)
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

// ddlSeed is an event trigger's ddlUpdate: table a gains, renames, retypes
// and drops columns, gets a new index and a new name; b goes; c comes.
const ddlSeed = `{"type":"ddlUpdate","version":1,"event":{"tag":"ALTER TABLE"},"context":{"query":"q"},
"previousSchema":{"version":2,"tables":[
 {"oid":"10","schema":"public","name":"a","replicaIdentity":"d","columns":{"id":{"pos":1,"typeOID":"20","notNull":true},"t":{"pos":2,"typeOID":"25"},"x":{"pos":3,"typeOID":"23"}}},
 {"oid":"11","schema":"public","name":"b","replicaIdentity":"d","columns":{"id":{"pos":1,"typeOID":"20"}}}],
 "indexes":[{"schema":"public","tableName":"a","name":"a_pkey","unique":true,"primary":true,"columns":["id"],"desc":[false]},
  {"schema":"public","tableName":"a","name":"a_x","unique":false,"columns":["x","t"],"desc":[true,false]}]},
"schema":{"version":2,"tables":[
 {"oid":"10","schema":"public","name":"a2","replicaIdentity":"d","columns":{"id":{"pos":1,"typeOID":"20","notNull":true},"t2":{"pos":2,"typeOID":"1043","typmod":14},"n":{"pos":4,"typeOID":"23","dflt":"'-5'::integer"},"s":{"pos":5,"typeOID":"25","dflt":"'it''s'::text"},"z":{"pos":6,"typeOID":"1184","dflt":"now()"}}},
 {"oid":"12","schema":"s","name":"c","replicaIdentity":"d","columns":{"k":{"pos":1,"typeOID":"23","notNull":true}}}],
 "indexes":[{"schema":"public","tableName":"a2","name":"a_pkey","unique":true,"primary":true,"columns":["id"],"desc":[false]},
  {"schema":"public","tableName":"a2","name":"a_n","unique":true,"columns":["n"],"desc":[true]},
  {"schema":"s","tableName":"c","name":"c_pkey","unique":true,"primary":true,"columns":["k"]}]}}`

// frames joins messages with 2-byte length prefixes: one fuzz input is a
// replication session.
func frames(msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = binary.BigEndian.AppendUint16(out, uint16(len(m)))
		out = append(out, m...)
	}
	return out
}

// FuzzDecodePgoutput feeds sequences of pgoutput messages to the decoder:
// whatever it accepts must become changes that encode and decode as stream
// messages; nothing may panic.
func FuzzDecodePgoutput(f *testing.F) {
	cols := []pgCol{
		{"id", pgtype.Int8OID, true}, {"t", pgtype.TextOID, false}, {"ts", pgtype.TimestamptzOID, false},
		{"j", pgtype.JSONBOID, false}, {"a", pgtype.Int4ArrayOID, false}, {"n", pgtype.NumericOID, false},
	}
	rel := pgRelation(16384, "public", "issue", cols)
	f.Add(frames(rel, pgBegin(100), pgInsert(16384, "1", "hé\"llo", "2024-01-01 00:00:00.5+00", `{"a": [1]}`, "{1,NULL,3}", "1.50"), pgCommit(100)))
	f.Add(frames(rel, pgBegin(200), pgUpdate(16384, []any{"1", nil, nil, nil, nil, nil}, "2", "\x00toast", nil, "null", "{}", "NaN"), pgCommit(200)))
	f.Add(frames(rel, pgBegin(300), pgDelete(16384, "2", nil, nil, nil, nil, nil), []byte{'T', 0, 0, 0, 1, 0, 0, 0, 0x40, 0}, pgCommit(300)))
	f.Add(frames(pgRelation(1, "s", "t", []pgCol{{"x", 99999, true}}), pgInsert(1, "x")))
	f.Add(frames(pgBegin(400), pgMessage("zero/0/ddl", ddlSeed), pgCommit(400)))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := newDecoder(streams.Shard{App: "zero"}, pgvalue.NewRegistry(), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		emit := func(ev event) error {
			if ev.kind != evChange {
				return nil
			}
			m := &streams.Message{Schema: ev.table.Schema, Table: ev.table.Name, Parts: []streams.Part{{Watermark: "0a", Last: true, Changes: []streams.Change{ev.change}}}}
			b, err := streams.Encode(m)
			if err != nil {
				if errors.Is(err, streams.ErrMalformed) {
					return nil // a change the contract refuses (an insert without values)
				}
				t.Fatalf("encode %+v: %v", ev.change, err)
			}
			if _, err := streams.Decode(b); err != nil {
				t.Fatalf("the stream cannot read what the decoder made: %v\n%s", err, b)
			}
			return nil
		}
		for len(data) >= 2 {
			n := int(binary.BigEndian.Uint16(data))
			data = data[2:]
			if n > len(data) {
				return
			}
			msg, err := parsePgoutput(data[:n])
			data = data[n:]
			if err != nil {
				continue
			}
			if err := d.decode(context.Background(), msg, emit); err != nil {
				continue
			}
		}
	})
}
