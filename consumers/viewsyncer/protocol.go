package viewsyncer

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jetsync/jetsync/consumers/appapi"
)

// Protocol versions (docs/protocol.md §1).
const (
	ProtocolVersion   = 51
	MinServerProtocol = 30
)

// Error kinds the server sends (docs/protocol.md §9.1).
const (
	kindAuthInvalidated             = "AuthInvalidated"
	kindClientNotFound              = "ClientNotFound"
	kindInvalidConnectionRequest    = "InvalidConnectionRequest"
	kindInvalidConnectionBaseCookie = "InvalidConnectionRequestBaseCookie"
	kindInvalidMessage              = "InvalidMessage"
	kindInvalidPush                 = "InvalidPush"
	kindUnauthorized                = "Unauthorized"
	kindVersionNotSupported         = "VersionNotSupported"
	kindSchemaVersionNotSupported   = "SchemaVersionNotSupported"
	kindInternal                    = "Internal"
	kindRehome                      = "Rehome"
	kindServerOverloaded            = "ServerOverloaded"
)

// protocolError is an error the client is told about, in an "error" frame,
// before the server closes the socket with closeCode.
type protocolError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Origin  string `json:"origin"`
	// MaxBackoffMs caps a backoff kind's reconnect delay (docs/protocol.md
	// §9.4); 0 means at once.
	MaxBackoffMs *int `json:"maxBackoffMs,omitempty"`
	// MinBackoffMs is the least a backoff kind's reconnect delay.
	MinBackoffMs *int `json:"minBackoffMs,omitempty"`

	closeCode int
}

func (e *protocolError) Error() string { return e.Kind + ": " + e.Message }

func newProtocolError(kind, format string, args ...any) *protocolError {
	return &protocolError{Kind: kind, Message: fmt.Sprintf(format, args...), Origin: "zeroCache", closeCode: closeNormal}
}

// Close codes (docs/protocol.md §9.2).
const (
	closeNormal   = 1000
	closeProtocol = 1002
	closeAuth     = 3000
)

// queryPatchOp is one entry of an upstream desiredQueriesPatch (§3.1).
type queryPatchOp struct {
	Op   string          `json:"op"`
	Hash string          `json:"hash,omitempty"`
	TTL  *float64        `json:"ttl,omitempty"`
	AST  json.RawMessage `json:"ast,omitempty"`
	Name *string         `json:"name,omitempty"`
	Args json.RawMessage `json:"args,omitempty"`
}

type deletedClients struct {
	ClientIDs      []string `json:"clientIDs,omitempty"`
	ClientGroupIDs []string `json:"clientGroupIDs,omitempty"`
}

// initConnectionBody is the body of initConnection (§4.1).
type initConnectionBody struct {
	DesiredQueriesPatch []queryPatchOp    `json:"desiredQueriesPatch"`
	ClientSchema        json.RawMessage   `json:"clientSchema,omitempty"`
	Deleted             *deletedClients   `json:"deleted,omitempty"`
	UserPushURL         string            `json:"userPushURL,omitempty"`
	UserPushHeaders     map[string]string `json:"userPushHeaders,omitempty"`
	UserQueryURL        string            `json:"userQueryURL,omitempty"`
	UserQueryHeaders    map[string]string `json:"userQueryHeaders,omitempty"`
	ActiveClients       []string          `json:"activeClients,omitempty"`
	Traceparent         string            `json:"traceparent,omitempty"`
}

type changeDesiredQueriesBody struct {
	DesiredQueriesPatch []queryPatchOp `json:"desiredQueriesPatch"`
	Traceparent         string         `json:"traceparent,omitempty"`
}

type updateAuthBody struct {
	Auth string `json:"auth"`
}

// Upstream tags (§4).
const (
	tagInitConnection       = "initConnection"
	tagChangeDesiredQueries = "changeDesiredQueries"
	tagDeleteClients        = "deleteClients"
	tagUpdateAuth           = "updateAuth"
	tagPush                 = "push"
	tagAckMutationResponses = "ackMutationResponses"
	tagPing                 = "ping"
	tagPull                 = "pull"
	tagInspect              = "inspect"
	tagCloseConnection      = "closeConnection"
)

// upstream is one decoded client frame; exactly the field for Tag is set,
// and none for the tags the server ignores.
type upstream struct {
	Tag                  string
	InitConnection       *initConnectionBody
	ChangeDesiredQueries *changeDesiredQueriesBody
	DeleteClients        *deletedClients
	UpdateAuth           *updateAuthBody
	Push                 *appapi.PushBody
	AckMutationResponses *appapi.MutationID
	Inspect              *inspectBody
}

// errInvalidMessage is wrapped by every decodeUpstream error.
var errInvalidMessage = errors.New("invalid message")

func invalidMessage(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalidMessage, fmt.Sprintf(format, args...))
}

// decodeUpstream decodes one client frame, [tag, body]. It accepts unknown
// keys in bodies (zero-cache would not; docs/protocol.md §1) but
// checks every field the server uses.
func decodeUpstream(b []byte) (*upstream, error) {
	var frame []json.RawMessage
	if err := json.Unmarshal(b, &frame); err != nil {
		return nil, invalidMessage("not a JSON array: %v", err)
	}
	if len(frame) != 2 {
		return nil, invalidMessage("expected [tag, body], got %d elements", len(frame))
	}
	var tag string
	if err := json.Unmarshal(frame[0], &tag); err != nil {
		return nil, invalidMessage("tag is not a string")
	}
	body := frame[1]
	u := &upstream{Tag: tag}
	switch tag {
	case tagInitConnection:
		u.InitConnection = &initConnectionBody{}
		if err := decodeObject(body, u.InitConnection); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
		if u.InitConnection.DesiredQueriesPatch == nil {
			return nil, invalidMessage("%s: missing desiredQueriesPatch", tag)
		}
		if err := checkPatch(u.InitConnection.DesiredQueriesPatch); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
	case tagChangeDesiredQueries:
		u.ChangeDesiredQueries = &changeDesiredQueriesBody{}
		if err := decodeObject(body, u.ChangeDesiredQueries); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
		if u.ChangeDesiredQueries.DesiredQueriesPatch == nil {
			return nil, invalidMessage("%s: missing desiredQueriesPatch", tag)
		}
		if err := checkPatch(u.ChangeDesiredQueries.DesiredQueriesPatch); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
	case tagDeleteClients:
		u.DeleteClients = &deletedClients{}
		if err := decodeObject(body, u.DeleteClients); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
	case tagUpdateAuth:
		u.UpdateAuth = &updateAuthBody{}
		if err := decodeObject(body, u.UpdateAuth); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
	case tagPush:
		u.Push = &appapi.PushBody{}
		if err := decodeObject(body, u.Push); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
		for i, m := range u.Push.Mutations {
			if m.Type != "custom" && m.Type != "crud" {
				return nil, invalidMessage("%s: mutations[%d]: unknown type %q", tag, i, m.Type)
			}
		}
	case tagAckMutationResponses:
		u.AckMutationResponses = &appapi.MutationID{}
		if err := decodeObject(body, u.AckMutationResponses); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
	case tagInspect:
		u.Inspect = &inspectBody{}
		if err := decodeObject(body, u.Inspect); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
	case tagPing, tagPull:
		var m map[string]json.RawMessage
		if err := decodeObject(body, &m); err != nil {
			return nil, invalidMessage("%s: %v", tag, err)
		}
	case tagCloseConnection:
	default:
		return nil, invalidMessage("unknown message type %q", tag)
	}
	return u, nil
}

// decodeObject decodes a JSON object (not null, not an array) into v.
func decodeObject(b json.RawMessage, v any) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return errors.New("body is not an object")
	}
	return json.Unmarshal(b, v)
}

func checkPatch(ops []queryPatchOp) error {
	for i, op := range ops {
		switch op.Op {
		case "put":
			if op.Hash == "" {
				return fmt.Errorf("desiredQueriesPatch[%d]: put without hash", i)
			}
			if len(op.AST) == 0 && op.Name == nil {
				return fmt.Errorf("desiredQueriesPatch[%d]: put without ast or name", i)
			}
		case "del":
			if op.Hash == "" {
				return fmt.Errorf("desiredQueriesPatch[%d]: del without hash", i)
			}
		case "clear":
		default:
			return fmt.Errorf("desiredQueriesPatch[%d]: unknown op %q", i, op.Op)
		}
	}
	return nil
}

// secProtocol is what the client packs into Sec-WebSocket-Protocol (§2.2).
type secProtocol struct {
	InitConnectionMessage json.RawMessage `json:"initConnectionMessage,omitempty"`
	AuthToken             string          `json:"authToken,omitempty"`
}

// decodeSecProtocol decodes the header's value: percent-decoding, standard
// base64, JSON.
func decodeSecProtocol(v string) (*secProtocol, *initConnectionBody, error) {
	s, err := url.PathUnescape(v)
	if err != nil {
		return nil, nil, fmt.Errorf("sec-websocket-protocol: %w", err)
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		raw, err = base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
		if err != nil {
			return nil, nil, fmt.Errorf("sec-websocket-protocol: %w", err)
		}
	}
	var sp secProtocol
	if err := decodeObject(raw, &sp); err != nil {
		return nil, nil, fmt.Errorf("sec-websocket-protocol: %w", err)
	}
	if len(sp.InitConnectionMessage) == 0 || string(sp.InitConnectionMessage) == "null" {
		return &sp, nil, nil
	}
	u, err := decodeUpstream(sp.InitConnectionMessage)
	if err != nil {
		return nil, nil, fmt.Errorf("sec-websocket-protocol: %w", err)
	}
	if u.Tag != tagInitConnection {
		return nil, nil, fmt.Errorf("sec-websocket-protocol: initConnectionMessage is a %s", u.Tag)
	}
	return &sp, u.InitConnection, nil
}

// encodeSecProtocol is the client's encoding, for tests and tools.
func encodeSecProtocol(sp secProtocol) (string, error) {
	b, err := json.Marshal(sp)
	if err != nil {
		return "", err
	}
	s := base64.StdEncoding.EncodeToString(b)
	return strings.NewReplacer("+", "%2B", "/", "%2F", "=", "%3D").Replace(s), nil
}

// Downstream bodies (§5).

type connectedBody struct {
	WSID      string `json:"wsid"`
	Timestamp int64  `json:"timestamp"`
}

type pokeStartBody struct {
	PokeID     string  `json:"pokeID"`
	BaseCookie *string `json:"baseCookie"`
}

type queryPatch struct {
	Op   string `json:"op"`
	Hash string `json:"hash"`
}

type pokePartBody struct {
	PokeID                string                  `json:"pokeID"`
	LastMutationIDChanges map[string]float64      `json:"lastMutationIDChanges,omitempty"`
	DesiredQueriesPatches map[string][]queryPatch `json:"desiredQueriesPatches,omitempty"`
	GotQueriesPatch       []queryPatch            `json:"gotQueriesPatch,omitempty"`
	MutationsPatch        []json.RawMessage       `json:"mutationsPatch,omitempty"`
	RowsPatch             []rowPatch              `json:"rowsPatch,omitempty"`
}

type pokeEndBody struct {
	PokeID string `json:"pokeID"`
	Cookie string `json:"cookie"`
}

// encodeFrame encodes a downstream message. Only row values can fail to
// encode (a NaN from the replica).
func encodeFrame(tag string, body any) ([]byte, error) {
	b, err := json.Marshal([]any{tag, body})
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", tag, err)
	}
	return b, nil
}
