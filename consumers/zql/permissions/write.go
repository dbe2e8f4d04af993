package permissions

import "github.com/jetsync/jetsync/consumers/zql"

// Write phases and actions of zero-cache's write rules.
const (
	PreMutation  = "preMutation"
	PostMutation = "postMutation"
)

// writeRules are one table's write policies: the row's and each cell's.
type writeRules struct {
	row   writePolicies
	cells map[string]writePolicies
}

type writePolicies struct {
	insert, updatePre, updatePost, delete policy
	// has* tell an absent policy (deny) from an empty one (deny too); both
	// deny, but keeping them apart keeps the cell logic readable.
	hasInsert, hasUpdatePre, hasUpdatePost, hasDelete bool
}

func newWritePolicies(a assetRules) writePolicies {
	w := writePolicies{insert: a.Insert, delete: a.Delete, hasInsert: a.Insert != nil, hasDelete: a.Delete != nil}
	if a.Update != nil {
		w.updatePre, w.hasUpdatePre = a.Update.PreMutation, a.Update.PreMutation != nil
		w.updatePost, w.hasUpdatePost = a.Update.PostMutation, a.Update.PostMutation != nil
	}
	return w
}

// WritePolicies returns the policies a write must pass, as zero-cache's write
// authorizer applies them: action is insert, update or delete; an insert is
// checked only postMutation, a delete only preMutation, an update in both.
// Each policy is a list of conditions, with authData bound, any one of which
// allows; a nil or empty policy denies. The row's policy comes first (nil
// when the table has none: a table without a rule denies); then the policy
// of every cell that has one for the action, skipping, for an update, the
// columns the update does not set.
func (p *Rules) WritePolicies(table, action, phase string, sets func(column string) bool, authData map[string]any) [][]zql.Condition {
	w := p.writes[table]
	pick := func(wp writePolicies) (policy, bool) {
		switch {
		case action == "insert" && phase == PostMutation:
			return wp.insert, wp.hasInsert
		case action == "update" && phase == PreMutation:
			return wp.updatePre, wp.hasUpdatePre
		case action == "update" && phase == PostMutation:
			return wp.updatePost, wp.hasUpdatePost
		case action == "delete" && phase == PreMutation:
			return wp.delete, wp.hasDelete
		}
		return nil, false
	}
	bind := func(pol policy) []zql.Condition {
		out := make([]zql.Condition, len(pol))
		for i, r := range pol {
			out[i] = bindCond(r.cond, authData)
		}
		return out
	}
	var out [][]zql.Condition
	row, _ := pick(w.row)
	out = append(out, bind(row))
	for col, cp := range w.cells {
		if action == "update" && !sets(col) {
			continue
		}
		if pol, ok := pick(cp); ok {
			out = append(out, bind(pol))
		}
	}
	return out
}

// Raw is the rules' deployed JSON text ("" when none are deployed).
func (p *Rules) Raw() string { return p.raw }
