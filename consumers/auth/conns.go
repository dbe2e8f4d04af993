package auth

import (
	"errors"
	"time"
)

// Selector names one websocket. A record is returned only when both fields
// match, so a stale socket of a reconnected client never sees the new one's state.
type Selector struct {
	ClientID string
	WSID     string
}

// State is a connection's auth state.
type State int

const (
	// Provisional connections have not been validated at their current revision.
	Provisional State = iota
	// Validated connections may serve as the group's background connection.
	Validated
)

func (s State) String() string {
	if s == Validated {
		return "validated"
	}
	return "provisional"
}

// User is a connection's userID; the zero value is zero-cache's null (logged out).
type User struct {
	ID    string
	Valid bool
}

// UserOf returns the user with the given ID.
func UserOf(id string) User { return User{ID: id, Valid: true} }

func (u User) String() string {
	if !u.Valid {
		return "<null>"
	}
	return u.ID
}

// Conn is a snapshot of one connection's context. A is the caller's auth
// (token), Q and M its query and mutate contexts (URL, headers, cookie,
// origin). The Manager copies them by value and never looks inside, so they
// should be treated as immutable.
type Conn[A, Q, M any] struct {
	Selector
	State State
	// Revision grows with every initConnection and material auth change.
	// Results of async work are applied only for the revision they were
	// started with.
	Revision int
	User     User
	Auth     A
	Query    Q
	Mutate   M
	// RevalidateAt is the next periodic revalidation; zero unless validated
	// and revalidation is enabled.
	RevalidateAt time.Time
	// Order is the registration order; the newest validated connection
	// replaces a lost background connection.
	Order uint64
}

// Validation is the outcome of a successful auth check.
type Validation struct {
	// Server is zero-cache's "server-validated": the API server named the
	// caller's userID (UserID), which must equal the connection's. When false
	// ("client-fallback") the connection's own userID is trusted.
	Server bool
	UserID User
}

// Group is a snapshot of the group-level auth state.
type Group struct {
	// PinnedUser is set by the first successful validation and never changes.
	PinnedUser User
	Pinned     bool
	// Background is the validated connection used for shared work.
	Background    Selector
	HasBackground bool
	// RetransformAt is the next periodic background retransform (zero: none).
	RetransformAt time.Time
	// NotBefore defers all maintenance after a transient failure (zero: none).
	NotBefore time.Time
}

// Plan is the maintenance that is due now, and when to wake up next.
type Plan[A, Q, M any] struct {
	// DueRevalidations are the validated connections whose RevalidateAt has
	// passed, in registration order.
	DueRevalidations []Conn[A, Q, M]
	DueRetransform   bool
	// Earliest is the earliest outstanding deadline, including overdue ones,
	// pushed to at least NotBefore while a deferral lasts (zero: none).
	Earliest time.Time
}

// Kind is a kind of maintenance work, for Defer.
type Kind int

const (
	Revalidation Kind = iota
	Retransformation
)

// Error is a protocol error the Manager raises; Kind and Message are
// zero-cache's error kind and message, for the wire.
type Error struct {
	Kind    string
	Message string
}

func (e *Error) Error() string { return e.Kind + ": " + e.Message }

// Protocol error kinds (zero-protocol error-kind-enum).
const (
	KindUnauthorized             = "Unauthorized"
	KindInvalidConnectionRequest = "InvalidConnectionRequest"
)

var (
	// ErrPinnedUser refuses a connection whose user differs from the group's.
	ErrPinnedUser = &Error{KindUnauthorized, "Client groups are pinned to a single userID. Connection userID does not match existing client group userID."}
	// ErrServerUserMismatch refuses a server validation for another userID.
	ErrServerUserMismatch = &Error{KindUnauthorized, "Connection userID does not match validated server userID."}
	// ErrNoConnection reports a selector without a live record.
	ErrNoConnection = &Error{KindInvalidConnectionRequest, "Connection auth state was not available for this websocket."}
	// ErrNoBackground reports that no validated connection can do shared work.
	ErrNoBackground = &Error{KindInvalidConnectionRequest, "No validated connection is available for shared query work."}
)

// FailureKind classifies an error returned by an Effects method.
type FailureKind int

const (
	// AuthFailure: the credentials were rejected (Unauthorized,
	// AuthInvalidated, or TransformFailed/PushFailed with HTTP 401 or 403).
	AuthFailure FailureKind = iota + 1
	// TransientFailure: any other TransformFailed; maintenance is deferred.
	TransientFailure
)

// Failure wraps an Effects error with its classification.
type Failure struct {
	Kind FailureKind
	Err  error
}

func (f *Failure) Error() string { return f.Err.Error() }
func (f *Failure) Unwrap() error { return f.Err }

// AuthError marks err as an auth failure.
func AuthError(err error) error { return &Failure{Kind: AuthFailure, Err: err} }

// TransientError marks err as a transient failure.
func TransientError(err error) error { return &Failure{Kind: TransientFailure, Err: err} }

// IsAuthError reports whether err is an auth failure: marked by AuthError,
// or an Unauthorized Error from the Manager (such as ErrPinnedUser).
func IsAuthError(err error) bool {
	if f, ok := errors.AsType[*Failure](err); ok {
		return f.Kind == AuthFailure
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Kind == KindUnauthorized
	}
	return false
}

// IsTransientError reports whether err was marked by TransientError.
func IsTransientError(err error) bool {
	f, ok := errors.AsType[*Failure](err)
	return ok && f.Kind == TransientFailure
}
