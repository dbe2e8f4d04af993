// The Zero schema of the demo upstream (cmd/jetsync/demo.sql). Column and
// table names are the Postgres ones, so no name mapping is involved.
import {boolean, createSchema, number, relationships, string, table} from '@rocicorp/zero';

const user = table('user').columns({id: string(), name: string()}).primaryKey('id');

const issue = table('issue')
  .columns({
    id: string(),
    title: string(),
    open: boolean(),
    modified: number(),
    owner_id: string().optional(),
    created: number(), // timestamptz, as epoch milliseconds
  })
  .primaryKey('id');

const comment = table('comment')
  .columns({id: string(), issue_id: string(), body: string(), created: number()})
  .primaryKey('id');

const label = table('label').columns({id: string(), name: string()}).primaryKey('id');

const issueLabel = table('issue_label')
  .columns({issue_id: string(), label_id: string()})
  .primaryKey('issue_id', 'label_id');

const issueRelationships = relationships(issue, ({one, many}) => ({
  owner: one({sourceField: ['owner_id'], destField: ['id'], destSchema: user}),
  comments: many({sourceField: ['id'], destField: ['issue_id'], destSchema: comment}),
  labels: many(
    {sourceField: ['id'], destField: ['issue_id'], destSchema: issueLabel},
    {sourceField: ['label_id'], destField: ['id'], destSchema: label},
  ),
}));

export const schema = createSchema({
  tables: [user, issue, comment, label, issueLabel],
  relationships: [issueRelationships],
  // The page reads with ad-hoc ZQL (jetsync runs it under the demo's read
  // permissions) and writes through custom mutators only.
  enableLegacyQueries: true,
  enableLegacyMutators: false,
});

export type Schema = typeof schema;
