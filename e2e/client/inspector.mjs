// inspector.mjs drives the real client's zero.inspector API against a sync
// server, for the Go e2e tests, and prints one JSON object with what each
// call gave (or its error) on stdout.
//
//   node inspector.mjs <cacheURL> <userID> <jwt> <adminPassword>
//
// It opens a Zero instance, syncs the openByModified shape (legacy), then
// calls authenticate (wrong, then right), serverVersion,
// clientGroup.queries, metrics, analyzeQuery, analyzeServerAST and
// analyzeNamedQuery. Every call has a deadline: the client's own have none.
import {Zero} from '@rocicorp/zero';
import {schema} from './app/schema.mjs';
import {shapes} from './app/queries.mjs';

const [server, userID, auth, password] = process.argv.slice(2);

function deadline(p, ms = 15000) {
  return Promise.race([
    p,
    new Promise((_, reject) => setTimeout(() => reject(new Error(`no answer in ${ms} ms`)), ms)),
  ]);
}

async function call(f) {
  try {
    return {ok: await deadline(f())};
  } catch (e) {
    return {error: String(e?.message ?? e)};
  }
}

const z = new Zero({schema, cacheURL: server, userID, auth, kvStore: 'mem', logLevel: 'error'});
const out = {};
try {
  const view = z.materialize(shapes.openByModified(z.query, {limit: 5}));
  await deadline(new Promise(resolve => {
    view.addListener((_, resultType) => resultType === 'complete' && resolve());
  }), 30000);

  out.wrongPassword = await call(() => z.inspector.authenticate('not-the-password'));
  // Unauthenticated, the client falls back to a browser password prompt,
  // which Node does not have: the call fails.
  out.versionUnauthenticated = await call(() => z.inspector.serverVersion());
  out.authenticate = await call(() => z.inspector.authenticate(password));
  out.version = await call(() => z.inspector.serverVersion());
  out.queries = await call(async () =>
    (await z.inspector.clientGroup.queries()).map(q => ({
      id: q.id, name: q.name, got: q.got, ttl: q.ttl, rowCount: q.rowCount,
      serverZQL: q.serverZQL,
      // The client folds query-hydration-server-ms into this digest.
      hydrationsServer: q.metrics?.['query-materialization-server']?.count() ?? 0,
    })));
  out.metrics = await call(async () => {
    const m = await z.inspector.metrics();
    return Object.fromEntries(Object.entries(m).map(([k, d]) => [k, d?.count?.() ?? d ?? null]));
  });
  const summary = r => ({
    syncedRowCount: r.syncedRowCount, syncedRows: r.syncedRows ? Object.keys(r.syncedRows) : null,
    readRowCount: r.readRowCount, elapsed: r.elapsed, warnings: r.warnings,
    plans: Object.values(r.sqlitePlans ?? {}).length,
  });
  out.analyzeQuery = await call(async () =>
    summary(await z.inspector.analyzeQuery(shapes.openByModified(z.query, {limit: 5}), {syncedRows: true})));
  out.analyzeServerAST = await call(async () =>
    summary(await z.inspector.analyzeServerAST({table: 'issue', orderBy: [['id', 'asc']], limit: 3})));
  out.analyzeNamedQuery = await call(async () =>
    summary(await z.inspector.analyzeNamedQuery('openByModified', [{limit: 4}])));
  view.destroy();
} catch (e) {
  out.fatal = String(e?.message ?? e);
}
process.stdout.write(JSON.stringify(out) + '\n');
await z.close();
process.exit(0);
