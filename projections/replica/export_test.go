package replica

// StoredForTest is what the applier assumes a column declared decl holds
// after v is written to it.
func StoredForTest(decl string, v any) (any, bool) { return affinityOf(decl).stored(v) }
