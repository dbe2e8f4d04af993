package viewsyncer

import (
	"encoding/json"
	"fmt"

	"github.com/jetsync/jetsync/consumers/zql"
)

// rowPatch is one entry of a pokePart's rowsPatch: a put carries the row's
// value, a del its key (canonical JSON).
type rowPatch struct {
	Op        string
	TableName string
	Value     zql.RowValue
	ID        json.RawMessage
}

// pokePartHead is a pokePart's fields other than its rows.
type pokePartHead struct {
	PokeID                string                  `json:"pokeID"`
	LastMutationIDChanges map[string]float64      `json:"lastMutationIDChanges,omitempty"`
	DesiredQueriesPatches map[string][]queryPatch `json:"desiredQueriesPatches,omitempty"`
	GotQueriesPatch       []queryPatch            `json:"gotQueriesPatch,omitempty"`
	MutationsPatch        []json.RawMessage       `json:"mutationsPatch,omitempty"`
}

// encodePokePart encodes a pokePart frame as encodeFrame would, but writes
// the rows by hand: a whole-table hydration pokes 100k of them, and
// reflection over each row's map dominated its encoding.
func encodePokePart(p *pokePartBody, size int) ([]byte, error) {
	head, err := json.Marshal(pokePartHead{p.PokeID, p.LastMutationIDChanges, p.DesiredQueriesPatches, p.GotQueriesPatch, p.MutationsPatch})
	if err != nil {
		return nil, fmt.Errorf("encode pokePart: %w", err)
	}
	b := make([]byte, 0, len(head)+size+32)
	b = append(b, `["pokePart",`...)
	if len(p.RowsPatch) == 0 {
		b = append(b, head...)
		return append(b, ']'), nil
	}
	b = append(b, head[:len(head)-1]...)
	b = append(b, `,"rowsPatch":[`...)
	for i := range p.RowsPatch {
		r := &p.RowsPatch[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"op":"`...)
		b = append(b, r.Op...)
		b = append(b, `","tableName":`...)
		if b, err = appendString(b, r.TableName); err != nil {
			return nil, err
		}
		switch {
		case !r.Value.IsZero():
			b = append(b, `,"value":`...)
			if b, err = r.Value.AppendJSON(b); err != nil {
				return nil, fmt.Errorf("encode pokePart: %w", err)
			}
		case r.ID != nil:
			b = append(b, `,"id":`...)
			b = append(b, r.ID...)
		}
		b = append(b, '}')
	}
	return append(b, "]}]"...), nil
}

// appendString appends s as encoding/json quotes it.
func appendString(b []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			j, err := json.Marshal(s)
			return append(b, j...), err
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), nil
}
