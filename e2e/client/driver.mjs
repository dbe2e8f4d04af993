// driver.mjs runs real @rocicorp/zero clients under Node 22 for the Go e2e
// tests, which control it with one JSON command per line on stdin and read
// one JSON event per line on stdout. Zero's own logs go to stderr.
//
// Commands (`client` names a Zero instance and defaults to "default"; several
// may be open at once, and instances with the same userID and storageKey
// share their 'mem' storage, as two tabs share IndexedDB):
//   {"cmd":"open","client":"a","server":"http://127.0.0.1:4848","userID":"u1",
//    "auth":"<jwt>","storageKey":"k","pingTimeoutMs":5000,"logLevel":"error",
//    "wire":true}
//      wire reports the client's sockets and the frames it receives (below)
//   {"cmd":"query","client":"a","id":"q1","ttl":"1s", <query>}
//      <query> is {"shape":"openByModified","args":{...}} (app/queries.mjs) or
//      {"table":"issue","where":W,"orderBy":[["modified","desc"]],"limit":10,
//       "start":{"row":{...},"inclusive":false},"one":true,
//       "related":[{"name":"owner","query":<query without table>}]}
//      W is ["col","op",value] or ["col",value] | {"and":[W...]} |
//      {"or":[W...]} | {"not":W} | {"exists":"rel","query":<query>,"flip":true}
//      op is any of ZQL's: = != < <= > >= IN, NOT IN, IS, IS NOT, LIKE,
//      NOT LIKE, ILIKE, NOT ILIKE; "flip" (optional) forces the join direction
//      With "quiet":true the view's changes are kept for "views" instead of
//      reported as "rows" events, which keeps hundreds of views cheap.
//   {"cmd":"unquery","client":"a","id":"q1"}      destroys the view
//   {"cmd":"views","client":"a","ids":["q1"]}  the views' latest data at once
//      (all views without "ids"): the ack carries
//      "views":{"q1":{"rows":...,"complete":true},...}
//   {"cmd":"local","client":"a","table":"issue"}  the table's rows in the client's
//                                                 store, whichever queries hold them
//      with "synced":true and a "shape", the query is the synced query
//      queries.<shape>(args): name and args on the wire, the server asks the
//      app's query endpoint for the AST
//   {"cmd":"mutate","client":"a","id":"m1","name":"issue.setTitle","args":{...}}
//      runs a custom mutator (api-server.mjs's definitions); the ack follows
//      the optimistic (client) result, then a "mutation" event reports the
//      server's: {"event":"mutation","client":...,"id":...,"rows":<details>}
//   {"cmd":"crud","client":"a","id":"m1","table":"issue","op":"update","value":{...}}
//      runs a legacy CRUD mutator (open the client with "crud":true, which
//      uses app/crud-schema.mjs: enableLegacyMutators, no custom mutators);
//      the ack follows the client's optimistic write
//   {"cmd":"connect","client":"a","auth":"<jwt>"}  leaves needs-auth
//   {"cmd":"close","client":"a"}
//   {"cmd":"exit"}
//
// Any command may carry a "seq", which its ack or error echoes.
//
// Events:
//   {"event":"ack","seq":1,"cmd":...,"client":...,"id":...}  a command was carried
//      out; "open" adds clientID and clientGroupID, "local" adds table and rows
//   {"event":"error","seq":1,"cmd":...,"client":...,"id":...,"error":"..."}
//   {"event":"connection","client":...,"state":"connected","reason":...}
//   {"event":"rows","client":...,"id":...,"rows":[...]|{...}|null,"resultType":"complete","complete":true}
//      after every change of a materialized view
//   {"event":"update-needed"|"client-state-not-found","client":...,"reason":...}
//   With "wire" (the fields are those the Go side already decodes):
//   {"event":"ws","client":...,"state":"open","reason":{"url":...,"baseCookie":...|null}}
//   {"event":"ws","client":...,"state":"close","reason":{"code":1000,"reason":"..."}}
//   {"event":"frame","client":...,"id":"<tag, e.g. pokeStart>","rows":<body>}
//      every downstream message the client receives, in order
import readline from 'node:readline';
import {Zero, defineMutator, defineMutators} from '@rocicorp/zero';
import {schema} from './app/schema.mjs';
import {schema as crudSchema} from './app/crud-schema.mjs';
import {queries, shapes} from './app/queries.mjs';

// The custom mutators of testdata/spec/transcripts/app/mutators.mjs, as
// api-server.mjs runs them on the server.
const mutators = defineMutators({
  issue: {
    setTitle: defineMutator(async ({tx, args}) => {
      await tx.mutate.issue.update({id: args.id, title: args.title, modified: args.modified});
    }),
  },
  failing: defineMutator(async ({tx, args}) => {
    if (tx.location === 'server') throw new Error(`server rejected: ${args?.why ?? 'always'}`);
  }),
});

const clients = new Map();

// wired maps the clientID of a client opened with "wire" to its name. Zero
// looks the WebSocket global up for each connection, so wrapping it here
// sees every socket; unwired clients' sockets are left alone.
const wired = new Map();
const BaseWebSocket = globalThis.WebSocket;
globalThis.WebSocket = class extends BaseWebSocket {
  constructor(url, protocols) {
    super(url, protocols);
    let u;
    try {
      u = new URL(String(url));
    } catch {
      return;
    }
    const name = wired.get(u.searchParams.get('clientID'));
    if (name === undefined) return;
    emit({event: 'ws', client: name, state: 'open',
      reason: {url: u.origin + u.pathname, baseCookie: u.searchParams.get('baseCookie') || null}});
    this.addEventListener('message', e => {
      let f;
      try {
        f = JSON.parse(String(e.data));
      } catch {
        return;
      }
      if (Array.isArray(f)) emit({event: 'frame', client: name, id: f[0], rows: f[1] ?? null});
    });
    this.addEventListener('close', e =>
      emit({event: 'ws', client: name, state: 'close', reason: {code: e.code, reason: e.reason}}));
  }
};

function emit(ev) {
  process.stdout.write(JSON.stringify(ev) + '\n');
}

function mustClient(name) {
  const c = clients.get(name);
  if (!c) throw new Error(`no open client ${JSON.stringify(name)}`);
  return c;
}

function buildCondition(eb, w) {
  if (Array.isArray(w)) {
    return w.length === 2 ? eb.cmp(w[0], w[1]) : eb.cmp(w[0], w[1], w[2]);
  }
  if (w.and) return eb.and(...w.and.map(c => buildCondition(eb, c)));
  if (w.or) return eb.or(...w.or.map(c => buildCondition(eb, c)));
  if (w.not) return eb.not(buildCondition(eb, w.not));
  if (w.exists) {
    const opts = w.flip !== undefined ? {flip: w.flip} : undefined;
    return eb.exists(w.exists, w.query ? q => buildQuery(q, w.query) : undefined, opts);
  }
  throw new Error(`bad condition ${JSON.stringify(w)}`);
}

// buildQuery applies a JSON description to a ZQL query, in the order an app
// would write it.
function buildQuery(q, d) {
  if (d.where) q = q.where(eb => buildCondition(eb, d.where));
  for (const [col, dir = 'asc'] of d.orderBy ?? []) q = q.orderBy(col, dir);
  if (d.start) q = q.start(d.start.row, {inclusive: !!d.start.inclusive});
  if (d.limit !== undefined) q = q.limit(d.limit);
  for (const r of d.related ?? []) {
    q = r.query ? q.related(r.name, sq => buildQuery(sq, r.query)) : q.related(r.name);
  }
  if (d.one) q = q.one();
  return q;
}

function query(z, d) {
  if (d.shape && d.synced) {
    const fn = queries[d.shape];
    if (!fn) throw new Error(`unknown synced query ${d.shape}`);
    return fn(d.args ?? {});
  }
  if (d.shape) {
    const fn = shapes[d.shape];
    if (!fn) throw new Error(`unknown shape ${d.shape}`);
    return fn(z.query, d.args ?? {});
  }
  const table = z.query[d.table];
  if (!table) throw new Error(`unknown table ${d.table}`);
  return buildQuery(table, d);
}

function open(c) {
  const name = c.client;
  if (clients.has(name)) throw new Error(`client ${name} is already open`);
  const z = new Zero({
    schema: c.crud ? crudSchema : schema,
    cacheURL: c.server,
    userID: c.userID,
    auth: c.auth ?? undefined,
    storageKey: c.storageKey,
    // No IndexedDB in Node; instances in this process with the same
    // userID and storageKey share the in-memory store.
    kvStore: 'mem',
    logLevel: c.logLevel ?? 'error',
    mutators: c.crud ? undefined : mutators,
    pingTimeoutMs: c.pingTimeoutMs,
    // The defaults reload the page.
    onUpdateNeeded: reason => emit({event: 'update-needed', client: name, reason}),
    onClientStateNotFound: () => emit({event: 'client-state-not-found', client: name}),
  });
  const views = new Map();
  clients.set(name, {z, views});
  if (c.wire) wired.set(z.clientID, name);
  // subscribe() also reports the current state: report each change once.
  let last;
  const onState = s => {
    if (last && last.name === s.name && JSON.stringify(last.reason) === JSON.stringify(s.reason)) return;
    last = s;
    const ev = {event: 'connection', client: name, state: s.name};
    if (s.reason !== undefined) ev.reason = s.reason;
    emit(ev);
  };
  onState(z.connection.state.current);
  z.connection.state.subscribe(onState);
  return z.clientGroupID.then(clientGroupID => ({clientID: z.clientID, clientGroupID}));
}

function materialize(c) {
  const {z, views} = mustClient(c.client);
  if (!c.id) throw new Error('query needs an id');
  if (views.has(c.id)) throw new Error(`query ${c.id} exists`);
  const opts = c.ttl !== undefined ? {ttl: c.ttl} : undefined;
  const view = z.materialize(query(z, c), opts);
  views.set(c.id, view);
  view.addListener((data, resultType, error) => {
    if (c.quiet) {
      // Serialized only when asked for ("views").
      view.latest = {data, resultType, error};
      return;
    }
    const ev = {
      event: 'rows',
      client: c.client,
      id: c.id,
      // JSON drops the views' symbol-keyed bookkeeping.
      rows: data === undefined ? null : JSON.parse(JSON.stringify(data)),
      resultType,
      complete: resultType === 'complete',
    };
    if (error) ev.error = error;
    emit(ev);
  });
}

async function handle(c) {
  c.client ??= 'default';
  switch (c.cmd) {
    case 'open':
      return open(c);
    case 'query':
      return materialize(c);
    case 'unquery': {
      const {views} = mustClient(c.client);
      const view = views.get(c.id);
      if (!view) throw new Error(`no query ${c.id}`);
      view.destroy();
      views.delete(c.id);
      return;
    }
    case 'views': {
      const {views} = mustClient(c.client);
      const out = {};
      for (const [id, v] of views) {
        if (c.ids && !c.ids.includes(id)) continue;
        const l = v.latest;
        if (!l) {
          out[id] = {rows: null, complete: false};
          continue;
        }
        out[id] = {rows: l.data === undefined ? null : JSON.parse(JSON.stringify(l.data)),
          complete: l.resultType === 'complete', ...(l.error ? {error: String(l.error)} : {})};
      }
      return {views: out};
    }
    case 'mutate': {
      const {z} = mustClient(c.client);
      const path = c.name.split('.');
      let m = mutators;
      for (const k of path) m = m?.[k];
      if (typeof m !== 'function') throw new Error(`unknown mutator ${c.name}`);
      const r = z.mutate(m(c.args ?? {}));
      r.server.then(
        details => emit({event: 'mutation', client: c.client, id: c.id, rows: details}),
        err => emit({event: 'mutation', client: c.client, id: c.id, error: String(err?.stack ?? err)}));
      return {rows: await r.client};
    }
    case 'crud': {
      const {z} = mustClient(c.client);
      const fn = z.mutate[c.table]?.[c.op];
      if (typeof fn !== 'function') throw new Error(`no CRUD mutator ${c.table}.${c.op}`);
      const r = fn(c.value);
      await (r?.client ?? r);
      return;
    }
    case 'local': {
      const {z} = mustClient(c.client);
      return {table: c.table, rows: await z.inspector.client.rows(c.table)};
    }
    case 'connect': {
      const {z} = mustClient(c.client);
      // Resolves only after the next state change when paused: don't wait.
      z.connection.connect(c.auth ? {auth: c.auth} : undefined).catch(err => {
        emit({event: 'error', cmd: c.cmd, client: c.client, error: String(err?.stack ?? err)});
      });
      return;
    }
    case 'close': {
      const {z, views} = mustClient(c.client);
      for (const v of views.values()) v.destroy();
      clients.delete(c.client);
      await z.close();
      return;
    }
    case 'exit':
      for (const {z} of clients.values()) await z.close();
      process.exit(0);
    default:
      throw new Error(`unknown command ${c.cmd}`);
  }
}

process.on('unhandledRejection', err => {
  emit({event: 'error', error: `unhandled rejection: ${err?.stack ?? err}`});
});

// Commands run one at a time, in order.
let chain = Promise.resolve();
const rl = readline.createInterface({input: process.stdin, crlfDelay: Infinity});
rl.on('line', line => {
  if (!line.trim()) return;
  chain = chain.then(async () => {
    let c;
    try {
      c = JSON.parse(line);
      const extra = await handle(c);
      emit({event: 'ack', seq: c.seq, cmd: c.cmd, client: c.client, id: c.id, ...extra});
    } catch (err) {
      emit({event: 'error', seq: c?.seq, cmd: c?.cmd, client: c?.client, id: c?.id, error: String(err?.stack ?? err)});
    }
  });
});
// The test closing stdin means it is done with every client.
rl.on('close', () => {
  chain.then(async () => {
    for (const {z} of clients.values()) await z.close().catch(() => {});
    process.exit(0);
  });
});
