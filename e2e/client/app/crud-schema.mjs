// The e2e app's schema with legacy CRUD mutators on, and write rules for
// them (zero-deploy-permissions --schema-path ./app/crud-schema.mjs):
//   issue    anyone inserts and deletes; an update needs the issue to be
//            the user's before (preMutation) and after (postMutation)
//   label    readable, with no write rule: every write is denied
import {definePermissions, ANYONE_CAN} from '@rocicorp/zero';
import {schema as base} from './schema.mjs';

export const schema = {...base, enableLegacyMutators: true};

const ownIssue = (authData, {cmp}) => cmp('owner_id', authData.sub);

export const permissions = definePermissions(schema, () => ({
  user: {row: {select: ANYONE_CAN}},
  issue: {
    row: {
      select: ANYONE_CAN,
      insert: ANYONE_CAN,
      update: {preMutation: [ownIssue], postMutation: [ownIssue]},
      delete: ANYONE_CAN,
    },
  },
  label: {row: {select: ANYONE_CAN}},
}));
