package appapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/jetsync/jetsync/consumers/zql"
)

// Query is one synced query to transform: its id (the query hash the client
// sent), name and args (the JSON array from the desired-query put).
type Query struct {
	ID   string          `json:"id"`
	Name string          `json:"name"`
	Args json.RawMessage `json:"args"`
}

// TransformRequest asks the query endpoint for the ASTs of Queries.
type TransformRequest struct {
	Conn Conn
	// URL is the client's userQueryURL; "" means the first ZERO_QUERY_URL.
	// It is used only if the configured patterns allow it.
	URL string
	// Headers are the client's userQueryHeaders; only the allowed ones are
	// sent.
	Headers     map[string]string
	Traceparent string
	Queries     []Query
}

// QueryResult is the outcome for one query: an AST or a per-query error.
type QueryResult struct {
	ID   string
	Name string
	// AST is the transformed query, and ASTJSON its canonical encoding.
	AST     *zql.AST
	ASTJSON json.RawMessage
	// TransformationHash identifies the AST: FNV-64a of ASTJSON in base 36,
	// the hash the view-syncer computes for bound ASTs.
	TransformationHash string
	// Error is set instead of AST when the API server refused this query.
	Error *QueryError
}

// QueryError is a per-query error from the API server. MarshalJSON writes the
// element of the transformError frame (docs/protocol.md §5.6).
type QueryError struct {
	// Kind is "app" (the query function threw) or "parse" (bad args).
	Kind    string
	ID      string
	Name    string
	Message string
	Details json.RawMessage
}

// MarshalJSON writes {"error","id","name","message"?,"details"?}; message is
// always present for "parse", which requires it.
func (e *QueryError) MarshalJSON() ([]byte, error) {
	type body struct {
		Error   string          `json:"error"`
		ID      string          `json:"id"`
		Name    string          `json:"name"`
		Message *string         `json:"message,omitempty"`
		Details json.RawMessage `json:"details,omitempty"`
	}
	b := body{Error: e.Kind, ID: e.ID, Name: e.Name, Details: e.Details}
	if e.Message != "" || e.Kind == "parse" {
		b.Message = &e.Message
	}
	return json.Marshal(b)
}

// TransformResult is a successful transform.
type TransformResult struct {
	// Queries holds the results of the queries sent, then those served
	// from the cache (zero-cache's order).
	Queries []QueryResult
	// Cached is true when every query came from the cache: no request was
	// made, so the connection was not validated by it.
	Cached bool
	// Validation is how the response vouched for the user (when !Cached).
	Validation Validation
}

// Transform resolves synced queries through the query endpoint, as
// zero-cache's CustomQueryTransformer.transform. Successful per-query
// results are cached for CacheTTL under the request identity (token, cookie,
// origin, userID, URL, forwarded headers); errors are not. The error is a
// *Failure (TransformFailed) with QueryIDs set to the ids sent, unless the
// API server returned a TransformFailed body, which is passed on as it is.
func (c *Client) Transform(ctx context.Context, req TransformRequest) (TransformResult, error) {
	r := request{src: sourceTransform, conn: req.Conn, url: req.URL, clientHeaders: req.Headers, traceparent: req.Traceparent}
	e := c.effective(r)
	now := c.now()
	var send []Query
	var cached []QueryResult
	for _, q := range req.Queries {
		if hit, ok := c.cache.get(cacheKey(e, req.Conn.UserID, q.ID), now); ok {
			cached = append(cached, hit)
			continue
		}
		if q.Args == nil {
			q.Args = json.RawMessage("[]")
		}
		send = append(send, q)
	}
	if len(send) == 0 {
		return TransformResult{Queries: cached, Cached: true}, nil
	}
	ids := make([]string, len(send))
	for i, q := range send {
		ids[i] = q.ID
	}
	r.body = []any{"transform", send}
	resp, err := c.requestTransform(ctx, r, ids, "transform")
	if err != nil {
		return TransformResult{}, err
	}
	now = c.now()
	for _, q := range resp.queries {
		if q.Error == nil {
			c.cache.set(cacheKey(e, req.Conn.UserID, q.ID), q, now)
		}
	}
	return TransformResult{Queries: append(resp.queries, cached...), Validation: resp.validation}, nil
}

// Validate checks the connection's credentials with an empty transform
// request, ["transform", []], which zero-cache sends on initConnection and
// for periodic revalidation. Without a configured query endpoint there is
// nothing to ask, and the result is a client-fallback success, as in
// zero-cache. url and headers are the client's userQueryURL and
// userQueryHeaders.
func (c *Client) Validate(ctx context.Context, conn Conn, url string, headers map[string]string) (Validation, error) {
	if !c.cfg.Query.Configured() {
		return Validation{}, nil
	}
	r := request{src: sourceTransform, conn: conn, url: url, clientHeaders: headers, body: []any{"transform", []Query{}}}
	resp, err := c.requestTransform(ctx, r, nil, "validate")
	if err != nil {
		return Validation{}, err
	}
	return resp.validation, nil
}

func (c *Client) requestTransform(ctx context.Context, r request, ids []string, op string) (queryResponse, error) {
	if ids == nil {
		ids = []string{}
	}
	b, err := c.post(ctx, r)
	if err == nil {
		var resp queryResponse
		resp, err = decodeQueryResponse(b)
		if err == nil {
			if resp.failure != nil {
				return queryResponse{}, resp.failure
			}
			return resp, nil
		}
		err = newFailure(KindTransformFailed, ReasonParse, "Failed to parse response from API server: "+err.Error(), err)
	}
	var f *Failure
	if !errors.As(err, &f) {
		f = newFailure(KindTransformFailed, ReasonInternal, fmt.Sprintf("Failed to %s queries: %v", op, err), err)
	}
	f.QueryIDs = ids
	return queryResponse{}, f
}

// queryResponse is a decoded query endpoint response: results, or the
// failure the API server reported.
type queryResponse struct {
	queries    []QueryResult
	validation Validation
	failure    *Failure
}

// decodeQueryResponse accepts zero's QueryResponse, a TransformFailed body,
// and the legacy ["transformed", [...]] and ["transformFailed", body], in
// that order, with unknown keys ignored (valita passthrough).
func decodeQueryResponse(b []byte) (queryResponse, error) {
	switch firstByte(b) {
	case '{':
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(b, &obj); err != nil {
			return queryResponse{}, err
		}
		kind, err := stringField(obj, "kind", true)
		if err != nil {
			return queryResponse{}, err
		}
		switch kind {
		case "QueryResponse":
			var resp queryResponse
			if raw, ok := obj["userID"]; ok {
				id, err := nullableString(raw)
				if err != nil {
					return queryResponse{}, fmt.Errorf("userID: %w", err)
				}
				resp.validation = Validation{Server: true, UserID: id}
			}
			raw, ok := obj["queries"]
			if !ok {
				return queryResponse{}, errors.New("missing property queries")
			}
			if resp.queries, err = decodeQueryResults(raw); err != nil {
				return queryResponse{}, err
			}
			return resp, nil
		case KindTransformFailed:
			f, err := decodeFailure(KindTransformFailed, obj)
			if err != nil {
				return queryResponse{}, err
			}
			return queryResponse{failure: f}, nil
		}
		return queryResponse{}, fmt.Errorf("unexpected kind %q", kind)
	case '[':
		var arr []json.RawMessage
		if err := json.Unmarshal(b, &arr); err != nil {
			return queryResponse{}, err
		}
		if len(arr) != 2 {
			return queryResponse{}, fmt.Errorf("expected a [tag, body] pair, got %d elements", len(arr))
		}
		var tag string
		if err := json.Unmarshal(arr[0], &tag); err != nil {
			return queryResponse{}, fmt.Errorf("tag: %w", err)
		}
		switch tag {
		case "transformed":
			qs, err := decodeQueryResults(arr[1])
			return queryResponse{queries: qs}, err
		case "transformFailed":
			var obj map[string]json.RawMessage
			if err := unmarshalObject(arr[1], &obj); err != nil {
				return queryResponse{}, err
			}
			if k, err := stringField(obj, "kind", true); err != nil || k != KindTransformFailed {
				return queryResponse{}, fmt.Errorf("transformFailed body: kind %q", k)
			}
			f, err := decodeFailure(KindTransformFailed, obj)
			if err != nil {
				return queryResponse{}, err
			}
			return queryResponse{failure: f}, nil
		}
		return queryResponse{}, fmt.Errorf("unexpected tag %q", tag)
	}
	return queryResponse{}, errors.New("expected a JSON object or array")
}

func decodeQueryResults(raw json.RawMessage) ([]QueryResult, error) {
	var items []json.RawMessage
	if firstByte(raw) != '[' {
		return nil, errors.New("queries: expected an array")
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("queries: %w", err)
	}
	out := make([]QueryResult, 0, len(items))
	for i, it := range items {
		q, err := decodeQueryResult(it)
		if err != nil {
			return nil, fmt.Errorf("queries[%d]: %w", i, err)
		}
		out = append(out, q)
	}
	return out, nil
}

func decodeQueryResult(raw json.RawMessage) (QueryResult, error) {
	var obj map[string]json.RawMessage
	if err := unmarshalObject(raw, &obj); err != nil {
		return QueryResult{}, err
	}
	id, err := stringField(obj, "id", true)
	if err != nil {
		return QueryResult{}, err
	}
	name, err := stringField(obj, "name", true)
	if err != nil {
		return QueryResult{}, err
	}
	if _, ok := obj["error"]; ok {
		kind, err := stringField(obj, "error", true)
		if err != nil {
			return QueryResult{}, err
		}
		if kind != "app" && kind != "parse" {
			return QueryResult{}, fmt.Errorf("unknown query error %q", kind)
		}
		msg, err := stringField(obj, "message", kind == "parse")
		if err != nil {
			return QueryResult{}, err
		}
		qe := &QueryError{Kind: kind, ID: id, Name: name, Message: msg}
		if d, ok := obj["details"]; ok && !isNull(d) {
			qe.Details = compact(d)
		}
		return QueryResult{ID: id, Name: name, Error: qe}, nil
	}
	astRaw, ok := obj["ast"]
	if !ok {
		return QueryResult{}, errors.New("missing property ast")
	}
	a, err := zql.ParseAST(astRaw)
	if err != nil {
		return QueryResult{}, fmt.Errorf("ast: %w", err)
	}
	canon, err := json.Marshal(a)
	if err != nil {
		return QueryResult{}, fmt.Errorf("ast: %w", err)
	}
	return QueryResult{ID: id, Name: name, AST: a, ASTJSON: canon, TransformationHash: astHash(canon)}, nil
}

// astHash matches the view-syncer's transformationHash of a bound AST.
func astHash(canon []byte) string {
	h := fnv.New64a()
	_, _ = h.Write(canon)
	return strconv.FormatUint(h.Sum64(), 36)
}

// decodeFailure reads a TransformFailed or PushFailed body; its variants are
// those of the client's schema (docs/protocol.md §9.1).
func decodeFailure(kind string, obj map[string]json.RawMessage) (*Failure, error) {
	f := &Failure{Kind: kind}
	var err error
	if f.Message, err = stringField(obj, "message", true); err != nil {
		return nil, err
	}
	if f.Origin, err = stringField(obj, "origin", true); err != nil {
		return nil, err
	}
	if f.Reason, err = stringField(obj, "reason", true); err != nil {
		return nil, err
	}
	if d, ok := obj["details"]; ok && !isNull(d) {
		f.Details = compact(d)
	}
	switch f.Origin {
	case OriginServer:
		switch f.Reason {
		case ReasonDatabase, ReasonParse, ReasonInternal:
		case ReasonOutOfOrderMutation, ReasonUnsupportedPushVersion:
			if kind != KindPushFailed {
				return nil, fmt.Errorf("reason %q is not a %s reason", f.Reason, kind)
			}
		default:
			return nil, fmt.Errorf("unknown reason %q", f.Reason)
		}
	case OriginZeroCache:
		switch f.Reason {
		case ReasonHTTP:
			raw, ok := obj["status"]
			if !ok {
				return nil, errors.New("missing property status")
			}
			var st float64
			if err := json.Unmarshal(raw, &st); err != nil {
				return nil, fmt.Errorf("status: %w", err)
			}
			f.Status = int(st)
			if _, ok := obj["bodyPreview"]; ok {
				p, err := stringField(obj, "bodyPreview", true)
				if err != nil {
					return nil, err
				}
				f.BodyPreview = &p
			}
		case ReasonTimeout, ReasonParse, ReasonInternal:
		default:
			return nil, fmt.Errorf("unknown reason %q", f.Reason)
		}
	default:
		return nil, fmt.Errorf("unknown origin %q", f.Origin)
	}
	if kind == KindTransformFailed {
		raw, ok := obj["queryIDs"]
		if !ok {
			return nil, errors.New("missing property queryIDs")
		}
		if err := unmarshalArray(raw, &f.QueryIDs); err != nil {
			return nil, fmt.Errorf("queryIDs: %w", err)
		}
		return f, nil
	}
	raw, ok := obj["mutationIDs"]
	if !ok {
		return nil, errors.New("missing property mutationIDs")
	}
	if f.MutationIDs, err = decodeMutationIDs(raw); err != nil {
		return nil, fmt.Errorf("mutationIDs: %w", err)
	}
	return f, nil
}

func decodeMutationIDs(raw json.RawMessage) ([]MutationID, error) {
	var items []json.RawMessage
	if err := unmarshalArray(raw, &items); err != nil {
		return nil, err
	}
	out := make([]MutationID, 0, len(items))
	for i, it := range items {
		id, err := decodeMutationID(it)
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		out = append(out, id)
	}
	return out, nil
}

func decodeMutationID(raw json.RawMessage) (MutationID, error) {
	var obj map[string]json.RawMessage
	if err := unmarshalObject(raw, &obj); err != nil {
		return MutationID{}, err
	}
	cid, err := stringField(obj, "clientID", true)
	if err != nil {
		return MutationID{}, err
	}
	idRaw, ok := obj["id"]
	if !ok || firstByte(idRaw) == 'n' {
		return MutationID{}, errors.New("missing property id")
	}
	var id float64
	if err := json.Unmarshal(idRaw, &id); err != nil {
		return MutationID{}, fmt.Errorf("id: %w", err)
	}
	return MutationID{ClientID: cid, ID: int64(id)}, nil
}

func firstByte(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

func isNull(b json.RawMessage) bool { return firstByte(b) == 'n' }

func compact(b json.RawMessage) json.RawMessage {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

func unmarshalObject(raw json.RawMessage, obj *map[string]json.RawMessage) error {
	if firstByte(raw) != '{' {
		return errors.New("expected an object")
	}
	return json.Unmarshal(raw, obj)
}

func unmarshalArray[T any](raw json.RawMessage, out *[]T) error {
	if firstByte(raw) != '[' {
		return errors.New("expected an array")
	}
	return json.Unmarshal(raw, out)
}

// stringField reads obj[key] as a string. A missing optional key is "".
func stringField(obj map[string]json.RawMessage, key string, required bool) (string, error) {
	raw, ok := obj[key]
	if !ok {
		if required {
			return "", fmt.Errorf("missing property %s", key)
		}
		return "", nil
	}
	if firstByte(raw) != '"' {
		return "", fmt.Errorf("%s: expected a string", key)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	return s, nil
}

func nullableString(raw json.RawMessage) (*string, error) {
	switch firstByte(raw) {
	case 'n':
		return nil, nil
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return &s, nil
	}
	return nil, errors.New("expected a string or null")
}
