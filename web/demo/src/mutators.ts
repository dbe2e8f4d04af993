// The demo's custom mutators. The browser runs them optimistically; the
// push endpoint built into `jetsync run` (cmd/jetsync/demoapi.go) runs the
// same rules against Postgres, and its result comes back by replication.
import {defineMutator, defineMutators} from '@rocicorp/zero';

type IssueCreate = {id: string; title: string; owner_id?: string | null; created: number; modified: number};
type IssueUpdate = {id: string; title: string; modified: number};
type IssueSetOpen = {id: string; open: boolean; modified: number};
type CommentAdd = {id: string; issue_id: string; body: string; created: number};

export const mutators = defineMutators({
  issue: {
    create: defineMutator(async ({tx, args}: {tx: any; args: IssueCreate}) => {
      await tx.mutate.issue.insert({
        id: args.id,
        title: args.title,
        open: true,
        modified: args.modified,
        owner_id: args.owner_id ?? null,
        created: args.created,
      });
    }),
    update: defineMutator(async ({tx, args}: {tx: any; args: IssueUpdate}) => {
      await tx.mutate.issue.update({id: args.id, title: args.title, modified: args.modified});
    }),
    setOpen: defineMutator(async ({tx, args}: {tx: any; args: IssueSetOpen}) => {
      await tx.mutate.issue.update({id: args.id, open: args.open, modified: args.modified});
    }),
  },
  comment: {
    add: defineMutator(async ({tx, args}: {tx: any; args: CommentAdd}) => {
      await tx.mutate.comment.insert({id: args.id, issue_id: args.issue_id, body: args.body, created: args.created});
    }),
  },
});
