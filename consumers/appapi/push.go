package appapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// CleanupResultsMutation is the internal mutator zero-cache calls to delete
// acknowledged mutation results (docs/protocol.md §14).
const CleanupResultsMutation = "_zero_cleanupResults"

// Mutation is one mutation of a push (docs/protocol.md §4.5).
type Mutation struct {
	Type      string          `json:"type"`
	ID        int64           `json:"id"`
	ClientID  string          `json:"clientID"`
	Name      string          `json:"name"`
	Args      json.RawMessage `json:"args"`
	Timestamp float64         `json:"timestamp"`
}

// PushBody is the client's push body, forwarded to the mutate endpoint as
// it is.
type PushBody struct {
	ClientGroupID string     `json:"clientGroupID"`
	Mutations     []Mutation `json:"mutations"`
	PushVersion   int        `json:"pushVersion"`
	SchemaVersion *int       `json:"schemaVersion,omitempty"`
	Timestamp     float64    `json:"timestamp"`
	RequestID     string     `json:"requestID"`
	Traceparent   string     `json:"traceparent,omitempty"`
}

// MutationIDs lists the ids of the body's mutations.
func (b PushBody) MutationIDs() []MutationID {
	ids := make([]MutationID, len(b.Mutations))
	for i, m := range b.Mutations {
		ids[i] = MutationID{ClientID: m.ClientID, ID: m.ID}
	}
	return ids
}

// PushRequest forwards a push to the mutate endpoint.
type PushRequest struct {
	Conn Conn
	// URL is the client's userPushURL; "" means the first ZERO_MUTATE_URL.
	// It is used only if the configured patterns allow it.
	URL string
	// Headers are the client's userPushHeaders; only the allowed ones are
	// sent.
	Headers map[string]string
	Body    PushBody
}

// MutationResponse is one mutation's outcome in a mutate response.
type MutationResponse struct {
	ID MutationID `json:"id"`
	// Result is {} or {"data":...} on success, {"error":"app",...} or
	// {"error":"oooMutation"|"alreadyProcessed",...} otherwise.
	Result json.RawMessage `json:"result"`
}

// ResultError returns the result's "error" value, "" for a success.
func (m MutationResponse) ResultError() string {
	var r struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(m.Result, &r)
	return r.Error
}

// PushResult is a successful push. zero-cache does not forward the results:
// the client learns them through replication of the clients and mutations
// tables.
type PushResult struct {
	Mutations  []MutationResponse
	Validation Validation
}

// OutOfOrder returns, per client, the PushFailed (origin server, reason
// oooMutation) that zero-cache fails that client's connection with when one
// of its results is {"error":"oooMutation"}. It lists all that client's
// mutations of the response, as zero-cache does.
func (r PushResult) OutOfOrder() map[string]*Failure {
	byClient := map[string][]MutationResponse{}
	var order []string
	for _, m := range r.Mutations {
		if _, ok := byClient[m.ID.ClientID]; !ok {
			order = append(order, m.ID.ClientID)
		}
		byClient[m.ID.ClientID] = append(byClient[m.ID.ClientID], m)
	}
	out := map[string]*Failure{}
	for _, cid := range order {
		ms := byClient[cid]
		for _, m := range ms {
			if m.ResultError() != "oooMutation" {
				continue
			}
			var res struct {
				Details json.RawMessage `json:"details"`
			}
			_ = json.Unmarshal(m.Result, &res)
			f := &Failure{Kind: KindPushFailed, Origin: OriginServer, Reason: ReasonOutOfOrderMutation,
				Message: "mutation was out of order", Details: res.Details}
			for _, x := range ms {
				f.MutationIDs = append(f.MutationIDs, x.ID)
			}
			out[cid] = f
			break
		}
	}
	return out
}

// Push forwards a push to the mutate endpoint, as zero-cache's pusher does
// for one (combined) push. The error is a *Failure (PushFailed): one the
// API server returned (its own body, or a legacy error body converted as
// zero-cache converts it), or one of the exchange, with MutationIDs set to
// the body's mutations. IsAuth(err) means 401/403: fail the connection.
// Failure.ByClient splits it for the clients it names.
func (c *Client) Push(ctx context.Context, req PushRequest) (PushResult, error) {
	r := request{src: sourcePush, conn: req.Conn, url: req.URL, clientHeaders: req.Headers,
		traceparent: req.Body.Traceparent, body: req.Body}
	ids := req.Body.MutationIDs()
	b, err := c.post(ctx, r)
	if err == nil {
		var resp mutateResponse
		resp, err = decodeMutateResponse(b)
		if err == nil {
			if resp.failure != nil {
				return PushResult{}, resp.failure
			}
			return PushResult{Mutations: resp.mutations, Validation: resp.validation}, nil
		}
		err = newFailure(KindPushFailed, ReasonParse, "Failed to parse response from API server: "+err.Error(), err)
	}
	var f *Failure
	if !errors.As(err, &f) {
		f = newFailure(KindPushFailed, ReasonInternal, "Failed to push: "+err.Error(), err)
	}
	f.MutationIDs = ids
	return PushResult{}, f
}

// CleanupRequest addresses a cleanup of mutation results to the mutate
// endpoint on behalf of a connection of ClientGroupID.
type CleanupRequest struct {
	Conn          Conn
	URL           string
	Headers       map[string]string
	ClientGroupID string
}

// CleanupResults asks the API server to delete clientID's mutation results
// up to and including upTo, after ackMutationResponses. zero-cache logs and
// ignores its failure; so should the caller.
func (c *Client) CleanupResults(ctx context.Context, r CleanupRequest, clientID string, upTo int64) error {
	if !c.cfg.Mutate.Configured() && r.URL == "" {
		return nil
	}
	body, err := c.CleanupResultsBody(r.ClientGroupID, clientID, upTo)
	if err != nil {
		return err
	}
	return c.pushCleanup(ctx, r, body)
}

// CleanupClients asks the API server to delete the mutation results of
// deleted clients (one bulk mutation, sent as the first client).
func (c *Client) CleanupClients(ctx context.Context, r CleanupRequest, clientIDs []string) error {
	if len(clientIDs) == 0 || !c.cfg.Mutate.Configured() && r.URL == "" {
		return nil
	}
	body, err := c.CleanupClientsBody(r.ClientGroupID, clientIDs)
	if err != nil {
		return err
	}
	return c.pushCleanup(ctx, r, body)
}

func (c *Client) pushCleanup(ctx context.Context, r CleanupRequest, body PushBody) error {
	_, err := c.Push(ctx, PushRequest{Conn: r.Conn, URL: r.URL, Headers: r.Headers, Body: body})
	return err
}

// CleanupResultsBody is the push of the mutation that deletes clientID's
// results up to and including upTo.
func (c *Client) CleanupResultsBody(group, clientID string, upTo int64) (PushBody, error) {
	arg := map[string]any{"type": "single", "clientGroupID": group, "clientID": clientID, "upToMutationID": upTo}
	return c.cleanupBody(group, clientID, arg, fmt.Sprintf("cleanup-%s-%s-%d", group, clientID, upTo))
}

// CleanupClientsBody is the push of the mutation that deletes the results
// of the deleted clients, sent as the first of them.
func (c *Client) CleanupClientsBody(group string, clientIDs []string) (PushBody, error) {
	arg := map[string]any{"type": "bulk", "clientGroupID": group, "clientIDs": clientIDs}
	ms := c.now().UnixMilli()
	return c.cleanupBody(group, clientIDs[0], arg, "cleanup-bulk-"+group+"-"+strconv.FormatInt(ms, 10))
}

func (c *Client) cleanupBody(group, clientID string, arg any, requestID string) (PushBody, error) {
	args, err := json.Marshal([]any{arg})
	if err != nil {
		return PushBody{}, fmt.Errorf("encode cleanup: %w", err)
	}
	ts := float64(c.now().UnixMilli())
	return PushBody{
		ClientGroupID: group,
		Mutations: []Mutation{{Type: "custom", ID: 0, ClientID: clientID, Name: CleanupResultsMutation,
			Args: args, Timestamp: ts}},
		PushVersion: 1,
		Timestamp:   ts,
		RequestID:   requestID,
	}, nil
}

// mutateResponse is a decoded mutate endpoint response.
type mutateResponse struct {
	mutations  []MutationResponse
	validation Validation
	failure    *Failure
}

// decodeMutateResponse accepts zero's MutateResponse, a PushFailed body, and
// the legacy {"mutations":[...]} and {"error":...} bodies, with unknown keys
// ignored. Legacy errors become the PushFailed zero-cache sends for them.
func decodeMutateResponse(b []byte) (mutateResponse, error) {
	var obj map[string]json.RawMessage
	if err := unmarshalObject(b, &obj); err != nil {
		return mutateResponse{}, err
	}
	if _, ok := obj["kind"]; ok {
		kind, err := stringField(obj, "kind", true)
		if err != nil {
			return mutateResponse{}, err
		}
		switch kind {
		case "MutateResponse":
			var resp mutateResponse
			if raw, ok := obj["userID"]; ok {
				id, err := nullableString(raw)
				if err != nil {
					return mutateResponse{}, fmt.Errorf("userID: %w", err)
				}
				resp.validation = Validation{Server: true, UserID: id}
			}
			resp.mutations, err = decodeMutationResponses(obj)
			return resp, err
		case KindPushFailed:
			f, err := decodeFailure(KindPushFailed, obj)
			return mutateResponse{failure: f}, err
		}
		// A legacy body may carry an unrelated "kind"; fall through.
	}
	if _, ok := obj["error"]; ok {
		f, err := decodeLegacyPushError(obj)
		return mutateResponse{failure: f}, err
	}
	if _, ok := obj["mutations"]; ok {
		ms, err := decodeMutationResponses(obj)
		return mutateResponse{mutations: ms}, err
	}
	return mutateResponse{}, errors.New("not a mutate response")
}

func decodeMutationResponses(obj map[string]json.RawMessage) ([]MutationResponse, error) {
	raw, ok := obj["mutations"]
	if !ok {
		return nil, errors.New("missing property mutations")
	}
	var items []json.RawMessage
	if err := unmarshalArray(raw, &items); err != nil {
		return nil, fmt.Errorf("mutations: %w", err)
	}
	out := make([]MutationResponse, 0, len(items))
	for i, it := range items {
		var m map[string]json.RawMessage
		if err := unmarshalObject(it, &m); err != nil {
			return nil, fmt.Errorf("mutations[%d]: %w", i, err)
		}
		idRaw, ok := m["id"]
		if !ok {
			return nil, fmt.Errorf("mutations[%d]: missing property id", i)
		}
		id, err := decodeMutationID(idRaw)
		if err != nil {
			return nil, fmt.Errorf("mutations[%d].id: %w", i, err)
		}
		res, ok := m["result"]
		if !ok || firstByte(res) != '{' {
			return nil, fmt.Errorf("mutations[%d]: result must be an object", i)
		}
		var r map[string]json.RawMessage
		if err := json.Unmarshal(res, &r); err != nil {
			return nil, fmt.Errorf("mutations[%d].result: %w", i, err)
		}
		if _, isErr := r["error"]; isErr {
			e, err := stringField(r, "error", true)
			if err != nil {
				return nil, fmt.Errorf("mutations[%d].result: %w", i, err)
			}
			switch e {
			case "app":
				if _, err := stringField(r, "message", false); err != nil {
					return nil, fmt.Errorf("mutations[%d].result: %w", i, err)
				}
			case "oooMutation", "alreadyProcessed":
			default:
				return nil, fmt.Errorf("mutations[%d].result: unknown error %q", i, e)
			}
		}
		out = append(out, MutationResponse{ID: id, Result: compact(res)})
	}
	return out, nil
}

// decodeLegacyPushError converts the deprecated {"error":...} push bodies to
// the PushFailed zero-cache sends the client for them.
func decodeLegacyPushError(obj map[string]json.RawMessage) (*Failure, error) {
	e, err := stringField(obj, "error", true)
	if err != nil {
		return nil, err
	}
	var ids []MutationID
	if raw, ok := obj["mutationIDs"]; ok {
		if ids, err = decodeMutationIDs(raw); err != nil {
			return nil, fmt.Errorf("mutationIDs: %w", err)
		}
	}
	f := &Failure{Kind: KindPushFailed, Origin: OriginServer, Reason: ReasonInternal, MutationIDs: ids}
	switch e {
	case "http":
		raw, ok := obj["status"]
		var st float64
		if !ok || json.Unmarshal(raw, &st) != nil {
			return nil, errors.New("status: expected a number")
		}
		details, err := stringField(obj, "details", true)
		if err != nil {
			return nil, err
		}
		f.Origin, f.Reason, f.Status, f.BodyPreview = OriginZeroCache, ReasonHTTP, int(st), &details
		f.Message = fmt.Sprintf("Fetch from API server returned non-OK status %d", f.Status)
	case "unsupportedPushVersion":
		f.Reason, f.Message = ReasonUnsupportedPushVersion, "Unsupported push version"
	case "unsupportedSchemaVersion":
		f.Message = "Unsupported schema version"
	case "zeroPusher":
		if f.Message, err = stringField(obj, "details", true); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown push error %q", e)
	}
	return f, nil
}
