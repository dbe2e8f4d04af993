// api-server.mjs is the app's API server for the e2e tests: the endpoints
// behind ZERO_QUERY_URL and ZERO_MUTATE_URL for the app in ./app (the app the
// reference transcripts were captured with), built, as a real Zero app
// builds them, on the package's own handleQueryRequest, handleMutateRequest
// and postgres.js adapter. Run it under Node 22 (scripts/node22).
//
//   node api-server.mjs [--port N] [--upstream URL] [--auth-secret S] [--api-key K]
//
//   --port         listen port on 127.0.0.1 (default 0: any free port)
//   --upstream     Postgres URL the mutators write to (default $ZERO_UPSTREAM_DB)
//   --auth-secret  verify "Authorization: Bearer <JWT>" as HS256/384/512 with
//                  this secret (default $ZERO_AUTH_SECRET); a bad or expired
//                  token gets 401. Without it a JWT's sub is taken unverified.
//   --api-key      require this X-Api-Key (401 otherwise)
//
// When it listens it prints one JSON line on stdout:
//   {"event":"listening","port":N,"url":"http://127.0.0.1:N"}
// It exits on SIGTERM, SIGINT or when stdin closes (so it dies with its test).
//
// Endpoints:
//   POST /query    ["transform", [{id, name, args}]] -> QueryResponse
//   POST /mutate   push body -> MutateResponse; the query string carries
//                  schema=<app>_<shard>&appID=<app>, and the mutators run in
//                  one Postgres transaction with the <app>_<shard>.clients
//                  and mutations bookkeeping.
//   The user is the verified JWT's sub, else the user an opaque token was
//   registered for (/control/tokens), else the "userID" cookie, else null
//   (logged out). An unknown opaque token gets 401.
//
// Test control (JSON in, JSON out):
//   POST /control/fail     {"path":"/query"|"/mutate"|"*","status":401,"count":N,"body":"..."}
//                          the next N requests to path get that status (count
//                          0 or absent: until /control/reset)
//   POST /control/config   {"omitUserID":true} answers without a userID (the
//                          server then trusts the connection's URL userID)
//   POST /control/tokens   {"<opaque token>":"<userID>", ...}
//   POST /control/reset    clears faults, config, tokens and the request log
//   GET  /control/requests the requests received since the last reset:
//                          [{"path","query","headers","body"}] (headers
//                          lower-cased, as Node gives them)
//   GET  /health           {"ok":true}
import crypto from 'node:crypto';
import http from 'node:http';
import {defineMutator, defineMutators, mustGetMutator, mustGetQuery} from '@rocicorp/zero';
import {handleMutateRequest, handleQueryRequest} from '@rocicorp/zero/server';
import {zeroPostgresJS} from '@rocicorp/zero/server/adapters/postgresjs';
import {queries} from './app/queries.mjs';
import {schema} from './app/schema.mjs';

// The custom mutators of testdata/spec/transcripts/app/mutators.mjs
// (the same definitions run optimistically in the client).
export const mutators = defineMutators({
  issue: {
    setTitle: defineMutator(async ({tx, args}) => {
      await tx.mutate.issue.update({id: args.id, title: args.title, modified: args.modified});
    }),
    create: defineMutator(async ({tx, args}) => {
      await tx.mutate.issue.insert({
        id: args.id, title: args.title, open: true, modified: args.modified,
        owner_id: args.owner_id ?? null, created: args.created,
      });
    }),
    remove: defineMutator(async ({tx, args}) => {
      await tx.mutate.issue.delete({id: args.id});
    }),
  },
  comment: {
    add: defineMutator(async ({tx, args}) => {
      await tx.mutate.comment.insert({
        id: args.id, issue_id: args.issue_id, body: args.body, created: args.created,
      });
    }),
  },
  // Always fails on the server (an application error) -> the error result in
  // a poke's mutationsPatch.
  failing: defineMutator(async ({tx, args}) => {
    if (tx.location === 'server') throw new Error(`server rejected: ${args?.why ?? 'always'}`);
  }),
});

function parseArgs(argv) {
  const opts = {
    port: 0,
    upstream: process.env.ZERO_UPSTREAM_DB ?? '',
    authSecret: process.env.ZERO_AUTH_SECRET ?? '',
    apiKey: '',
  };
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].split(/=(.*)/s, 2);
    const value = () => inline ?? argv[++i];
    switch (flag) {
      case '--port': opts.port = Number(value()); break;
      case '--upstream': opts.upstream = value(); break;
      case '--auth-secret': opts.authSecret = value(); break;
      case '--api-key': opts.apiKey = value(); break;
      default: throw new Error(`unknown flag ${argv[i]}`);
    }
  }
  return opts;
}

const opts = parseArgs(process.argv.slice(2));
if (!opts.upstream) {
  console.error('api-server: --upstream or ZERO_UPSTREAM_DB is required');
  process.exit(2);
}
// A connection string lets the adapter open its own postgres.js pool, so
// this file needs no direct dependency on the postgres package.
const db = zeroPostgresJS(schema, opts.upstream);

const state = {faults: [], config: {}, tokens: new Map(), requests: []};
const MAX_LOGGED = 1000;

class HTTPError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function b64url(s) {
  return Buffer.from(s.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
}

// verifyJWT checks an HS256/384/512 JWT's signature, exp and nbf.
function verifyJWT(token, secret) {
  const parts = token.split('.');
  if (parts.length !== 3) throw new HTTPError(401, 'not a JWT');
  const header = JSON.parse(b64url(parts[0]).toString('utf8'));
  const algs = {HS256: 'sha256', HS384: 'sha384', HS512: 'sha512'};
  const alg = algs[header.alg];
  if (!alg) throw new HTTPError(401, `unsupported alg ${header.alg}`);
  const want = crypto.createHmac(alg, secret).update(`${parts[0]}.${parts[1]}`).digest();
  const got = b64url(parts[2]);
  if (want.length !== got.length || !crypto.timingSafeEqual(want, got)) {
    throw new HTTPError(401, 'bad signature');
  }
  const claims = JSON.parse(b64url(parts[1]).toString('utf8'));
  const now = Date.now() / 1000;
  if (typeof claims.exp === 'number' && now >= claims.exp) throw new HTTPError(401, 'token expired');
  if (typeof claims.nbf === 'number' && now < claims.nbf) throw new HTTPError(401, 'token not yet valid');
  return claims;
}

function userOf(req) {
  const auth = req.headers.authorization ?? '';
  if (auth.startsWith('Bearer ')) {
    const token = auth.slice('Bearer '.length);
    if (token.split('.').length === 3) {
      const claims = opts.authSecret
        ? verifyJWT(token, opts.authSecret)
        : JSON.parse(b64url(token.split('.')[1]).toString('utf8'));
      return claims.sub ?? null;
    }
    if (state.tokens.has(token)) return state.tokens.get(token);
    throw new HTTPError(401, 'unknown opaque token');
  }
  for (const part of (req.headers.cookie ?? '').split(';')) {
    const [k, v] = part.trim().split(/=(.*)/s, 2);
    if (k === 'userID' && v) return decodeURIComponent(v);
  }
  return null;
}

function takeFault(path) {
  const i = state.faults.findIndex(f => f.path === '*' || f.path === path);
  if (i < 0) return undefined;
  const f = state.faults[i];
  if (f.count > 0 && --f.count === 0) state.faults.splice(i, 1);
  return f;
}

async function readBody(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const text = Buffer.concat(chunks).toString('utf8');
  return text === '' ? undefined : JSON.parse(text);
}

function send(res, status, body) {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  res.writeHead(status, {'content-type': typeof body === 'string' ? 'text/plain' : 'application/json'});
  res.end(text);
}

async function handle(req, res) {
  const url = new URL(req.url, 'http://127.0.0.1');
  const path = url.pathname;
  if (req.method === 'GET' && path === '/health') return send(res, 200, {ok: true});
  if (req.method === 'GET' && path === '/control/requests') return send(res, 200, state.requests);
  if (req.method !== 'POST') return send(res, 405, 'method not allowed');
  const body = await readBody(req);
  switch (path) {
    case '/control/fail':
      state.faults.push({path: body.path ?? '*', status: body.status ?? 500, count: body.count ?? 0, body: body.body});
      return send(res, 200, {ok: true});
    case '/control/config':
      Object.assign(state.config, body);
      return send(res, 200, {ok: true});
    case '/control/tokens':
      for (const [k, v] of Object.entries(body ?? {})) state.tokens.set(k, v);
      return send(res, 200, {ok: true});
    case '/control/reset':
      state.faults = [];
      state.config = {};
      state.tokens.clear();
      state.requests = [];
      return send(res, 200, {ok: true});
    case '/query':
    case '/mutate':
      break;
    default:
      return send(res, 404, 'not found');
  }

  state.requests.push({path, query: Object.fromEntries(url.searchParams), headers: req.headers, body});
  if (state.requests.length > MAX_LOGGED) state.requests.shift();
  const fault = takeFault(path);
  if (fault) return send(res, fault.status, fault.body ?? `injected ${fault.status}`);
  if (opts.apiKey && req.headers['x-api-key'] !== opts.apiKey) return send(res, 401, 'bad api key');
  const userID = userOf(req);
  const ctx = {userID};
  const query = Object.fromEntries(url.searchParams);

  let response;
  if (path === '/query') {
    response = await handleQueryRequest({
      handler: (name, args) => mustGetQuery(queries, name).fn({args, ctx}),
      schema,
      query,
      body,
      userID,
      logLevel: 'error',
    });
  } else {
    response = await handleMutateRequest({
      dbProvider: db,
      handler: transact =>
        transact((tx, name, args) => mustGetMutator(mutators, name).fn({args, ctx, tx})),
      query,
      body,
      userID,
      logLevel: 'error',
    });
  }
  if (state.config.omitUserID) delete response.userID;
  return send(res, 200, response);
}

const server = http.createServer((req, res) => {
  handle(req, res).catch(e => {
    if (res.headersSent) return res.destroy();
    send(res, e instanceof HTTPError ? e.status : 500, String(e?.message ?? e));
  });
});

server.listen(opts.port, '127.0.0.1', () => {
  const {port} = server.address();
  process.stdout.write(JSON.stringify({event: 'listening', port, url: `http://127.0.0.1:${port}`}) + '\n');
});

function shutdown() {
  server.close();
  server.closeAllConnections();
  process.exit(0);
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
process.stdin.on('end', shutdown);
process.stdin.on('error', shutdown);
process.stdin.resume();
