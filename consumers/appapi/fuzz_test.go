package appapi

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// The seed corpora in testdata/fuzz hold the six query shapes' real ASTs
// (from the hydrate-all-shapes-legacy transcript) and every response form.

var cmpResponses = []cmp.Option{
	cmp.AllowUnexported(queryResponse{}, mutateResponse{}),
	cmpopts.IgnoreFields(Failure{}, "Err"),
	cmpopts.IgnoreFields(QueryResult{}, "AST"),
	cmp.FilterValues(func(x, _ any) bool { _, raw := x.(json.RawMessage); return !raw }, cmpopts.EquateEmpty()),
	// Raw JSON compares by value: encoding may escape differently.
	cmp.Comparer(func(a, b json.RawMessage) bool {
		var x, y any
		if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
			return string(a) == string(b)
		}
		return cmp.Equal(x, y)
	}),
}

// encodeQueryResponse writes r in zero's current form.
func encodeQueryResponse(t *testing.T, r queryResponse) []byte {
	t.Helper()
	if r.failure != nil {
		return marshalRaw(t, r.failure)
	}
	items := []any{}
	for _, q := range r.queries {
		if q.Error != nil {
			items = append(items, q.Error)
			continue
		}
		items = append(items, map[string]any{"id": q.ID, "name": q.Name, "ast": q.ASTJSON})
	}
	obj := map[string]any{"kind": "QueryResponse", "queries": items}
	if r.validation.Server {
		obj["userID"] = r.validation.UserID
	}
	return marshalRaw(t, obj)
}

// marshalRaw encodes v without HTML escaping, so that raw JSON it embeds
// keeps its bytes.
func marshalRaw(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := json.NewEncoder(&buf)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func FuzzDecodeQueryResponse(f *testing.F) {
	f.Add([]byte(okQueryResponse("u1")))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"kind":"QueryResponse","queries":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeQueryResponse(b)
		if err != nil {
			return
		}
		again, err := decodeQueryResponse(encodeQueryResponse(t, r))
		if err != nil {
			t.Fatalf("re-decoding %s: %v", encodeQueryResponse(t, r), err)
		}
		if diff := cmp.Diff(r, again, cmpResponses...); diff != "" {
			t.Errorf("round trip (-first +second):\n%s", diff)
		}
	})
}

func encodeMutateResponse(t *testing.T, r mutateResponse) []byte {
	t.Helper()
	var v any = r.failure
	if r.failure == nil {
		obj := map[string]any{"kind": "MutateResponse", "mutations": r.mutations}
		if r.mutations == nil {
			obj["mutations"] = []any{}
		}
		if r.validation.Server {
			obj["userID"] = r.validation.UserID
		}
		v = obj
	}
	return marshalRaw(t, v)
}

func FuzzDecodeMutateResponse(f *testing.F) {
	f.Add([]byte(`{"kind":"MutateResponse","mutations":[]}`))
	f.Add([]byte(`{"error":"http","status":1e400,"details":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeMutateResponse(b)
		if err != nil {
			return
		}
		for _, m := range r.mutations {
			_ = m.ResultError()
		}
		_ = PushResult{Mutations: r.mutations}.OutOfOrder()
		again, err := decodeMutateResponse(encodeMutateResponse(t, r))
		if err != nil {
			t.Fatalf("re-decoding %s: %v", encodeMutateResponse(t, r), err)
		}
		if diff := cmp.Diff(r, again, cmpResponses...); diff != "" {
			t.Errorf("round trip (-first +second):\n%s", diff)
		}
	})
}
