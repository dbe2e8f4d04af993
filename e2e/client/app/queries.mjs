// Copied from testdata/spec/transcripts/app (only comments differ): the app the
// reference transcripts were captured with.
// Query definitions used in the transcripts (@rocicorp/zero 1.9.0, plain ESM).
//
// Each shape is written once, as a function of a ZQL builder, and used in two ways:
//   * synced ("custom") query: `queries.<name>(args)` -> on the wire only
//     {op:"put", hash, name, args:[args], ttl}; zero-cache asks the app's
//     ZERO_QUERY_URL endpoint for the AST. That endpoint answers with
//     `handleQueryRequest` from '@rocicorp/zero/server' and the handler
//     `(name, args) => mustGetQuery(queries, name).fn({args, ctx})`.
//   * legacy ad-hoc query: `shapes.<name>(z.query, args)` -> the AST itself goes on
//     the wire ({op:"put", hash, ast, ttl}); zero-cache checks it against the
//     deployed permissions (./permissions.json).
// A transcript note such as `legacy openByModified {"limit":3}` names the shape and its args.
import {createBuilder, defineQueries, defineQuery} from '@rocicorp/zero';
import {schema} from './schema.mjs';

export const shapes = {
  // where + orderBy + limit, plus a one-to-one `related`
  openByModified: (q, {limit = 50} = {}) =>
    q.issue.where('open', true).orderBy('modified', 'desc').limit(limit)
      .related('owner'),
  // one row (.one() -> limit 1) with a one-to-many `related` and a nested orderBy
  issueWithComments: (q, {id}) =>
    q.issue.where('id', id).related('comments', c => c.orderBy('created', 'asc')).one(),
  // many-to-many through the junction table
  issuesWithLabels: (q, {limit = 30} = {}) =>
    q.issue.orderBy('id', 'asc').limit(limit).related('labels'),
  // whereExists through the junction
  issuesWithLabel: (q, {labelID, limit = 40}) =>
    q.issue.whereExists('labels', l => l.where('id', labelID))
      .orderBy('modified', 'desc').limit(limit),
  // `or` condition
  closedOrOwnedBy: (q, {ownerID, limit = 60}) =>
    q.issue.where(({or, cmp}) => or(cmp('open', false), cmp('owner_id', ownerID)))
      .orderBy('id', 'asc').limit(limit),
  // cursor pagination: start after a row (exclusive)
  pageAfter: (q, {after, limit = 25}) => {
    const base = q.issue.orderBy('modified', 'desc');
    return (after ? base.start(after) : base).limit(limit);
  },
  // `IN` list
  issuesByIDs: (q, {ids}) => q.issue.where('id', 'IN', ids),
  // a whole table
  allIssues: q => q.issue.orderBy('id', 'asc'),
  // per-owner list
  issuesOfOwner: (q, {ownerID, limit = 100}) =>
    q.issue.where('owner_id', ownerID).orderBy('modified', 'desc').limit(limit),
  commentsOfIssue: (q, {issueID}) =>
    q.comment.where('issue_id', issueID).orderBy('created', 'asc'),
  labelsAll: q => q.label.orderBy('id', 'asc'),
};

const zql = createBuilder(schema);

// Synced (custom) queries: the names on the wire are the keys of `shapes`.
export const queries = defineQueries(
  Object.fromEntries(
    Object.entries(shapes).map(([name, fn]) => [
      name,
      defineQuery(({args}) => fn(zql, args ?? {})),
    ]),
  ),
);

/**
 * The query for `shape` as a synced ('custom') or a 'legacy' query, ready for
 * `z.materialize(query, {ttl})` on a Zero instance `z` created with `schema`.
 */
export function buildQuery(z, mode, shape, args) {
  if (mode === 'legacy') return shapes[shape](z.query, args ?? {});
  return queries[shape](args ?? {});
}
