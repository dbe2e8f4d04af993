// client.mjs times the real @rocicorp/zero 1.9.0 client (the e2e install,
// e2e/client/node_modules) hydrating the whole issue table: once the client
// is connected, from materialize until the view reports 'complete'. Each run
// is a new client group. It prints one JSON line per run:
//   {"run":0,"ms":1234.5,"rows":100000}   or   {"run":0,"error":"..."}
//
// usage: scripts/node22 bench/viewsyncer/client.mjs SERVER_URL RUNS
import {Zero} from '../../e2e/client/node_modules/@rocicorp/zero/out/zero/src/zero.js';
import {schema} from '../../e2e/client/app/schema.mjs';
import {shapes} from '../../e2e/client/app/queries.mjs';

const [server, runsArg] = process.argv.slice(2);
const runs = Number(runsArg ?? 1);

function connected(z) {
  return new Promise((resolve, reject) => {
    const check = s => {
      if (s.name === 'connected') resolve();
      else if (s.name === 'needs-auth' || s.name === 'error') reject(new Error(`connection ${s.name}: ${JSON.stringify(s.reason)}`));
    };
    check(z.connection.state.current);
    z.connection.state.subscribe(check);
  });
}

async function hydrate(run) {
  const z = new Zero({
    schema,
    cacheURL: server,
    userID: 'u000001',
    storageKey: `bench-${process.pid}-${run}`,
    kvStore: 'mem',
    logLevel: 'error',
  });
  try {
    await connected(z);
    const start = performance.now();
    // TTL none: once destroyed, the view leaves the server at once, so no
    // run's rows stay behind there.
    const view = z.materialize(shapes.allIssues(z.query), {ttl: 'none'});
    const rows = await new Promise(resolve => {
      view.addListener((data, resultType) => {
        if (resultType === 'complete') resolve(data.length);
      });
    });
    const ms = performance.now() - start;
    view.destroy();
    return {run, ms, rows};
  } finally {
    await z.close();
  }
}

for (let run = 0; run < runs; run++) {
  try {
    process.stdout.write(JSON.stringify(await hydrate(run)) + '\n');
  } catch (err) {
    process.stdout.write(JSON.stringify({run, error: String(err?.stack ?? err)}) + '\n');
    process.exit(1);
  }
}
process.exit(0);
