/** The Redis store from Node: the gate script sent by SHA on a connection of its own that
 * never sends a command twice (docs/node.md, "Sent at most once"), and the definitions'
 * read. */
import { createHash } from "node:crypto";
import type { Cluster, Redis } from "ioredis";
import {
  DebounceBackendError, DebounceConfigError, DebounceContractMismatch, DebounceOutcomeUnknown,
} from "./errors.js";
import { CANCEL_SCRIPT, FLUSH_SCRIPT, GATE_SCRIPT } from "./gate-script.js";
import { outage } from "./breaker.js";
import { leasedKey, shardWakeChannel, statsKey, tasksKey, wakeChannel } from "./layout.js";
import {
  DEFAULT_TIMEOUT_MS, chunked, type GateResult, type PreparedCall, type WindowInfo,
} from "./plan.js";

/** An ioredis client, or Cluster, of the Redis store. */
export type RedisClient = Redis | Cluster;

interface Script { text: string; sha: string }
const sha1 = (text: string): string => createHash("sha1").update(text, "utf8").digest("hex");
const PLAIN: Script = { text: GATE_SCRIPT, sha: sha1(GATE_SCRIPT) };
const SHARDED_TEXT = GATE_SCRIPT.replace("local SHARDED_WAKE = false", "local SHARDED_WAKE = true");
const SHARDED: Script = { text: SHARDED_TEXT, sha: sha1(SHARDED_TEXT) };
const FLUSH: Script = { text: FLUSH_SCRIPT, sha: sha1(FLUSH_SCRIPT) };
const FLUSH_SHARDED_TEXT = FLUSH_SCRIPT.replace("local SHARDED_WAKE = false", "local SHARDED_WAKE = true");
const FLUSH_SHARDED: Script = { text: FLUSH_SHARDED_TEXT, sha: sha1(FLUSH_SHARDED_TEXT) };
const CANCEL: Script = { text: CANCEL_SCRIPT, sha: sha1(CANCEL_SCRIPT) };
const scriptOf = new WeakMap<object, Promise<Script>>();
/** The scripts of scriptOf once known, so that a call need not wait for them. */
const scriptKnown = new WeakMap<object, Script>();

export function isCluster(redis: object): redis is Cluster {
  return (redis as { isCluster?: boolean }).isCluster === true;
}

/** The gate script for this connection: on a Redis Cluster whose masters have sharded
 * pub/sub (Redis 7), the one that wakes dispatchers with SPUBLISH, as the Python side loads it. */
function scriptFor(redis: RedisClient): Promise<Script> {
  if (!isCluster(redis)) return Promise.resolve(PLAIN);
  let known = scriptOf.get(redis);
  if (!known) {
    known = (async () => {  // as the Python side: every master >= 7, else (or unknown) PUBLISH
      try {
        const masters = redis.nodes("master");
        const infos = await Promise.all(masters.map((node) => node.info("server")));
        const sharded = masters.length > 0 && infos.every(
          (info) => Number(/redis_version:(\d+)/.exec(info)?.[1] ?? "0") >= 7);
        const script = sharded ? SHARDED : PLAIN;
        scriptKnown.set(redis, script);
        return script;
      } catch {
        scriptKnown.set(redis, PLAIN);
        return PLAIN;
      }
    })();
    scriptOf.set(redis, known);
  }
  return known;
}

/** Options of the gate's own connection that make ioredis write a command at most once:
 * nothing unanswered is sent again after a reconnect, nothing waits in an offline queue
 * (a call waits for the connection itself, then writes at once or not at all), and the
 * commands of a connection that closes are failed at once (maxRetriesPerRequest 0). */
const ONCE = {
  autoResendUnfulfilledCommands: false,
  maxRetriesPerRequest: 0,
  enableOfflineQueue: false,
  enableAutoPipelining: false,
} as const;

const gateConnections = new WeakMap<object, RedisClient>();
const noop = (): void => {};

/**
 * The connection the gate is sent on for the user's client `redis`: its duplicate, made
 * once per client (same address, db, credentials, TLS, retry strategy...), that never
 * sends a command twice. Without the client's keyPrefix: the windows' keys are named by
 * the `prefix` option alone, where the dispatchers read them (a prefixed window was never
 * read, so never run). On a Cluster the duplicate's node connections are made so,
 * and it does not send a command again after "Connection is closed" (retryDelayOnFailover
 * 0): MOVED, ASK, TRYAGAIN and CLUSTERDOWN, replies of a command that did not run, are
 * still followed. Closed when the user's client ends (quit, disconnect).
 */
function gateConnection(redis: RedisClient): RedisClient {
  const known = gateConnections.get(redis);
  if (known && known.status !== "end") return known;
  let made: RedisClient;
  if (isCluster(redis)) {
    const own = (redis.options.redisOptions ?? {}) as Record<string, unknown>;
    made = redis.duplicate([], {
      lazyConnect: true, enableAutoPipelining: false, retryDelayOnFailover: 0, keyPrefix: "",
      redisOptions: { ...own, ...ONCE, keyPrefix: "" },
    } as Parameters<Cluster["duplicate"]>[1]);
  } else {
    made = redis.duplicate({ ...ONCE, lazyConnect: true, keyPrefix: "" });
  }
  made.on("error", noop);  // the call that waits sees it; nothing to print
  made.on("node error", noop);
  const close = (): void => {
    if (gateConnections.get(redis) === made) gateConnections.delete(redis);
    made.disconnect();
  };
  redis.once("end", close);
  made.once("end", () => redis.off("end", close));
  gateConnections.set(redis, made);
  return made;
}

/** A connection the server refused for the client's credentials: no retry mends it (Python's
 * `NOAUTH`/`WRONGPASS` are never an outage either), so never taken for one. */
const MISCONFIGURED = /^(WRONGPASS|NOAUTH|NOPERM)\b|invalid (username-)?password/i;

const misconfigured = (error: Error): DebounceConfigError => new DebounceConfigError(
  `the Redis server refused the connection (${error.message}): check the client's username ` +
  "and password; nothing was sent");

/** Not sent: the connection was not ready and ioredis refused to queue the command. */
class NotSent extends Error {}
class TimedOut extends Error {}

/** Resolves when `conn` is ready; rejects (nothing sent) on a connect error, an ended
 * connection, or after `ms`. */
function whenReady(conn: RedisClient, ms: number): Promise<void> {
  if (conn.status === "ready") return Promise.resolve();
  return new Promise<void>((resolve, reject) => {
    const done = (error?: Error): void => {
      clearTimeout(timer);
      conn.off("ready", onReady);
      conn.off("error", onError);
      conn.off("end", onEnd);
      if (!error) resolve();
      else reject(MISCONFIGURED.test(error.message) ? misconfigured(error) : new NotSent(error.message));
    };
    const onReady = (): void => done();
    const onError = (error: Error): void => done(error);
    const onEnd = (): void => done(new Error("the connection ended"));
    const timer = setTimeout(() => done(new Error(`not connected within ${ms} ms`)), ms);
    conn.on("ready", onReady);
    conn.on("error", onError);
    conn.on("end", onEnd);
    if (conn.status === "wait") conn.connect().catch((error: Error) => done(error));
    else if (conn.status === "end") done(new Error("the connection ended"));
  });
}

const REFUSED_UNSENT = /^(Stream isn't writeable|Cluster isn't ready) and enableOfflineQueue options is false/;

/** One command, bounded by `ms`: a NotSent when ioredis refused to write it, a TimedOut
 * when no reply came in time (a single node's connection is then made anew: a reply
 * overdue means the link is suspect; what was unanswered on it fails at once). */
function once<T>(conn: RedisClient, command: Promise<T>, ms: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new TimedOut(`no reply within ${ms} ms`));
      if (!isCluster(conn) && conn.status === "ready") conn.disconnect(true);
    }, ms);
    command.then((value) => { clearTimeout(timer); resolve(value); }, (error: unknown) => {
      clearTimeout(timer);
      if (error instanceof Error && REFUSED_UNSENT.test(error.message)) reject(new NotSent(error.message));
      else reject(error);
    });
  });
}

function translate(exc: unknown, task: string): Error {
  if (exc instanceof DebounceConfigError) return exc;
  const message = exc instanceof Error ? exc.message : String(exc);
  const isReply = exc instanceof Error && exc.name === "ReplyError";
  const mismatch = /DEBOUNCE_CONTRACT_MISMATCH producer (\w+) gate (\w+)/.exec(message);
  if (mismatch) {
    return new DebounceContractMismatch(
      `debounce gate refused ${task}: ${mismatch[0]} (the producer and the gate script speak ` +
      "different versions of the gate contract; see docs/contract.md)", mismatch[1], mismatch[2]);
  }
  if (message.includes("DEBOUNCE_REPLACE_REFUSED")) {
    return new DebounceConfigError(
      `${task}: replacePayload=true: ${message.split("DEBOUNCE_REPLACE_REFUSED")[1].replace(/^[: ]+/, "")}`);
  }
  if (isReply) return new DebounceBackendError(`debounce Redis refused the gate call of ${task}: ${message}`);
  if (exc instanceof NotSent) {
    return outage(new DebounceBackendError(
      `debounce Redis unreachable for the gate call of ${task} (${message}); nothing was sent`));
  }
  return outage(new DebounceOutcomeUnknown(
    `the reply to the gate call of ${task} was lost (${message}); the outcome is unknown: it ` +
    "may or may not have run, and it was not sent again"));
}

/** The definition JSON of `task` (HGET `<prefix>:tasks`), on the gate's connection. */
export async function readDefinition(redis: RedisClient, prefix: string, task: string,
                              ms: number): Promise<string | null> {
  try {
    if (redis.status === "end") throw new NotSent("the client was closed (quit or disconnect)");
    const conn = gateConnection(redis);
    if (conn.status !== "ready") await whenReady(conn, ms);
    return await once(conn, conn.hget(tasksKey(prefix), task), ms);
  } catch (exc) {
    if (exc instanceof DebounceConfigError) throw exc;
    const message = exc instanceof Error ? exc.message : String(exc);
    if (exc instanceof NotSent) {
      throw outage(new DebounceBackendError(
        `debounce Redis unreachable for reading the definition of ${task} (${message}); nothing was sent`));
    }
    throw outage(new DebounceBackendError(
      `debounce Redis: the definition of ${task} could not be read (${message}); nothing was written`));
  }
}

/** One EVALSHA of the gate for a prepared call, on the client's gate connection (see
 * gateConnection): written at most once; NOSCRIPT, which did not run, is followed by
 * SCRIPT LOAD and one more EVALSHA. */
export async function sendGate(redis: RedisClient, prepared: PreparedCall): Promise<GateResult> {
  const task = prepared.task;
  const ms = prepared.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  let reply: unknown;
  try {
    if (redis.status === "end") throw new NotSent("the client was closed (quit or disconnect)");
    const conn = gateConnection(redis);
    // a ready connection and a known script are used at once, without a turn of the loop
    if (conn.status !== "ready") await whenReady(conn, ms);
    const script = isCluster(conn) ? scriptKnown.get(conn) ?? await scriptFor(conn) : PLAIN;
    reply = await evalOnce(conn, script, prepared.keys, prepared.argv, ms);
  } catch (exc) {
    throw translate(exc, task);
  }
  return gateResult(reply);
}

/** Load `script` (SCRIPT LOAD, as the documented ACL allows; on a cluster into every
 * master). */
async function load(conn: RedisClient, script: Script, ms: number): Promise<void> {
  const nodes = isCluster(conn) ? conn.nodes("master") : [conn];
  await Promise.all(nodes.map((node) => once(conn, node.script("LOAD", script.text), ms)));
}

/** One EVALSHA of `script`, sent at most once: NOSCRIPT (it did not run) is followed by
 * SCRIPT LOAD and one more EVALSHA. */
async function evalOnce(conn: RedisClient, script: Script, keys: readonly string[],
                        argv: readonly string[], ms: number): Promise<unknown> {
  try {
    return await once(conn, conn.evalsha(script.sha, keys.length, ...keys, ...argv), ms);
  } catch (exc) {
    if (!(exc instanceof Error && exc.message.startsWith("NOSCRIPT"))) throw exc;
    await load(conn, script, ms);
    return once(conn, conn.evalsha(script.sha, keys.length, ...keys, ...argv), ms);
  }
}

/** The gate's reply as a GateResult. */
function gateResult(reply: unknown): GateResult {
  const row = reply as unknown[];
  return {
    taskId: String(row[0]), opened: Number(row[1]) === 1, deadlineMs: Number(row[2]),
    calls: Number(row[3]), nowMs: Number(row[4]), edge: row.length > 5 ? String(row[5]) : "",
  };
}

const argvBytes = (p: PreparedCall): number =>
  p.argv.reduce((sum, arg) => sum + Buffer.byteLength(arg), 0);

/** Many gate calls, in pipelines of at most `chunkSize` calls and CHUNK_BYTES (one round trip each; on a
 * Cluster one per shard's slot): each call written at most once. Per call its result, or
 * the error that kept it out (an unanswered one is DebounceOutcomeUnknown). */
export async function redisMany(redis: RedisClient, prepared: readonly PreparedCall[],
                                chunkSize: number): Promise<(GateResult | Error)[]> {
  const out: (GateResult | Error)[] = new Array(prepared.length);
  if (prepared.length === 0) return out;
  const task = prepared[0].task;
  const ms = prepared[0].timeoutMs;
  let conn: RedisClient;
  let script: Script;
  try {
    conn = await ready(redis, ms);
    script = isCluster(conn) ? scriptKnown.get(conn) ?? await scriptFor(conn) : PLAIN;
  } catch (exc) {
    return out.fill(translate(exc, task));
  }
  const groups = new Map<string, number[]>();  // a Cluster's pipeline holds one slot's keys
  prepared.forEach((p, i) => {
    const group = isCluster(conn) ? p.keys[1] : "";
    groups.set(group, [...(groups.get(group) ?? []), i]);
  });
  const send = async (indexes: number[]): Promise<number[]> => {
    const pipe = conn.pipeline();
    for (const i of indexes) pipe.evalsha(script.sha, 2, ...prepared[i].keys, ...prepared[i].argv);
    let replies: [Error | null, unknown][];
    try {
      replies = (await once(conn, pipe.exec(), ms)) as [Error | null, unknown][];
    } catch (exc) {
      for (const i of indexes) out[i] = translate(exc, task);
      return [];
    }
    const unloaded: number[] = [];
    replies.forEach(([error, reply], k) => {
      const i = indexes[k];
      if (error && error.message.startsWith("NOSCRIPT")) unloaded.push(i);  // it did not run
      else out[i] = error ? translate(error, task) : gateResult(reply);
    });
    return unloaded;
  };
  for (const indexes of groups.values()) {
    for (const chunk of chunked(indexes, chunkSize, (i) => argvBytes(prepared[i]))) {
      const unloaded = await send(chunk);
      if (unloaded.length) {
        try {
          await load(conn, script, ms);
        } catch (exc) {
          for (const i of unloaded) out[i] = translate(exc, task);
          continue;
        }
        await send(unloaded);
      }
    }
  }
  return out;
}

/** The gate's connection of `redis`, ready within `ms` (NotSent otherwise). */
async function ready(redis: RedisClient, ms: number): Promise<RedisClient> {
  if (redis.status === "end") throw new NotSent("the client was closed (quit or disconnect)");
  const conn = gateConnection(redis);
  if (conn.status !== "ready") await whenReady(conn, ms);
  return conn;
}

/** An operator's call as the package's errors: not sent, refused, or (`written`) lost. */
function operatorError(exc: unknown, what: string, written: boolean): Error {
  if (exc instanceof DebounceConfigError) return exc;
  const message = exc instanceof Error ? exc.message : String(exc);
  if (exc instanceof NotSent) {
    return new DebounceBackendError(`debounce Redis unreachable for ${what} (${message}); nothing was sent`);
  }
  if (!written || (exc instanceof Error && exc.name === "ReplyError")) {
    return new DebounceBackendError(`debounce Redis: ${what} failed (${message})`);
  }
  return new DebounceOutcomeUnknown(
    `the reply to ${what} was lost (${message}); the outcome is unknown, and it was not sent again`);
}

/** The pending window of a prepared call's (task, key), or null: one HMGET, one ZSCORE. */
export async function redisPending(redis: RedisClient, prepared: PreparedCall): Promise<WindowInfo | null> {
  const ms = prepared.timeoutMs;
  try {
    const conn = await ready(redis, ms);
    const [found, score] = await Promise.all([
      once(conn, conn.hmget(prepared.keys[0], "id", "fs", "mw", "n"), ms),
      once(conn, conn.zscore(prepared.keys[1], prepared.ident), ms),
    ]);
    if (found[0] === null) return null;
    return { taskId: found[0], firstSeenMs: Number(found[1]), maxWaitMs: Number(found[2]),
      calls: Number(found[3]), deadlineMs: Number(score) };
  } catch (exc) {
    throw operatorError(exc, `reading the window of ${prepared.task}`, false);
  }
}

/** Close the pending window of a prepared call's (task, key) and make it due now
 * (flush.lua, sent at most once); the window as flushed, or null when none was open. */
export async function redisFlush(redis: RedisClient, prepared: PreparedCall, prefix: string,
                                 recordTtlMs: number): Promise<WindowInfo | null> {
  const ms = prepared.timeoutMs;
  let reply: unknown;
  try {
    const conn = await ready(redis, ms);
    const sharded = isCluster(conn) && (scriptKnown.get(conn) ?? await scriptFor(conn)) === SHARDED;
    const script = sharded ? FLUSH_SHARDED : FLUSH;
    const tag = tagOf(prepared);
    const keys = [prepared.keys[0], prepared.keys[1], leasedKey(tag)];
    const argv = [prepared.ident, sharded ? shardWakeChannel(tag) : wakeChannel(prefix), "",
      String(recordTtlMs)];
    reply = await evalOnce(conn, script, keys, argv, ms);
  } catch (exc) {
    throw operatorError(exc, `the flush of ${prepared.task}'s window`, true);
  }
  if (!Array.isArray(reply)) return null;
  const [taskId, firstSeen, deadline, maxWait, calls] = reply as unknown[];
  return windowInfo(taskId, firstSeen, deadline, maxWait, calls);
}

/** Drop the pending window of a prepared call's (task, key) so that it never runs
 * (cancel.lua, sent at most once), its outcome handed to the dispatchers' expiry sweep,
 * which stores REVOKED for its id and aliases (the hand-off kept `recordTtlMs`); the
 * window as cancelled, or null. */
export async function redisCancel(redis: RedisClient, prepared: PreparedCall,
                                  recordTtlMs: number): Promise<WindowInfo | null> {
  const ms = prepared.timeoutMs;
  let reply: unknown;
  try {
    const conn = await ready(redis, ms);
    const keys = [prepared.keys[0], prepared.keys[1], statsKey(tagOf(prepared))];
    const argv = [prepared.ident, "", String(prepared.historyTtlMs), "", String(recordTtlMs)];
    reply = await evalOnce(conn, CANCEL, keys, argv, ms);
  } catch (exc) {
    throw operatorError(exc, `the cancel of ${prepared.task}'s window`, true);
  }
  if (!Array.isArray(reply)) return null;
  const [taskId, calls, firstSeen, deadline, maxWait] = reply as unknown[];
  return windowInfo(taskId, firstSeen, deadline, maxWait, calls);
}

/** A script's reply fields as a WindowInfo. */
function windowInfo(taskId: unknown, firstSeen: unknown, deadline: unknown, maxWait: unknown,
                    calls: unknown): WindowInfo {
  return { taskId: String(taskId), firstSeenMs: Number(firstSeen), deadlineMs: Number(deadline),
    maxWaitMs: Number(maxWait), calls: Number(calls) };
}

/** The shard's tag of a prepared call (its due key without ":due"). */
const tagOf = (prepared: PreparedCall): string =>
  prepared.keys[1].slice(0, prepared.keys[1].lastIndexOf(":"));
