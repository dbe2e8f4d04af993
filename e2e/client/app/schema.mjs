// Copied from testdata/spec/transcripts/app (only comments differ): the app the
// reference transcripts were captured with.
// Zero client schema of the app the transcripts were captured with
// (@rocicorp/zero 1.9.0, plain ESM: no TypeScript loader needed).
//
// Table and column names are exactly those of the upstream Postgres tables
// (testdata/bench/schema.sql), so no client <-> server name mapping is involved.
//
// Exports:
//   schema       passed to `new Zero({schema, ...})`; the client sends it as
//                `clientSchema` in initConnection when it has no baseCookie.
//   permissions  the legacy permission rules (deprecated in 1.x, still supported).
//                `zero-deploy-permissions --schema-path ./schema.mjs` compiles them
//                into ./permissions.json and stores that in `<appID>.permissions`
//                upstream. zero-cache ANDs the `select` rules into every legacy
//                (ad-hoc AST) query; a table without a rule returns no rows.
//                Synced (custom) queries ignore them.
import {
  createSchema, table, string, number, boolean, relationships,
  definePermissions, ANYONE_CAN,
} from '@rocicorp/zero';

const user = table('user')
  .columns({id: string(), name: string()})
  .primaryKey('id');

const issue = table('issue')
  .columns({
    id: string(),
    title: string(),
    open: boolean(),
    modified: number(),              // double precision
    owner_id: string().optional(),   // nullable
    created: number(),               // timestamptz, travels as epoch milliseconds
  })
  .primaryKey('id');

const comment = table('comment')
  .columns({id: string(), issue_id: string(), body: string(), created: number()})
  .primaryKey('id');

const label = table('label')
  .columns({id: string(), name: string()})
  .primaryKey('id');

const issueLabel = table('issue_label')
  .columns({issue_id: string(), label_id: string()})
  .primaryKey('issue_id', 'label_id');

const issueRelationships = relationships(issue, ({one, many}) => ({
  owner: one({sourceField: ['owner_id'], destField: ['id'], destSchema: user}),
  comments: many({sourceField: ['id'], destField: ['issue_id'], destSchema: comment}),
  // many-to-many through the issue_label junction (two hops; the first is hidden)
  labels: many(
    {sourceField: ['id'], destField: ['issue_id'], destSchema: issueLabel},
    {sourceField: ['label_id'], destField: ['id'], destSchema: label},
  ),
}));

const commentRelationships = relationships(comment, ({one}) => ({
  issue: one({sourceField: ['issue_id'], destField: ['id'], destSchema: issue}),
}));

const userRelationships = relationships(user, ({many}) => ({
  issues: many({sourceField: ['id'], destField: ['owner_id'], destSchema: issue}),
}));

export const schema = createSchema({
  tables: [user, issue, comment, label, issueLabel],
  relationships: [issueRelationships, commentRelationships, userRelationships],
  // Without this, z.query.* runs only on the client and is never sent to the server.
  enableLegacyQueries: true,
  // Writes go through the custom mutators (./mutators.mjs, ZERO_MUTATE_URL); no CRUD mutators.
  enableLegacyMutators: false,
});

export const permissions = definePermissions(schema, () => ({
  user: {row: {select: ANYONE_CAN}},
  issue: {row: {select: ANYONE_CAN}},
  comment: {row: {select: ANYONE_CAN}},
  label: {row: {select: ANYONE_CAN}},
  issue_label: {row: {select: ANYONE_CAN}},
}));
