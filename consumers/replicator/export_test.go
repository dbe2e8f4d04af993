package replicator

import "database/sql"

// SetOpenHook makes Run hand the writer's database to f as it opens it,
// until the returned func restores the previous hook.
func SetOpenHook(f func(*sql.DB)) (restore func()) {
	old := testOpenHook
	testOpenHook = f
	return func() { testOpenHook = old }
}
