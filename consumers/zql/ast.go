// Package zql runs Zero query ASTs (docs/query-ast.md)
// against a jetsync SQLite replica and computes the rows zero-cache 1.9.0
// would sync for them: the result tree (root rows, related rows, hidden
// junction rows), EXISTS witnesses and scalar-subquery companions.
//
// The engine is an evaluator in Go that pulls rows from SQLite with simple
// queries (one per table and correlation key, or one per table when no
// index serves the key). SQLite only pre-filters and sorts; every condition
// is re-checked in Go, so that zero's semantics (null handling, strict
// equality, LIKE escapes) hold whatever SQLite's type affinities do.
//
// Compile turns an AST into an immutable Query; Query.Hydrate evaluates it
// against a snapshot. All per-evaluation state (memoized lookups, resolved
// scalar subqueries, the rows reached) lives in one hydration and is dropped
// with it. A View (view.go) keeps a query's result across snapshots and
// updates it from the replica's changed rows, re-reading only what they
// can affect.
package zql

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// AST mirrors the wire form of a Zero query (docs/query-ast.md §2).
type AST struct {
	Schema  string               `json:"schema,omitempty"`
	Table   string               `json:"table"`
	Alias   string               `json:"alias,omitempty"`
	Where   *Condition           `json:"where,omitempty"`
	Related []CorrelatedSubquery `json:"related,omitempty"`
	Start   *Bound               `json:"start,omitempty"`
	Limit   *int                 `json:"limit,omitempty"`
	OrderBy []Ordering           `json:"orderBy,omitempty"`
}

// Ordering is one orderBy entry, ["column", "asc"|"desc"] on the wire.
type Ordering struct {
	Column string
	Desc   bool
}

// MarshalJSON writes the wire pair.
func (o Ordering) MarshalJSON() ([]byte, error) {
	dir := "asc"
	if o.Desc {
		dir = "desc"
	}
	return json.Marshal([2]string{o.Column, dir})
}

// UnmarshalJSON reads the wire pair strictly: two strings, asc or desc.
func (o *Ordering) UnmarshalJSON(b []byte) error {
	var parts []string
	if err := json.Unmarshal(b, &parts); err != nil {
		return fmt.Errorf("orderBy entry %s: %w", b, err)
	}
	if len(parts) != 2 {
		return fmt.Errorf("orderBy entry %s: want [column, direction]", b)
	}
	switch parts[1] {
	case "asc":
		o.Desc = false
	case "desc":
		o.Desc = true
	default:
		return fmt.Errorf("orderBy entry %s: direction %q is not asc or desc", b, parts[1])
	}
	o.Column = parts[0]
	return nil
}

// Bound is a start cursor: rows after Row in the completed ordering, or at
// or after it when Exclusive is false.
type Bound struct {
	Row       map[string]any `json:"row"`
	Exclusive bool           `json:"exclusive"`
}

// Condition types.
const (
	CondSimple     = "simple"
	CondAnd        = "and"
	CondOr         = "or"
	CondCorrelated = "correlatedSubquery"
)

// Condition is a where clause node: a simple comparison, an and/or of
// conditions, or an EXISTS / NOT EXISTS over a correlated subquery.
type Condition struct {
	Type string `json:"type"`
	// Simple.
	Left  *ValuePosition `json:"left,omitempty"`
	Right *ValuePosition `json:"right,omitempty"`
	// Op is the simple operator, or EXISTS / NOT EXISTS.
	Op string `json:"op,omitempty"`
	// And, or.
	Conditions []Condition `json:"conditions,omitempty"`
	// Correlated subquery.
	Related *CorrelatedSubquery `json:"related,omitempty"`
	Flip    *bool               `json:"flip,omitempty"`
	Scalar  *bool               `json:"scalar,omitempty"`
}

// ValuePosition is an operand: a column of the enclosing table, a literal,
// or a static parameter (which must be bound before execution).
type ValuePosition struct {
	Type   string `json:"type"`
	Name   string `json:"name,omitempty"`
	Value  any    `json:"value,omitempty"`
	Anchor string `json:"anchor,omitempty"`
	Field  any    `json:"field,omitempty"`
}

// MarshalJSON keeps a literal's value even when it is null or false.
func (v ValuePosition) MarshalJSON() ([]byte, error) {
	switch v.Type {
	case "literal":
		return json.Marshal(struct {
			Type  string `json:"type"`
			Value any    `json:"value"`
		}{v.Type, v.Value})
	case "column":
		return json.Marshal(struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}{v.Type, v.Name})
	}
	type plain ValuePosition
	return json.Marshal(plain(v))
}

// Correlation joins parent and child positionally.
type Correlation struct {
	ParentField []string `json:"parentField"`
	ChildField  []string `json:"childField"`
}

// CorrelatedSubquery is a relationship hop, in related or inside EXISTS.
type CorrelatedSubquery struct {
	Correlation Correlation `json:"correlation"`
	Subquery    *AST        `json:"subquery"`
	Hidden      bool        `json:"hidden,omitempty"`
	// System is "client" (the default), "permissions" or "test". Rows
	// reached through "permissions" are never synced.
	System string `json:"system,omitempty"`
}

// SystemPermissions marks subqueries injected by permission rules.
const SystemPermissions = "permissions"

// Simple operators.
var simpleOps = map[string]bool{
	"=": true, "!=": true, "<": true, "<=": true, ">": true, ">=": true,
	"IS": true, "IS NOT": true, "IN": true, "NOT IN": true,
	"LIKE": true, "NOT LIKE": true, "ILIKE": true, "NOT ILIKE": true,
}

// ErrInvalidAST is wrapped by every error about an AST's shape or its
// references to the schema.
var ErrInvalidAST = errors.New("invalid AST")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidAST, fmt.Sprintf(format, args...))
}

// Refusal is an AST that is well formed but that Compile cannot run: it
// names a table or column the schema lacks, or asks for what zero's engine
// refuses. zero-cache fails such a query when it hydrates it, with an
// Internal error; Message is the message it sends, where it has one of
// its own. A Refusal is an ErrInvalidAST too.
type Refusal struct{ Message string }

func (r *Refusal) Error() string { return r.Message }

// Is reports whether target is ErrInvalidAST.
func (r *Refusal) Is(target error) bool { return target == ErrInvalidAST }

func refuse(format string, args ...any) error {
	return &Refusal{Message: fmt.Sprintf(format, args...)}
}

// ParseAST decodes and validates the structure of a wire AST. References to
// tables and columns are checked by Compile, which knows the schema.
func ParseAST(b []byte) (*AST, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	var a AST
	if err := d.Decode(&a); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidAST, err)
	}
	if d.More() {
		return nil, invalid("trailing data after the AST")
	}
	if err := a.validate(true); err != nil {
		return nil, err
	}
	return &a, nil
}

// validate checks what can be checked without a schema.
func (a *AST) validate(root bool) error {
	if a.Table == "" {
		return invalid("missing table")
	}
	if !root && a.Alias == "" {
		return invalid("subquery on %s has no alias", a.Table)
	}
	if a.Limit != nil && *a.Limit < 0 {
		return invalid("%s: negative limit %d", a.Table, *a.Limit)
	}
	for _, o := range a.OrderBy {
		if o.Column == "" {
			return invalid("%s: empty orderBy column", a.Table)
		}
	}
	if a.Start != nil {
		if a.Start.Row == nil {
			return invalid("%s: start without row", a.Table)
		}
	}
	for i := range a.Related {
		if err := a.Related[i].validate(a.Table); err != nil {
			return err
		}
	}
	if a.Where != nil {
		return a.Where.validate(a.Table)
	}
	return nil
}

func (c *CorrelatedSubquery) validate(table string) error {
	p, ch := c.Correlation.ParentField, c.Correlation.ChildField
	if len(p) == 0 || len(p) != len(ch) {
		return invalid("%s: correlation needs parentField and childField of the same non-zero length", table)
	}
	switch c.System {
	case "", "client", SystemPermissions, "test":
	default:
		return invalid("%s: unknown system %q", table, c.System)
	}
	if c.Subquery == nil {
		return invalid("%s: correlated subquery without subquery", table)
	}
	return c.Subquery.validate(false)
}

func (c *Condition) validate(table string) error {
	switch c.Type {
	case CondAnd, CondOr:
		for i := range c.Conditions {
			if err := c.Conditions[i].validate(table); err != nil {
				return err
			}
		}
		return nil
	case CondCorrelated:
		if c.Op != "EXISTS" && c.Op != "NOT EXISTS" {
			return invalid("%s: correlated subquery operator %q", table, c.Op)
		}
		if c.Related == nil {
			return invalid("%s: %s without related", table, c.Op)
		}
		return c.Related.validate(table)
	case CondSimple:
	default:
		return invalid("%s: condition type %q", table, c.Type)
	}
	if !simpleOps[c.Op] {
		return invalid("%s: operator %q", table, c.Op)
	}
	if c.Left == nil || c.Right == nil {
		return invalid("%s: %s needs left and right", table, c.Op)
	}
	if err := c.Left.validate(table); err != nil {
		return err
	}
	if err := c.Right.validate(table); err != nil {
		return err
	}
	if c.Right.Type == "column" {
		return invalid("%s: %s has a column on the right", table, c.Op)
	}
	if c.Left.Type == "literal" {
		if _, isList := c.Left.Value.([]any); isList {
			return invalid("%s: a list on the left of %s", table, c.Op)
		}
	}
	list, isList := c.Right.Value.([]any)
	switch c.Op {
	case "IN", "NOT IN":
		if !isList {
			return invalid("%s: %s needs a list on the right", table, c.Op)
		}
		for _, v := range list {
			if v == nil {
				return invalid("%s: null in %s list", table, c.Op)
			}
		}
	default:
		if isList {
			return invalid("%s: a list on the right of %s", table, c.Op)
		}
	}
	switch c.Op {
	case "LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE":
		if p, ok := c.Right.Value.(string); ok {
			if _, err := compileLike(p, false); err != nil {
				return invalid("%s: %v", table, err)
			}
		} else if c.Right.Value != nil {
			return invalid("%s: %s pattern is not a string", table, c.Op)
		}
	}
	return nil
}

func (v *ValuePosition) validate(table string) error {
	switch v.Type {
	case "column":
		if v.Name == "" {
			return invalid("%s: column operand without name", table)
		}
	case "literal":
		if list, ok := v.Value.([]any); ok {
			for _, e := range list {
				if e != nil && !scalarLiteral(e) {
					return invalid("%s: list element %v is not a string, number or boolean", table, e)
				}
			}
		} else if !scalarLiteral(v.Value) {
			return invalid("%s: literal %v is not a string, number, boolean, null or list", table, v.Value)
		}
	case "static":
		return invalid("%s: static parameter %s.%v is not bound", table, v.Anchor, v.Field)
	default:
		return invalid("%s: operand type %q", table, v.Type)
	}
	return nil
}

func scalarLiteral(v any) bool {
	switch x := v.(type) {
	case nil, string, bool:
		return true
	case float64:
		return !math.IsNaN(x) && !math.IsInf(x, 0)
	}
	return false
}
