/**
 * celery-debounced: debounce Celery tasks from Node.js. One call is one EVALSHA of the
 * gate script that the Python package's dispatcher and workers read, or one call of its
 * SQL function on the PostgreSQL store (docs/contract.md).
 */
import { anyBreakerOpen, breakerRefusal, isOutage, watched } from "./breaker.js";
import { type CeleryMessage, plainMessage } from "./broker.js";
import { cachedDefinition, definitionOf, type TaskDefinition } from "./definitions.js";
import {
  DebounceBackendError, DebounceBulkError, DebounceConfigError, DebounceOutcomeUnknown,
} from "./errors.js";
import {
  type Call, checkedOptions, checkedPrefix, checkedTask, type DebounceOptions, type GateResult,
  maxAgeOf, NO_OPTIONS, plans, prepare, type PreparedCall, probeOf, sameValues, timeoutOf,
  type WindowInfo,
} from "./plan.js";
import {
  isPostgres, postgresCancel, postgresFlush, postgresGate, type PostgresGateCall, type PostgresGateRow,
  postgresMany, postgresPending, type PostgresPool, type PostgresSession,
  readPostgresDefinition, schemaOf,
} from "./postgres.js";
import {
  isCluster, readDefinition, type RedisClient, redisCancel, redisFlush, redisMany, redisPending, sendGate,
} from "./redis.js";

export { CONTRACT_VERSION } from "./contract.js";
export { parseDuration, type Duration } from "./durations.js";
export * from "./errors.js";
export type { JsonValue } from "./pyjson.js";
export { GATE_SCRIPT } from "./gate-script.js";
export type { Parameter, ParameterKind } from "./binding.js";
export { DEFINITION_FORMAT, parseDefinition, type TaskDefinition } from "./definitions.js";
export type { PostgresConnection, PostgresPool } from "./postgres.js";
export {
  prepare, type Call, type DebounceOptions, type GateResult, type PreparedCall, type WindowInfo,
} from "./plan.js";
export { sendGate } from "./redis.js";
export { type BrokerRedis, type CeleryMessage, type Publisher, redisBroker } from "./broker.js";

/** An ioredis client (or Cluster) of the Redis store, or a node-postgres Pool of the
 * PostgreSQL store. */
type Client = RedisClient | PostgresPool;

/** Where a call of a task goes and how long it may take, from its options (checked once
 * per options object, then taken from its plan). */
interface Target {
  prefix: string;
  /** The definitions' cache key: the prefix, and on PostgreSQL the schema. */
  cacheKey: string;
  timeoutMs: number;
  maxAgeMs: number;
  probeMs: number;
  session: PostgresSession | undefined;
}

function targetOf(client: Client, task: string, options: DebounceOptions | undefined): Target {
  let prefix: string;
  let maxAgeMs: number;
  let timeoutMs: number;
  let probeMs: number;
  const known = plans.get(options ?? NO_OPTIONS);
  if (known !== undefined && known.task === task &&
      sameValues((options ?? NO_OPTIONS) as unknown as Record<string, unknown>, known)) {
    // the hot path: options seen before
    ({ prefix, maxAgeMs, timeoutMs, probeMs } = known);
  } else {
    const checked = checkedOptions(options);
    checkedTask(task);
    prefix = checkedPrefix(checked.prefix);
    timeoutMs = timeoutOf(checked);
    maxAgeMs = maxAgeOf(checked);
    probeMs = probeOf(checked);
  }
  if (isPostgres(client)) {
    const session = { schema: schemaOf(prefix, options?.schema), timeoutMs };
    const cacheKey = `${prefix}\u0001${session.schema ?? ""}`;
    return { prefix, cacheKey, timeoutMs, maxAgeMs, probeMs, session };
  }
  if (options?.schema !== undefined) {
    throw new DebounceConfigError("schema: a PostgreSQL option; this client is Redis's");
  }
  return { prefix, cacheKey: prefix, timeoutMs, maxAgeMs, probeMs, session: undefined };
}

/** The task's definition: the cached one, or the promise of one read now (one HGET, or one
 * query on PostgreSQL, then cached for `definitionMaxAge`). */
function definitionFor(client: Client, task: string,
                       t: Target): TaskDefinition | null | Promise<TaskDefinition | null> {
  const cached = cachedDefinition(client, t.cacheKey, task, t.maxAgeMs);
  if (cached !== undefined) return cached;
  const session = t.session;
  const read = (): Promise<string | null> => session !== undefined
    ? readPostgresDefinition(client as PostgresPool, session, task)
    : readDefinition(client as RedisClient, t.prefix, task, t.timeoutMs);
  return definitionOf(client, t.cacheKey, task, t.maxAgeMs, read);
}

/** Send one call through the gate: open the window of (task, key) or join it, as the
 * task's published definition says. */
export function gate(client: Client, task: string, call: Call,
                     options?: DebounceOptions): Promise<GateResult> {
  const done = gateOnce(client, task, call, options);
  return options?.onOutage === "publish"
    ? done.catch((exc: unknown) => publishPlainly(exc, client, task, call, options))
    : done;
}

/** After a call the store did not take for an outage, with `onOutage: "publish"`: the call
 * as a plain message, undebounced (Python's Fallback). */
async function publishPlainly(exc: unknown, client: Client, task: string, call: Call,
                              options: DebounceOptions): Promise<GateResult> {
  const p = prepare(task, call, options, false, plainRoute(exc, client, task, options));
  const id = await sendPlain(exc, options, messageOf(p, call?.taskId));
  const now = Date.now();
  return { taskId: id, opened: false, deadlineMs: now, calls: 1, nowMs: now, edge: "", published: true };
}

/** The definition a plain message of `task` is made by: the one this client read last,
 * however old (null: it read that the task has none, and the call's options are the
 * task's). A task whose definition was never read is not published: its route and its
 * shape (a collect task's run takes a list) are unknown, so `exc` is raised. */
function plainRoute(exc: unknown, client: Client, task: string,
                    options: DebounceOptions): TaskDefinition | null {
  if (!isOutage(exc)) throw exc;
  const t = targetOf(client, task, options);
  const definition = cachedDefinition(client, t.cacheKey, task, Infinity);
  if (definition === undefined) {
    (exc as Error).message += "; not published plainly either (onOutage=\"publish\"): this " +
      "client has not read the task's definition yet, so its route and shape are unknown";
    throw exc;
  }
  return definition;
}

/** A prepared call as a plain message (with the caller's own id, if any). */
const messageOf = (p: PreparedCall, taskId: string | undefined): CeleryMessage =>
  plainMessage(p.task, p.encoded, p.optionsJson, p.collect, taskId);

/** `message` sent by the caller's publisher, waited for `timeout` at most (a publisher
 * that never settles must not hold the call forever); its id. */
async function sendPlain(exc: unknown, options: DebounceOptions, message: CeleryMessage): Promise<string> {
  const ms = timeoutOf(options);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"late">((resolve) => { timer = setTimeout(() => resolve("late"), ms); });
  try {
    if (await Promise.race([Promise.resolve(options.publish!(message)), late]) === "late") {
      throw new DebounceOutcomeUnknown(
        `${(exc as Error).message}; publishing the call plainly (onOutage="publish") did ` +
        `not finish within ${ms} ms: it may or may not have been published`);
    }
  } catch (error) {
    if (error instanceof DebounceOutcomeUnknown) throw error;
    throw new DebounceBackendError(
      `${(exc as Error).message}; publishing the call plainly (onOutage="publish") failed ` +
      `too: ${error instanceof Error ? error.message : String(error)}`);
  } finally {
    clearTimeout(timer);
  }
  return String(message.headers.id);
}

function gateOnce(client: Client, task: string, call: Call,
                  options?: DebounceOptions): Promise<GateResult> {
  let t: Target;
  let found: TaskDefinition | null | Promise<TaskDefinition | null>;
  try {
    t = targetOf(client, task, options);
    if (anyBreakerOpen()) {
      const refused = breakerRefusal(client, t.timeoutMs);
      if (refused !== undefined) return Promise.reject(refused);
    }
    found = definitionFor(client, task, t);
    if (!(found instanceof Promise)) {
      return watched(client, t.timeoutMs, t.probeMs, send(client, t.session, task, call, options, found));
    }
  } catch (exc) {
    return Promise.reject(exc);  // a refusal rejects, as from an async function
  }
  const session = t.session;
  return watched(client, t.timeoutMs, t.probeMs,
    found.then((definition) => send(client, session, task, call, options, definition)));
}

/** The target of calls of `task`, its definition, and whether the client is a Redis
 * Cluster's: what an operator's call and `debounceMany` prepare their calls against. */
async function resolved(client: Client, task: string, options: DebounceOptions | undefined):
    Promise<[Target, TaskDefinition | null, boolean]> {
  const t = targetOf(client, task, options);
  return [t, await definitionFor(client, task, t), !t.session && isCluster(client)];
}

/** The pending window a call with these arguments would join (its key resolved as
 * `debounce()` resolves it), or null: what Python's `task.debounce_pending(...)` reads. */
export async function pendingWindow(client: Client, task: string, call: Call,
                                    options?: DebounceOptions): Promise<WindowInfo | null> {
  const [t, definition, cluster] = await resolved(client, task, options);
  const p = prepare(task, call, options, cluster, definition);
  return t.session !== undefined
    ? postgresPending(client as PostgresPool, t.session, p.ident)
    : redisPending(client as RedisClient, p);
}

/** Close the pending window a call with these arguments would join and make it due now
 * (dispatchers publish it at once; the next call opens a new window): Python's
 * `task.debounce_flush(...)`. The window as flushed, or null when none was open. Sent at
 * most once: a lost reply is `DebounceOutcomeUnknown`. */
export async function flushWindow(client: Client, task: string, call: Call,
                                  options?: DebounceOptions): Promise<WindowInfo | null> {
  const [t, definition, cluster] = await resolved(client, task, options);
  const p = prepare(task, call, options, cluster, definition);
  return t.session !== undefined
    ? postgresFlush(client as PostgresPool, t.session, task, p.ident)
    : redisFlush(client as RedisClient, p, t.prefix, definition?.record_ttl_ms ?? DEFAULT_RECORD_TTL_MS);
}

/** Drop the pending window a call with these arguments would join, so that it never
 * runs: Python's `task.debounce_cancel(...)`. Its result is marked REVOKED by the
 * deployment's dispatchers (the expiry sweep, within about a second, for its id and every
 * id a caller fixed on it), since this package does not reach the result backend. The
 * window as cancelled, or null when none was open. Sent at most once: a lost reply is
 * `DebounceOutcomeUnknown`. */
export async function cancelWindow(client: Client, task: string, call: Call,
                                   options?: DebounceOptions): Promise<WindowInfo | null> {
  const [t, definition, cluster] = await resolved(client, task, options);
  const p = prepare(task, call, options, cluster, definition);
  const recordTtlMs = definition?.record_ttl_ms ?? DEFAULT_RECORD_TTL_MS;
  return t.session !== undefined
    ? postgresCancel(client as PostgresPool, t.session, task, p.ident, p.historyTtlMs, recordTtlMs)
    : redisCancel(client as RedisClient, p, recordTtlMs);
}

/** Python's `debounce_record_ttl` default (ms). */
const DEFAULT_RECORD_TTL_MS = 7 * 86_400_000;

/** The call prepared against `definition`, sent to the client's store. */
function send(client: Client, session: PostgresSession | undefined, task: string, call: Call,
              options: DebounceOptions | undefined,
              definition: TaskDefinition | null): Promise<GateResult> {
  if (session === undefined) {
    const redis = client as RedisClient;
    return sendGate(redis, prepare(task, call, options, isCluster(redis), definition));
  }
  const p = prepare(task, call, options, false, definition);
  return postgresGate(client as PostgresPool, session, postgresCall(p)).then(fromRow);
}

/** What debounce_gate takes of a prepared call (its ARGV, as gate.lua's header lays it out). */
function postgresCall(p: PreparedCall): PostgresGateCall {
  return {
    task: p.task, ident: p.ident, taskId: p.argv[0], windowMs: p.argv[1], maxWaitMs: p.argv[2],
    replace: p.argv[3].endsWith("1"), body: p.body, optionsJson: p.argv[6],
    exclusive: p.exclusive, maxCalls: p.argv[11] ?? "", edge: p.argv[12] ?? "",
    historyTtlMs: p.historyTtlMs, budget: p.argv[14] ?? "", collectEmbed: p.argv[15] ?? "",
    alias: p.argv[7] ?? "", fallbackId: p.argv[8] ?? "",
  };
}

const fromRow = ([taskId, opened, deadlineMs, calls, nowMs, edge]: PostgresGateRow): GateResult =>
  ({ taskId, opened, deadlineMs, calls, nowMs, edge });

/**
 * Debounce many calls of `task` at once, as many `debounce()` calls in order but sent in
 * chunks of `chunkSize` (one round trip each; Python's `enqueue_many`). Every call is
 * checked first: one refused, nothing is written. Resolves to each call's window id, in
 * order; when some calls were not written it rejects with DebounceBulkError, which says
 * which (and which are unknown: their reply was lost).
 */
export async function debounceMany(client: Client, task: string, calls: readonly Call[],
                                   options?: DebounceOptions, chunkSize = 1000): Promise<string[]> {
  if (!Number.isSafeInteger(chunkSize) || chunkSize < 1) {
    throw new DebounceConfigError(`chunkSize=${JSON.stringify(chunkSize)}: expected a positive integer`);
  }
  if (!Array.isArray(calls)) throw new DebounceConfigError("calls: expected an array of calls");
  let t: Target, definition: TaskDefinition | null, cluster: boolean;
  try {
    [t, definition, cluster] = await resolved(client, task, options);
  } catch (exc) {
    if (options?.onOutage !== "publish") throw exc;
    const route = plainRoute(exc, client, task, options);
    const messages = calls.map((call) =>  // every call checked before any is sent
      messageOf(prepare(task, call, options, false, route), call?.taskId));
    const ids: string[] = [];
    for (const message of messages) ids.push(await sendPlain(exc, options, message));
    return ids;
  }
  const prepared = calls.map((call) => prepare(task, call, options, cluster, definition));
  const outcomes: (GateResult | Error)[] = t.session !== undefined
    ? (await postgresMany(client as PostgresPool, t.session, prepared.map(postgresCall), chunkSize))
      .map((o) => (o instanceof Error ? o : fromRow(o)))
    : await redisMany(client as RedisClient, prepared, chunkSize);
  const errors = new Map<number, Error>();
  outcomes.forEach((o, i) => { if (o instanceof Error) errors.set(i, o); });
  const taskIds = outcomes.map((o) => (o instanceof Error ? null : o.taskId));
  if (options?.onOutage === "publish") {  // the calls an outage kept out: published plainly
    for (const [i, error] of [...errors]) {
      if (!isOutage(error)) continue;
      try {
        taskIds[i] = await sendPlain(error, options, messageOf(prepared[i], calls[i]?.taskId));
        errors.delete(i);
      } catch (failed) {
        errors.set(i, failed as Error);
      }
    }
  }
  if (errors.size) {
    const unknown = [...errors].filter(([, e]) => e instanceof DebounceOutcomeUnknown).map(([i]) => i);
    const first = errors.values().next().value as Error;
    throw new DebounceBulkError(
      `debounceMany: ${errors.size} of ${calls.length} call(s) not written (first error: ` +
      `${first.message}); see .errors and .unknown`, taskIds, errors, unknown);
  }
  return taskIds as string[];
}

const taskIdOf = (result: GateResult): string => result.taskId;

/**
 * Debounce one call of the Celery task `task`: resolves to the window's task id (every
 * call of one window gets the same id; the Python dispatcher publishes it when due).
 *
 *     await debounce(redis, "proj.build_report", { args: ["u1"] },
 *                    { debounce: "5m", key: "report:{0}", maxWait: "30m" })
 */
export function debounce(client: Client, task: string, call: Call,
                         options?: DebounceOptions): Promise<string> {
  return gate(client, task, call, options).then(taskIdOf);
}
