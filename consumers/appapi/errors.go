package appapi

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Error kinds, origins and reasons of the bodies in docs/protocol.md §9.1.
const (
	KindTransformFailed = "TransformFailed"
	KindPushFailed      = "PushFailed"

	OriginServer    = "server"
	OriginZeroCache = "zeroCache"

	ReasonHTTP                   = "http"
	ReasonParse                  = "parse"
	ReasonInternal               = "internal"
	ReasonTimeout                = "timeout"
	ReasonDatabase               = "database"
	ReasonOutOfOrderMutation     = "oooMutation"
	ReasonUnsupportedPushVersion = "unsupportedPushVersion"
)

// MutationID names one mutation of one client.
type MutationID struct {
	ClientID string `json:"clientID"`
	ID       int64  `json:"id"`
}

// Failure is the failure of a whole request to the API server: the body of
// the TransformFailed or PushFailed error frame the client expects
// (docs/protocol.md §9.1). MarshalJSON writes that body, so the view-syncer
// sends ["error", failure] as it is.
//
// Failures that zero-cache makes itself have Origin "zeroCache" and a Reason
// of "http" (non-2xx after retries: Status and BodyPreview set), "parse" (a
// 2xx body that does not fit the schema) or "internal" (network failure after
// retries, a URL outside the allow-list, a configuration error). Failures the
// API server returns as its response body keep its origin and reason.
type Failure struct {
	Kind    string
	Origin  string
	Reason  string
	Message string
	// Status is the HTTP status, set with Reason "http".
	Status int
	// BodyPreview is the start of a non-2xx response's body (512 characters,
	// then "..."), nil when it could not be read.
	BodyPreview *string
	Details     json.RawMessage
	// QueryIDs (TransformFailed) or MutationIDs (PushFailed) list what the
	// request carried, or what the API server named in its failure body.
	QueryIDs    []string
	MutationIDs []MutationID
	// Err is the underlying cause, if any. It is not part of the body.
	Err error
}

func (f *Failure) Error() string {
	s := f.Kind + " (" + f.Reason
	if f.Reason == ReasonHTTP {
		s += fmt.Sprintf(" %d", f.Status)
	}
	return s + "): " + f.Message
}

func (f *Failure) Unwrap() error { return f.Err }

// Auth reports whether the failure is an auth failure: the API server
// answered 401 or 403 (zero-cache isAuthErrorBody). The client treats it as
// NeedsAuth, and the view-syncer fails only that connection.
func (f *Failure) Auth() bool {
	return f.Reason == ReasonHTTP && (f.Status == 401 || f.Status == 403)
}

// MarshalJSON writes the error body with the fields the client's schema
// requires for the kind: queryIDs for TransformFailed, mutationIDs for
// PushFailed, status and bodyPreview only with reason "http".
func (f *Failure) MarshalJSON() ([]byte, error) {
	type body struct {
		Kind        string          `json:"kind"`
		Origin      string          `json:"origin"`
		Reason      string          `json:"reason"`
		Status      *int            `json:"status,omitempty"`
		BodyPreview *string         `json:"bodyPreview,omitempty"`
		Message     string          `json:"message"`
		Details     json.RawMessage `json:"details,omitempty"`
		QueryIDs    *[]string       `json:"queryIDs,omitempty"`
		MutationIDs *[]MutationID   `json:"mutationIDs,omitempty"`
	}
	b := body{Kind: f.Kind, Origin: f.Origin, Reason: f.Reason, Message: f.Message, Details: f.Details}
	if f.Reason == ReasonHTTP {
		b.Status, b.BodyPreview = &f.Status, f.BodyPreview
	}
	switch f.Kind {
	case KindPushFailed:
		ids := f.MutationIDs
		if ids == nil {
			ids = []MutationID{}
		}
		b.MutationIDs = &ids
	default:
		ids := f.QueryIDs
		if ids == nil {
			ids = []string{}
		}
		b.QueryIDs = &ids
	}
	return json.Marshal(b)
}

// ByClient splits a PushFailed by the clients its MutationIDs name, as
// zero-cache fans a failed push out: each client gets the failure with its
// own mutation ids, and a client not named gets nothing.
func (f *Failure) ByClient() map[string]*Failure {
	out := map[string]*Failure{}
	for _, id := range f.MutationIDs {
		g, ok := out[id.ClientID]
		if !ok {
			c := *f
			c.MutationIDs = nil
			g = &c
			out[id.ClientID] = g
		}
		g.MutationIDs = append(g.MutationIDs, id)
	}
	return out
}

// IsAuth reports whether err is a Failure with HTTP status 401 or 403: the
// caller fails that connection (the client goes to NeedsAuth).
func IsAuth(err error) bool {
	var f *Failure
	return errors.As(err, &f) && f.Auth()
}

// IsTransient reports whether err is a Failure that is not an auth failure.
// zero-cache defers auth maintenance on any such TransformFailed (network,
// 5xx, parse, a server-reported failure) instead of failing the connection.
func IsTransient(err error) bool {
	var f *Failure
	return errors.As(err, &f) && !f.Auth()
}

// IsBadResponse reports whether err is a Failure because the API server's
// 2xx response did not fit the schema (reason "parse", origin zeroCache).
func IsBadResponse(err error) bool {
	var f *Failure
	return errors.As(err, &f) && f.Reason == ReasonParse && f.Origin == OriginZeroCache
}

func newFailure(kind, reason, message string, cause error) *Failure {
	return &Failure{Kind: kind, Origin: OriginZeroCache, Reason: reason, Message: message, Err: cause}
}
