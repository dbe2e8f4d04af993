package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/streams"
)

// event is one printed line of tail and replay: one change of one part of a
// change message. Backfills print one line per row; a part without changes
// (the empty last part that closes a transaction on the tx subject) prints
// one "commit" line, so that transaction boundaries show. A change cut into
// fragments prints once, whole, at its last fragment's part.
type event struct {
	Seq          uint64             `json:"seq"`
	Time         time.Time          `json:"time"`
	Watermark    string             `json:"watermark"`
	Part         int                `json:"part"`
	Last         bool               `json:"last,omitempty"`
	CommitTimeMs float64            `json:"commitTimeMs,omitempty"`
	Schema       string             `json:"schema,omitempty"`
	Table        string             `json:"table,omitempty"`
	Op           streams.Op         `json:"op"`
	New          streams.Row        `json:"new,omitempty"`
	Old          streams.Row        `json:"old,omitempty"`
	Reset        *streams.Reset     `json:"reset,omitempty"`
	Spec         *streams.TableSpec `json:"spec,omitempty"`
	Index        *streams.IndexSpec `json:"index,omitempty"`
	// FragNum and FragCount show a fragment that could not be joined (the
	// output began inside a fragmented change, or the sequence is broken).
	FragNum   int `json:"fragNum,omitempty"`
	FragCount int `json:"fragCount,omitempty"`
}

// opCommit names the line printed for a part without changes.
const opCommit streams.Op = "commit"

// printer writes events as text or JSON lines.
type printer struct {
	w    *bufio.Writer
	json bool
	// from and to bound the watermarks printed, when set: one message can
	// pack several transactions, so a watermark range cuts inside messages.
	from, to string
	// frag joins a change too big for one message: it prints once, at its
	// last fragment.
	frag streams.Assembler
	// log, when set, reports fragments that cannot be joined, once per
	// transaction (badWM).
	log   *slog.Logger
	badWM string
}

func newPrinter(w io.Writer, asJSON bool) *printer {
	return &printer{w: bufio.NewWriter(w), json: asJSON}
}

// message prints every event of one stream message and flushes, so that a
// pipe sees each message as it arrives.
func (p *printer) message(seq uint64, at time.Time, m *streams.Message) error {
	for _, part := range m.Parts {
		if p.from != "" && part.Watermark < p.from || p.to != "" && part.Watermark > p.to {
			continue
		}
		base := event{
			Seq: seq, Time: at.UTC(), Watermark: part.Watermark, Part: part.Num, Last: part.Last,
			CommitTimeMs: part.CommitTimeMs, Schema: m.Schema, Table: m.Table,
		}
		if len(part.Changes) == 0 {
			ev := base
			ev.Op = opCommit
			if err := p.event(&ev); err != nil {
				return err
			}
		}
		changes, err := p.frag.Part(m.Schema, m.Table, &part)
		if err != nil {
			// Show what there is: the fragments as they are.
			if p.log != nil && part.Watermark != p.badWM {
				p.log.Warn("fragments that cannot be joined", logkey.Seq, seq, "err", err)
			}
			p.badWM, changes = part.Watermark, part.Changes
		}
		for _, c := range changes {
			ev := base
			ev.Op, ev.New, ev.Old, ev.Reset, ev.Spec, ev.Index = c.Op, c.New, c.Old, c.Reset, c.Spec, c.Index
			if c.Op == streams.OpFragment {
				ev.FragNum, ev.FragCount = c.FragNum, c.FragCount
			}
			if c.Op != streams.OpBackfill {
				if err := p.event(&ev); err != nil {
					return err
				}
				continue
			}
			for _, r := range c.Rows {
				row := make(streams.Row, len(c.Columns))
				for i, col := range c.Columns {
					row[col] = r[i]
				}
				ev.New = row
				if err := p.event(&ev); err != nil {
					return err
				}
			}
		}
	}
	return p.w.Flush()
}

func (p *printer) event(ev *event) error {
	if p.json {
		b, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("encode event: %w", err)
		}
		b = append(b, '\n')
		_, err = p.w.Write(b)
		return err
	}
	_, err := p.w.WriteString(formatText(ev))
	return err
}

// formatText is the text form: logfmt-like key=value pairs, values as
// compact JSON, one line per event.
func formatText(ev *event) string {
	var b strings.Builder
	b.WriteString("seq=")
	b.WriteString(strconv.FormatUint(ev.Seq, 10))
	b.WriteString(" wm=")
	b.WriteString(ev.Watermark)
	b.WriteString(" part=")
	b.WriteString(strconv.Itoa(ev.Part))
	if ev.Last {
		b.WriteString(" last=true")
	}
	b.WriteString(" table=")
	if ev.Table != "" {
		b.WriteString(ev.Schema + "." + ev.Table)
	} else {
		b.WriteString("-")
	}
	b.WriteString(" op=")
	b.WriteString(string(ev.Op))
	field := func(k string, v any) {
		if j, err := json.Marshal(v); err == nil {
			b.WriteString(" " + k + "=")
			b.Write(j)
		}
	}
	if ev.New != nil {
		field("new", ev.New)
	}
	if ev.Old != nil {
		field("old", ev.Old)
	}
	if ev.Reset != nil {
		field("reset", ev.Reset)
	}
	if ev.Spec != nil {
		field("spec", ev.Spec)
	}
	if ev.Index != nil {
		field("index", ev.Index)
	}
	if ev.FragCount != 0 {
		b.WriteString(" fragment=" + strconv.Itoa(ev.FragNum) + "/" + strconv.Itoa(ev.FragCount))
	}
	b.WriteByte('\n')
	return b.String()
}

// parseTable reads --table: "schema.table", or "table" in schema public.
func parseTable(s string) (schema, table string, err error) {
	if s == "" {
		return "", "", nil
	}
	schema, table, ok := strings.Cut(s, ".")
	if !ok {
		schema, table = "public", s
	}
	if schema == "" || table == "" || strings.Contains(table, ".") {
		return "", "", usageError("--table %q: want schema.table or table", s)
	}
	return schema, table, nil
}
