// Package permissions is zero-cache's legacy read rules, deployed in
// <app>.permissions (docs/query-ast.md §1): their parsing, their injection
// into a query's AST with the connection's claims bound in, the hash that
// tells a changed transformation, and their loading from a replica.
package permissions

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"

	"github.com/jetsync/jetsync/consumers/zql"
)

// Rules are the legacy read rules deployed in <app>.permissions
// (docs/query-ast.md §1), as of one replica snapshot. They are immutable and
// shared by every snapshot that has the same text, so pipelines tell a rule
// change by pointer.
type Rules struct {
	// raw is the replicated JSON text; "" when none are deployed.
	raw string
	// selects holds each table's row.select conditions; a table that is
	// missing, or has an empty list, denies every row.
	selects map[string][]zql.Condition
	// writes holds each table's write policies (write.go).
	writes map[string]writeRules
}

// None is what the server enforces while nothing is deployed: every table
// denies. Load returns this very pointer whenever nothing is deployed.
var None = &Rules{selects: map[string][]zql.Condition{}, writes: map[string]writeRules{}}

// permissionsConfig is the compiled rules' JSON schema
// (zero-schema/src/compiled-permissions.ts), decoded strictly.
type permissionsConfig struct {
	Tables map[string]tableRules `json:"tables"`
}

type tableRules struct {
	Row  *assetRules           `json:"row"`
	Cell map[string]assetRules `json:"cell"`
}

type assetRules struct {
	Select policy `json:"select"`
	Insert policy `json:"insert"`
	Update *struct {
		PreMutation  policy `json:"preMutation"`
		PostMutation policy `json:"postMutation"`
	} `json:"update"`
	Delete policy `json:"delete"`
}

type policy []rule

// rule is ["allow", condition].
type rule struct{ cond zql.Condition }

func (r *rule) UnmarshalJSON(b []byte) error {
	var parts []json.RawMessage
	if err := json.Unmarshal(b, &parts); err != nil {
		return err
	}
	if len(parts) != 2 {
		return errors.New("a rule is [\"allow\", condition]")
	}
	var kind string
	if err := json.Unmarshal(parts[0], &kind); err != nil || kind != "allow" {
		return fmt.Errorf("rule kind %s is not \"allow\"", parts[0])
	}
	return strictDecode(parts[1], &r.cond)
}

func strictDecode(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}

// Parse parses the replicated text of <app>.permissions.
func Parse(raw string) (*Rules, error) {
	var cfg permissionsConfig
	if err := strictDecode([]byte(raw), &cfg); err != nil {
		// Worded as zero-cache's, since clients see it in an Internal error.
		return nil, fmt.Errorf("Could not parse upstream permissions: '%s'. This may happen if Permissions with a new internal format are deployed before the supporting server has been fully rolled out: %w",
			truncate(raw, 100), err)
	}
	p := &Rules{raw: raw, selects: map[string][]zql.Condition{}, writes: map[string]writeRules{}}
	for table, tr := range cfg.Tables {
		w := writeRules{cells: map[string]writePolicies{}}
		for col, a := range tr.Cell {
			w.cells[col] = newWritePolicies(a)
		}
		if tr.Row != nil {
			w.row = newWritePolicies(*tr.Row)
		}
		p.writes[table] = w
		if tr.Row == nil {
			continue
		}
		conds := make([]zql.Condition, len(tr.Row.Select))
		for i, r := range tr.Row.Select {
			conds[i] = r.cond
		}
		p.selects[table] = conds
	}
	return p, nil
}

// Load reads the rules from table at tx's snapshot, reusing prev when the
// text has not changed. A replica without the table (replicated false) has
// none deployed.
func Load(ctx context.Context, tx *sql.Tx, table string, replicated bool, prev *Rules) (*Rules, error) {
	if !replicated {
		return None, nil
	}
	var raw sql.NullString
	err := tx.QueryRowContext(ctx, `SELECT "permissions" FROM "`+table+`" LIMIT 1`).Scan(&raw)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return None, nil
	case err != nil:
		return nil, fmt.Errorf("load permissions: %w", err)
	case !raw.Valid || raw.String == "null":
		return None, nil
	case prev != nil && prev.raw == raw.String:
		return prev, nil
	}
	return Parse(raw.String)
}

// Transform injects the read rules into a legacy AST and binds the rules'
// authData parameters to the connection's claims (docs/query-ast.md §1). It
// returns a new AST; a's nodes are not modified.
func (p *Rules) Transform(a *zql.AST, authData map[string]any) *zql.AST {
	out := p.node(a)
	bindAST(out, authData)
	return out
}

// node ANDs the table's select policy into one (sub)query and recurses into
// its relationships and the subqueries of its where.
func (p *Rules) node(a *zql.AST) *zql.AST {
	n := *a
	rules := p.selects[a.Table]
	policy := zql.Condition{Type: zql.CondOr, Conditions: cloneConds(rules)}
	parts := make([]zql.Condition, 0, 2)
	if a.Where != nil {
		parts = append(parts, p.cond(*a.Where))
	}
	parts = append(parts, policy)
	w := simplify(zql.Condition{Type: zql.CondAnd, Conditions: parts})
	n.Where = &w
	if a.Related != nil {
		n.Related = make([]zql.CorrelatedSubquery, len(a.Related))
		for i, r := range a.Related {
			r.Subquery = p.node(r.Subquery)
			n.Related[i] = r
		}
	}
	return &n
}

// cond transforms the client's where: every EXISTS subquery gets its
// table's rules, so that EXISTS cannot reveal unreadable rows.
func (p *Rules) cond(c zql.Condition) zql.Condition {
	switch c.Type {
	case zql.CondAnd, zql.CondOr:
		subs := make([]zql.Condition, len(c.Conditions))
		for i, s := range c.Conditions {
			subs[i] = p.cond(s)
		}
		c.Conditions = subs
	case zql.CondCorrelated:
		r := *c.Related
		r.Subquery = p.node(r.Subquery)
		c.Related = &r
	}
	return c
}

// cloneConds deep-copies rule conditions, so that binding one query never
// touches the shared rules.
func cloneConds(cs []zql.Condition) []zql.Condition {
	if cs == nil {
		return []zql.Condition{}
	}
	b, _ := json.Marshal(cs)
	var out []zql.Condition
	_ = json.Unmarshal(b, &out)
	if out == nil {
		out = []zql.Condition{}
	}
	return out
}

func isTrue(c zql.Condition) bool  { return c.Type == zql.CondAnd && len(c.Conditions) == 0 }
func isFalse(c zql.Condition) bool { return c.Type == zql.CondOr && len(c.Conditions) == 0 }

// simplify is zero's simplifyCondition: one-member
// and/or unwrap, same-type members flatten one level, and FALSE in an and
// or TRUE in an or decides it.
func simplify(c zql.Condition) zql.Condition {
	if c.Type != zql.CondAnd && c.Type != zql.CondOr {
		return c
	}
	if len(c.Conditions) == 1 {
		return simplify(c.Conditions[0])
	}
	members := []zql.Condition{}
	for _, m := range c.Conditions {
		s := simplify(m)
		if s.Type == c.Type {
			members = append(members, s.Conditions...)
		} else {
			members = append(members, s)
		}
	}
	for _, m := range members {
		if c.Type == zql.CondAnd && isFalse(m) {
			return zql.Condition{Type: zql.CondOr, Conditions: []zql.Condition{}}
		}
		if c.Type == zql.CondOr && isTrue(m) {
			return zql.Condition{Type: zql.CondAnd, Conditions: []zql.Condition{}}
		}
	}
	return zql.Condition{Type: c.Type, Conditions: members}
}

// bindAST replaces every static parameter in a (which transform copied)
// with a literal from authData.
func bindAST(a *zql.AST, authData map[string]any) {
	if a.Where != nil {
		w := bindCond(*a.Where, authData)
		a.Where = &w
	}
	for i := range a.Related {
		sub := *a.Related[i].Subquery
		bindAST(&sub, authData)
		a.Related[i].Subquery = &sub
	}
}

func bindCond(c zql.Condition, authData map[string]any) zql.Condition {
	switch c.Type {
	case zql.CondAnd, zql.CondOr:
		subs := make([]zql.Condition, len(c.Conditions))
		for i, s := range c.Conditions {
			subs[i] = bindCond(s, authData)
		}
		c.Conditions = subs
	case zql.CondCorrelated:
		r := *c.Related
		sub := *r.Subquery
		bindAST(&sub, authData)
		r.Subquery = &sub
		c.Related = &r
	case zql.CondSimple:
		bound := false
		if c.Left != nil && c.Left.Type == "static" {
			c.Left, bound = staticValue(c.Left, authData), true
		}
		if c.Right != nil && c.Right.Type == "static" {
			c.Right, bound = staticValue(c.Right, authData), true
		}
		if bound && !comparable(c) {
			// A claim of a shape the comparison cannot take (a list for
			// =, null or an object for IN) matches no row in zero either.
			return zql.Condition{Type: zql.CondOr, Conditions: []zql.Condition{}}
		}
	}
	return c
}

// staticValue resolves a static parameter: authData's field, or the path
// of nested fields; anything missing, and every preMutationRow, is null.
func staticValue(v *zql.ValuePosition, authData map[string]any) *zql.ValuePosition {
	var val any
	if v.Anchor == "authData" {
		var path []string
		switch f := v.Field.(type) {
		case string:
			path = []string{f}
		case []any:
			for _, s := range f {
				str, _ := s.(string)
				path = append(path, str)
			}
		}
		var cur any = authData
		for _, step := range path {
			m, ok := cur.(map[string]any)
			if !ok {
				cur = nil
				break
			}
			cur = m[step]
		}
		val = cur
	}
	return &zql.ValuePosition{Type: "literal", Value: val}
}

// comparable reports whether a bound simple condition is one zql accepts.
func comparable(c zql.Condition) bool {
	if c.Left.Type == "literal" {
		if !scalar(c.Left.Value) {
			return false
		}
	}
	switch c.Op {
	case "IN", "NOT IN":
		list, ok := c.Right.Value.([]any)
		if !ok {
			return false
		}
		for _, e := range list {
			if e == nil || !scalar(e) {
				return false
			}
		}
		return true
	case "LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE":
		if _, ok := c.Right.Value.(string); !ok && c.Right.Value != nil {
			return false
		}
	}
	return scalar(c.Right.Value)
}

func scalar(v any) bool {
	switch x := v.(type) {
	case nil, string, bool:
		return true
	case float64:
		return !math.IsNaN(x) && !math.IsInf(x, 0)
	}
	return false
}

// TransformationHash identifies a bound transformed AST. Unlike zero's
// hashOfAST it keeps TRUE and FALSE apart, so an unchanged hash really
// means an unchanged result.
func TransformationHash(a *zql.AST) string {
	b, _ := json.Marshal(a)
	h := fnv.New64a()
	_, _ = h.Write(b)
	return strconv.FormatUint(h.Sum64(), 36)
}

// truncate cuts s to at most n bytes; a character the cut splits goes.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
