package pgrepl

// SetGroupCommit turns the change stream's group commit on or off, so that
// a test can compare the two on the same machine.
func SetGroupCommit(on bool) { groupCommit = on }
