// analytics-ts: an analytics consumer of jetsync's change stream, in
// TypeScript on Node 22 (which runs .ts files as they are). It keeps
// per-table insert, update and delete counts and a rolling rate, prints them,
// and resumes exactly where it stopped after a restart or a crash.
//
// It imports nothing of jetsync's: everything it knows comes from the
// stream's documented contract (streams/README.md): the stream and subject
// names, the message body (parts with wm, prev, part, last, changes), the
// Jetsync-* headers and fragments. Like the Go example, it owns its
// position: counts, stream sequence and watermark are saved to one state file
// at a transaction boundary, the stream is acked up to that sequence only
// after, and on start the durable consumer is (re)created at the message after
// it. Part 0's prev must equal the watermark it holds, or it stops.

import { connect } from "@nats-io/transport-node";
import type { NatsConnection } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy, JetStreamApiError, jetstream, jetstreamManager } from "@nats-io/jetstream";
import type { JetStreamManager, JsMsg } from "@nats-io/jetstream";
import { closeSync, existsSync, fsyncSync, openSync, readFileSync, renameSync, writeSync } from "node:fs";
import { parseArgs } from "node:util";

// --- the contract (streams/README.md) ---

interface Change {
  op: string;
  rows?: unknown[][];
  reset?: { replicaVersion: string };
  fragment?: string;
  fragNum?: number;
  fragCount?: number;
}

interface Part {
  wm: string;
  prev?: string;
  part: number;
  last?: boolean;
  commitTimeMs?: number;
  changes: Change[] | null;
}

interface Message {
  schema?: string;
  table?: string;
  parts: Part[];
}

const HEADER_WATERMARK = "Jetsync-Watermark";
const HEADER_COMMIT = "Jetsync-Commit";
const META_PROTECT = "jetsync.protect";

// --- settings ---

const { values: opts } = parseArgs({
  options: {
    nats: { type: "string", default: process.env.NATS_URL ?? "nats://127.0.0.1:4222" },
    app: { type: "string", default: process.env.ZERO_APP_ID ?? "zero" },
    shard: { type: "string", default: "0" },
    durable: { type: "string", default: "analytics-ts" },
    state: { type: "string", default: "analytics-state.json" },
    every: { type: "string", default: "5000" }, // report interval, ms
    window: { type: "string", default: "60" }, // rolling rate window, s
    json: { type: "boolean", default: false },
    "no-protect": { type: "boolean", default: false },
    help: { type: "boolean", short: "h", default: false },
  },
});
if (opts.help) {
  console.log(`usage: node main.ts [--nats URL] [--app zero] [--shard 0] [--durable NAME] [--state FILE]
       [--every MS] [--window S] [--json] [--no-protect]`);
  process.exit(0);
}
if (!/^[a-z0-9_]+$/.test(opts.app!)) {
  throw new Error(`app id ${opts.app}: must match [a-z0-9_]+`);
}
const shardID = `${opts.app}_${Number(opts.shard)}`;
const STREAM = `JETSYNC_${shardID}_CHANGES`;
const FILTER = `jetsync.${shardID}.changes.>`;
const everyMs = Number(opts.every);
const windowSec = Number(opts.window);

// --- state ---

interface Counts {
  insert: number;
  update: number;
  delete: number;
  truncate?: number;
  backfill?: number;
}

interface State {
  seq: number;
  watermark: string;
  replicaVersion?: string;
  transactions: number;
  resets?: number;
  tables: Record<string, Counts>;
}

function loadState(file: string): State {
  if (!existsSync(file)) {
    return { seq: 0, watermark: "", transactions: 0, tables: {} };
  }
  const st = JSON.parse(readFileSync(file, "utf8")) as State;
  st.tables ??= {};
  return st;
}

// saveState replaces the file through a renamed temporary one, so that a
// crash leaves the old state or the new, never half of one.
function saveState(file: string, st: State): void {
  const tmp = file + ".tmp";
  const fd = openSync(tmp, "w");
  try {
    writeSync(fd, JSON.stringify(st));
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, file);
}

class GapError extends Error {
  constructor(seq: number, reason: string) {
    super(`gap at stream seq ${seq}: ${reason}`);
  }
}

function log(level: string, msg: string, fields: Record<string, unknown> = {}): void {
  const kv = Object.entries(fields).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(" ");
  console.error(`time=${new Date().toISOString()} level=${level} msg=${JSON.stringify(msg)} ${kv}`);
}

// --- counting ---

const st = loadState(opts.state!);
const rate = new Map<number, number>(); // unix second of commit → row changes

let open = false; // a transaction is in hand
let openWM = "";
let nextPart = 0;
let pending: Record<string, Counts> = {};
let pendingReset = "";
let frag: { key: string; wm: string; next: number; count: number; buf: string } | null = null;

let seen = 0; // the last message handled, complete or not
let dirty = false;
let ackable: JsMsg | null = null;
let saved = 0;
let reported = 0;

function begin(wm: string): void {
  open = true;
  openWM = wm;
  nextPart = 0;
  pending = {};
  pendingReset = "";
}

function dropOpen(): void {
  open = false;
  openWM = "";
  nextPart = 0;
  pending = {};
  pendingReset = "";
  frag = null;
}

function count(table: string, c: Change): void {
  const p = (pending[table] ??= { insert: 0, update: 0, delete: 0 });
  switch (c.op) {
    case "insert":
      p.insert++;
      break;
    case "update":
      p.update++;
      break;
    case "delete":
      p.delete++;
      break;
    case "truncate":
      p.truncate = (p.truncate ?? 0) + 1;
      break;
    case "backfill":
      p.backfill = (p.backfill ?? 0) + (c.rows?.length ?? 0);
      break;
    case "reset":
      pendingReset = c.reset!.replicaVersion;
      break;
  }
}

// joinFragments returns a part's changes with fragmented ones joined, as
// streams/README.md describes: consecutive fragment changes of one change on
// one table in one transaction, concatenated in fragNum order.
function joinFragments(seq: number, table: string, p: Part): Change[] {
  const out: Change[] = [];
  for (const c of p.changes ?? []) {
    if (c.op !== "fragment") {
      if (frag) throw new GapError(seq, `${c.op} change while fragment ${frag.next} of ${frag.count} is due`);
      out.push(c);
      continue;
    }
    const num = c.fragNum ?? 0;
    if (num === 0) {
      if (frag) throw new GapError(seq, "a new fragmented change while another is partly joined");
      frag = { key: table, wm: p.wm, next: 0, count: c.fragCount ?? 0, buf: "" };
    } else if (!frag || frag.key !== table || frag.wm !== p.wm || frag.next !== num || frag.count !== c.fragCount) {
      throw new GapError(seq, `fragment ${num} of ${c.fragCount} out of sequence`);
    }
    frag.buf += c.fragment ?? "";
    frag.next++;
    if (frag.next === frag.count) {
      out.push(JSON.parse(frag.buf) as Change);
      frag = null;
    }
  }
  if (p.last && frag) throw new GapError(seq, "transaction ends mid-change");
  return out;
}

function commit(p: Part): void {
  let changes = 0;
  for (const [table, c] of Object.entries(pending)) {
    if (!c.insert && !c.update && !c.delete && !c.truncate && !c.backfill) continue;
    const t = (st.tables[table] ??= { insert: 0, update: 0, delete: 0 });
    t.insert += c.insert;
    t.update += c.update;
    t.delete += c.delete;
    if (c.truncate) t.truncate = (t.truncate ?? 0) + c.truncate;
    if (c.backfill) t.backfill = (t.backfill ?? 0) + c.backfill;
    changes += c.insert + c.update + c.delete;
  }
  if (pendingReset) {
    st.replicaVersion = pendingReset;
    st.resets = (st.resets ?? 0) + 1;
  }
  st.watermark = p.wm;
  st.transactions++;
  if (p.commitTimeMs && changes > 0) {
    const sec = Math.floor(p.commitTimeMs / 1000);
    if (sec > Date.now() / 1000 - windowSec) rate.set(sec, (rate.get(sec) ?? 0) + changes);
  }
  dropOpen();
}

function isReset(p: Part): boolean {
  return p.part === 0 && (p.changes?.length ?? 0) > 0 && p.changes![0].op === "reset";
}

function handle(m: JsMsg): void {
  const seq = m.seq;
  if (seq <= seen) return; // a redelivery of what is counted or in hand
  let msg: Message;
  try {
    msg = m.json<Message>();
  } catch (err) {
    throw new GapError(seq, `undecodable message: ${err}`); // never skipped
  }
  const table = `${msg.schema ?? ""}.${msg.table ?? ""}`;
  for (const p of msg.parts) {
    if (isReset(p)) {
      // A new initial sync supersedes the history before it.
      dropOpen();
      begin(p.wm);
    } else if (!open) {
      if (p.part !== 0) {
        if (st.watermark === "") continue; // the stream was purged mid-transaction before a first start
        throw new GapError(seq, `part ${p.wm}:${p.part} without the parts before it`);
      }
      if (st.watermark !== "" && p.prev !== st.watermark) {
        throw new GapError(seq, `transaction ${p.wm} follows ${JSON.stringify(p.prev)}, but this consumer is at ${st.watermark}`);
      }
      begin(p.wm);
    } else if (p.wm !== openWM || p.part !== nextPart) {
      throw new GapError(seq, `part ${p.wm}:${p.part} where ${openWM}:${nextPart} was due`);
    }
    for (const c of joinFragments(seq, table, p)) count(table, c);
    nextPart++;
    if (p.last) commit(p);
  }
  // The headers say the same without the body: a cross-check.
  const last = msg.parts[msg.parts.length - 1];
  const h = m.headers;
  if (h && (h.get(HEADER_WATERMARK) !== last.wm || (h.get(HEADER_COMMIT) !== "") !== !!last.last)) {
    throw new GapError(seq, `headers ${HEADER_WATERMARK}=${h.get(HEADER_WATERMARK)} ${HEADER_COMMIT}=${h.get(HEADER_COMMIT)} disagree with the body`);
  }
  seen = seq;
  if (!open) {
    st.seq = seq;
    dirty = true;
    ackable = m;
  }
}

// persist saves the state, then acks the stream up to it.
function persist(): void {
  if (!dirty) return;
  saveState(opts.state!, st);
  dirty = false;
  saved = Date.now();
  if (ackable) {
    ackable.ack(); // a lost ack is a redelivery, which handle skips
    ackable = null;
  }
}

function ratePerSec(): number {
  const from = Math.floor(Date.now() / 1000 - windowSec);
  let sum = 0;
  for (const [sec, n] of rate) {
    if (sec <= from) rate.delete(sec);
    else sum += n;
  }
  return sum / windowSec;
}

function report(): void {
  reported = Date.now();
  const r = {
    time: new Date(reported).toISOString(),
    seq: st.seq,
    watermark: st.watermark,
    transactions: st.transactions,
    tables: st.tables,
    ratePerSec: ratePerSec(),
    windowSec,
  };
  if (opts.json) {
    console.log(JSON.stringify(r));
    return;
  }
  const lines = [`${r.time} seq=${r.seq} watermark=${r.watermark} transactions=${r.transactions} rate=${r.ratePerSec.toFixed(1)}/s (last ${windowSec}s)`];
  for (const name of Object.keys(r.tables).sort()) {
    const c = r.tables[name];
    let line = `  ${name.padEnd(30)} insert=${c.insert} update=${c.update} delete=${c.delete}`;
    if (c.truncate) line += ` truncate=${c.truncate}`;
    if (c.backfill) line += ` backfill=${c.backfill}`;
    lines.push(line);
  }
  console.log(lines.join("\n"));
}

// --- the consumer ---

// start is the stream sequence to read from: after the state's, or the
// stream's first message.
function startSeq(first: number, last: number): number {
  if (st.seq === 0) return Math.max(first, 1);
  const next = st.seq + 1;
  if (last < st.seq) throw new GapError(next, `the stream ends at seq ${last}, before this consumer's ${st.seq}: it was recreated`);
  if (first > next) throw new GapError(next, `the stream now starts at seq ${first}: history was purged past this consumer`);
  return next;
}

function notFound(err: unknown): boolean {
  return err instanceof JetStreamApiError && err.status === 404;
}

// ensureConsumer (re)creates the durable consumer so that it delivers from
// start with nothing in flight.
async function ensureConsumer(jsm: JetStreamManager, start: number): Promise<void> {
  const durable = opts.durable!;
  try {
    const info = await jsm.consumers.info(STREAM, durable);
    if (info.delivered.stream_seq === start - 1 && info.ack_floor.stream_seq === start - 1 && info.config.filter_subject === FILTER) {
      return;
    }
    log("INFO", "recreating the durable consumer at this consumer's position", {
      seq: start, delivered: info.delivered.stream_seq, ack_floor: info.ack_floor.stream_seq,
    });
    await jsm.consumers.delete(STREAM, durable);
  } catch (err) {
    if (!notFound(err)) throw err;
  }
  await jsm.consumers.add(STREAM, {
    durable_name: durable,
    description: "analytics-ts counts per table",
    deliver_policy: DeliverPolicy.StartSequence,
    opt_start_seq: start,
    ack_policy: AckPolicy.All,
    ack_wait: 60_000_000_000, // ns
    max_deliver: -1,
    filter_subject: FILTER,
    metadata: opts["no-protect"] ? undefined : { [META_PROTECT]: "true" },
  });
}

let stopping = false;

async function consume(nc: NatsConnection): Promise<void> {
  // A transaction left open is read again from its first message.
  dropOpen();
  persist();
  seen = st.seq;
  const jsm = await jetstreamManager(nc);
  const si = await jsm.streams.info(STREAM);
  await ensureConsumer(jsm, startSeq(si.state.first_seq, si.state.last_seq));
  const consumer = await jetstream(nc).consumers.get(STREAM, opts.durable!);
  while (!stopping) {
    const batch = await consumer.fetch({ max_messages: 256, expires: 1000 });
    for await (const m of batch) {
      handle(m);
      if (!open && dirty && Date.now() - saved > 1000) persist();
      if (stopping) break;
    }
    // Caught up, or a pause: store the progress.
    if (!open) persist();
    if (Date.now() - reported >= everyMs) report();
  }
}

async function main(): Promise<void> {
  const nc = await connect({
    servers: opts.nats!,
    name: "analytics-ts",
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    waitOnFirstConnect: true,
  });
  const stop = () => {
    if (stopping) process.exit(1); // a second signal exits at once
    stopping = true;
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  log("INFO", "analytics consumer starting", { stream: STREAM, consumer: opts.durable, seq: st.seq, watermark: st.watermark });
  let failure: unknown = null;
  while (!stopping) {
    try {
      await consume(nc);
    } catch (err) {
      if (err instanceof GapError) {
        failure = err;
        break;
      }
      if (stopping) break;
      // jetsync restarting, a failover, the consumer deleted: start over
      // from the position in hand.
      log("WARN", "consumer interrupted; resuming", { err: String(err), seq: st.seq });
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  persist();
  report();
  await nc.close();
  if (failure) {
    console.error(`analytics-ts: ${(failure as Error).message}`);
    process.exit(1);
  }
}

await main();
