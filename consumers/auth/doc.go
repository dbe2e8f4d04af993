// Package auth is the view-syncer's authentication: it verifies a
// connection's JWT (a shared secret, a JSON Web Key, or a JSON Web Key Set
// fetched, cached and refetched on rotation) as zero-cache does with jose,
// and keeps a client group's per-connection auth state and its auth
// maintenance schedule: zero-cache's connection context manager
// (docs/protocol.md §13).
//
// A Manager is a state machine with an injected Clock. It performs no I/O:
// revalidation, retransformation and failing a client are Effects that the
// view-syncer implements, and the Manager calls them outside its own lock.
// The Manager arms at most one maintenance timer, at the earliest deadline,
// and re-arms it after every operation.
package auth
