// The app's schema with narrower read permissions, for the suite's
// permission checks: `zero-deploy-permissions --schema-path` reads the
// `permissions` export. issue rows are readable by their owner only (the
// token's sub), label has no rule at all (so no rows), and every other table
// stays readable by anyone.
import {definePermissions, ANYONE_CAN} from '@rocicorp/zero';
import {schema} from './schema.mjs';

export {schema};

export const permissions = definePermissions(schema, () => ({
  user: {row: {select: ANYONE_CAN}},
  issue: {row: {select: [(authData, {cmp}) => cmp('owner_id', authData.sub)]}},
  comment: {row: {select: ANYONE_CAN}},
  issue_label: {row: {select: ANYONE_CAN}},
}));
