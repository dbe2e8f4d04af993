package mutagen

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/consumers/zql"
)

// query builds one SQL statement with numbered parameters.
type query struct {
	b    strings.Builder
	args []any
}

func (q *query) arg(v any) string {
	q.args = append(q.args, v)
	return fmt.Sprintf("$%d", len(q.args))
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

// rowMatches reports whether the row of table with pk's values matches any
// condition of policy, evaluated in Postgres in tx: zero-cache runs each
// policy as a query for the row with the conditions OR'ed into its where.
func rowMatchesSQL(table string, pk map[string]any, policy []zql.Condition) (string, []any, error) {
	q := &query{}
	alias := "t0"
	q.b.WriteString("SELECT 1 FROM " + qualified(table) + " AS " + alias + " WHERE ")
	q.pkWhere(pk, alias)
	q.b.WriteString(" AND (")
	if err := q.or(policy, alias, 0); err != nil {
		return "", nil, err
	}
	q.b.WriteString(") LIMIT 1")
	return q.b.String(), q.args, nil
}

// splitTable splits a Zero table name: "schema.table" outside public,
// "table" in it.
func splitTable(name string) (schema, table string) {
	if i := strings.IndexByte(name, '.'); i > 0 {
		return name[:i], name[i+1:]
	}
	return "public", name
}

// qualified is the Postgres name of a Zero table.
func qualified(name string) string {
	schema, table := splitTable(name)
	return ident(schema) + "." + ident(table)
}

func (q *query) or(conds []zql.Condition, alias string, depth int) error {
	if len(conds) == 0 {
		q.b.WriteString("FALSE")
		return nil
	}
	for i, c := range conds {
		if i > 0 {
			q.b.WriteString(" OR ")
		}
		q.b.WriteString("(")
		if err := q.cond(c, alias, depth); err != nil {
			return err
		}
		q.b.WriteString(")")
	}
	return nil
}

func (q *query) cond(c zql.Condition, alias string, depth int) error {
	switch c.Type {
	case zql.CondAnd:
		if len(c.Conditions) == 0 {
			q.b.WriteString("TRUE")
			return nil
		}
		for i, s := range c.Conditions {
			if i > 0 {
				q.b.WriteString(" AND ")
			}
			q.b.WriteString("(")
			if err := q.cond(s, alias, depth); err != nil {
				return err
			}
			q.b.WriteString(")")
		}
		return nil
	case zql.CondOr:
		return q.or(c.Conditions, alias, depth)
	case zql.CondSimple:
		return q.simple(c, alias)
	case zql.CondCorrelated:
		return q.exists(c, alias, depth)
	}
	return fmt.Errorf("unknown condition type %q", c.Type)
}

func (q *query) operand(v *zql.ValuePosition, alias string) (string, error) {
	if v == nil {
		return "", fmt.Errorf("missing operand")
	}
	switch v.Type {
	case "column":
		return alias + "." + ident(v.Name), nil
	case "literal":
		return q.arg(v.Value), nil
	}
	return "", fmt.Errorf("unbound operand of type %q", v.Type)
}

func (q *query) simple(c zql.Condition, alias string) error {
	left, err := q.operand(c.Left, alias)
	if err != nil {
		return err
	}
	if c.Right == nil {
		return fmt.Errorf("missing right operand")
	}
	// A literal compared with null matches nothing, as in zql; IS and IS
	// NOT are the comparisons that see null.
	switch c.Op {
	case "=", "!=", "<", ">", "<=", ">=", "LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE":
		right, err := q.operand(c.Right, alias)
		if err != nil {
			return err
		}
		op := c.Op
		if op == "!=" {
			op = "<>"
		}
		q.b.WriteString(left + " " + op + " " + right)
	case "IS", "IS NOT":
		right, err := q.operand(c.Right, alias)
		if err != nil {
			return err
		}
		if c.Op == "IS" {
			q.b.WriteString(left + " IS NOT DISTINCT FROM " + right)
		} else {
			q.b.WriteString(left + " IS DISTINCT FROM " + right)
		}
	case "IN", "NOT IN":
		list, ok := c.Right.Value.([]any)
		if c.Right.Type != "literal" || !ok {
			return fmt.Errorf("%s needs a literal list", c.Op)
		}
		if len(list) == 0 {
			if c.Op == "IN" {
				q.b.WriteString("FALSE")
			} else {
				q.b.WriteString("TRUE")
			}
			return nil
		}
		parts := make([]string, len(list))
		for i, e := range list {
			parts[i] = q.arg(e)
		}
		q.b.WriteString(left + " " + c.Op + " (" + strings.Join(parts, ", ") + ")")
	default:
		return fmt.Errorf("unknown operator %q", c.Op)
	}
	return nil
}

// exists renders a correlated subquery condition (EXISTS / NOT EXISTS) over
// the related table, correlated to alias's row.
func (q *query) exists(c zql.Condition, alias string, depth int) error {
	if c.Related == nil || c.Related.Subquery == nil {
		return fmt.Errorf("correlated subquery without a subquery")
	}
	sub := c.Related.Subquery
	corr := c.Related.Correlation
	if len(corr.ParentField) != len(corr.ChildField) || len(corr.ParentField) == 0 {
		return fmt.Errorf("bad correlation")
	}
	child := fmt.Sprintf("t%d", depth+1)
	switch c.Op {
	case "EXISTS":
		q.b.WriteString("EXISTS (")
	case "NOT EXISTS":
		q.b.WriteString("NOT EXISTS (")
	default:
		return fmt.Errorf("unknown subquery operator %q", c.Op)
	}
	q.b.WriteString("SELECT 1 FROM " + qualified(sub.Table) + " AS " + child + " WHERE ")
	for i := range corr.ParentField {
		if i > 0 {
			q.b.WriteString(" AND ")
		}
		q.b.WriteString(child + "." + ident(corr.ChildField[i]) + " = " + alias + "." + ident(corr.ParentField[i]))
	}
	if sub.Where != nil {
		q.b.WriteString(" AND (")
		if err := q.cond(*sub.Where, child, depth+1); err != nil {
			return err
		}
		q.b.WriteString(")")
	}
	q.b.WriteString(")")
	return nil
}
