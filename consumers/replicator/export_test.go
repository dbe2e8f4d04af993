package replicator

import "database/sql"

// SetOpenHook makes Run hand the writer's database to f as it opens it,
// until the returned func restores the previous hook.
func SetOpenHook(f func(*sql.DB)) (restore func()) {
	old := testOpenHook
	testOpenHook = f
	return func() { testOpenHook = old }
}

// SetKeepHook makes the consumer call f with the committed sequence when it
// keeps that commit's statements, until the returned func restores the
// previous hook.
func SetKeepHook(f func(seq uint64)) (restore func()) {
	old := testKeepHook
	testKeepHook = f
	return func() { testKeepHook = old }
}
