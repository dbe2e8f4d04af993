package replica

// StoredForTest is what the applier assumes a column declared decl holds
// after v is written to it.
func StoredForTest(decl string, v any) (any, bool) { return affinityOf(decl).stored(v) }

// StmtsPrepared is how many statements a has prepared for one transaction
// alone.
func StmtsPrepared(a *Applier) int { return a.stmts.prepared }
