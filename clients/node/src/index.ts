/**
 * celery-debounced: debounce Celery tasks from Node.js. One call is one EVALSHA of the
 * gate script that the Python package's dispatcher and workers read (docs/contract.md).
 */
import { createHash, randomUUID } from "node:crypto";
import type { Cluster, Redis } from "ioredis";
import { CONTRACT_VERSION } from "./contract.js";
import { type Duration, parseDuration } from "./durations.js";
import {
  DebounceBackendError, DebounceConfigError, DebounceContractMismatch, DebounceKeyError,
  DebounceOutcomeUnknown, DebouncePayloadError,
} from "./errors.js";
import { BindError, bindArguments, UnusableDefault } from "./binding.js";
import { cachedDefinition, definitionOf, type TaskDefinition } from "./definitions.js";
import { GATE_SCRIPT } from "./gate-script.js";
import { blake2bHex } from "./hashes.js";
import { shardOf, shardTag, windowIdent } from "./layout.js";
import {
  isPostgres, postgresGate, type PostgresPool, type PostgresSession, readPostgresDefinition,
  schemaOf,
} from "./postgres.js";
import { pyJson } from "./pyjson.js";
import { type KeyTemplate, parseTemplate, resolveTemplate } from "./templates.js";

export { CONTRACT_VERSION } from "./contract.js";
export { parseDuration, type Duration } from "./durations.js";
export * from "./errors.js";
export type { JsonValue } from "./pyjson.js";
export { GATE_SCRIPT } from "./gate-script.js";
export type { Parameter, ParameterKind } from "./binding.js";
export { DEFINITION_FORMAT, parseDefinition, type TaskDefinition } from "./definitions.js";
export type { PostgresConnection, PostgresPool } from "./postgres.js";

/** A call's arguments: Celery's `args` and `kwargs`. */
export interface Call {
  /** Celery's `args`: values JSON carries as Python would (see JsonValue); any other is
   * refused with DebounceEncodeError, nothing sent. Typed loosely so that values typed by
   * an interface are accepted: an interface has no index signature. */
  args?: readonly unknown[];
  /** Celery's `kwargs`: an object of such values. */
  kwargs?: object;
}

/** How the call is debounced, and where the windows live. Each option left out is the
 * task's own, from the definition the Python app published (docs/node.md, "Task
 * definitions"); for a task with none, `debounce` and `maxWait` are required and the rest
 * are the Python settings' defaults. */
export interface DebounceOptions {
  /** The quiet window: seconds, or "250ms", "10s", "5m", "1h30m"... */
  debounce?: Duration;
  /** The ceiling: the task runs at most this long after the window's first call. */
  maxWait?: Duration;
  /** Key template ("report:{0}", "{user_id}", "{0.user.id}"); absent: a digest of the arguments. */
  key?: string;
  /** A joining call's arguments replace the window's (default false: the opener's run). */
  replacePayload?: boolean;
  /** `debounce_max_calls`: the window is due at once when it holds this many calls. */
  maxCalls?: number | null;
  /** `debounce_leading`: the first call of a burst runs at once. */
  leading?: boolean;
  /** `debounce_trailing` (default true): the burst's window runs when it goes quiet. */
  trailing?: boolean;
  /** How long a task's definition read from the store is used before it is read again
   * (default "5s"). */
  definitionMaxAge?: Duration;
  /** PostgreSQL: `debounce_postgres_schema` (default: the schema `prefix` names, none for
   * the default prefix: the connection's search_path). */
  schema?: string;
  /** `debounce_exclusive`: runs of one key never overlap (default: the task's). */
  exclusive?: boolean;
  /** Celery's `queue`, `routing_key`, `exchange` and `priority` of the run's message
   * (default: the task's route and options, from its definition). */
  queue?: string;
  routingKey?: string;
  exchange?: string;
  priority?: number;
  /** What a call does when the store does not answer: "raise" (the default; Python's
   * `debounce_on_outage`). After a call that waited its whole `timeout`, calls fail at
   * once for `outageProbeInterval` (default 1 s), then one call at a time tries again. */
  onOutage?: "raise";
  outageProbeInterval?: Duration;
  /** `debounce_key_prefix` (default "debounce"). */
  prefix?: string;
  /** `debounce_shards` (default 1). */
  shards?: number;
  /** `debounce_redis_cluster` (default: whether the client is an ioredis Cluster). */
  cluster?: boolean;
  /** `debounce_max_key_length` (default 1024). */
  maxKeyLength?: number;
  /** `debounce_max_payload_bytes` (default 1048576). */
  maxPayloadBytes?: number;
  /** `debounce_redis_timeout` (default "2s"): how long a call waits for the connection,
   * and then for each reply, before it rejects. */
  timeout?: Duration;
}

const KNOWN = ["debounce", "maxWait", "key", "replacePayload", "maxCalls", "leading", "trailing",
  "prefix", "shards", "cluster", "maxKeyLength", "maxPayloadBytes", "timeout", "definitionMaxAge",
  "schema", "exclusive", "queue", "routingKey", "exchange", "priority", "onOutage",
  "outageProbeInterval"];

/** Python's `debounce_history_ttl` default (ms). */
const DEFAULT_HISTORY_TTL_MS = 3_600_000;
/** Python's largest `debounce_max_calls`. */
const MAX_CALLS_LIMIT = 2 ** 31 - 1;
const DEFAULT_DEFINITION_MAX_AGE_MS = 5000;
/** Python's `debounce_outage_probe_interval` default. */
const DEFAULT_PROBE_MS = 1000;

/** Python's `debounce_redis_timeout` default. */
const DEFAULT_TIMEOUT_MS = 2000;

/** What one call sends to the gate. */
export interface PreparedCall {
  task: string;
  key: string;
  ident: string;
  shard: number;
  keys: [string, string];
  /** ARGV of gate.lua: task id, window ms, max wait ms, `<version>:<replace>`, content type, body, options. */
  argv: string[];
  body: string;
  /** How long the call waits for the connection, then for each reply (ms). */
  timeoutMs: number;
  /** `debounce_exclusive` (on Redis carried in the options JSON; PostgreSQL takes it apart). */
  exclusive: boolean;
  /** `debounce_history_ttl` in ms (the counters' and quiet periods' TTL). */
  historyTtlMs: number;
}

/** What the gate decided (times are Redis server ms). */
export interface GateResult {
  taskId: string;
  opened: boolean;
  deadlineMs: number;
  calls: number;
  nowMs: number;
  /** "lead" (this call runs at once) or "suppressed" (folded into the leading run
   * `taskId`) for a call with `leading`, else "". */
  edge: string;
}

function distance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0];
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const here = row[j];
      row[j] = Math.min(row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = here;
    }
  }
  return row[b.length];
}

function positiveInt(name: string, value: unknown, fallback: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 1) {
    throw new DebounceConfigError(`${name}=${JSON.stringify(value)}: expected a positive integer`);
  }
  return value;
}

function codePoints(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0xd800 || c > 0xdbff || i + 1 >= text.length) n++;
    else { const d = text.charCodeAt(i + 1); n++; if (d >= 0xdc00 && d <= 0xdfff) i++; }
  }
  return n;
}

/** What a call derives from its task, its options and its task's definition alone: made
 * once per (options object, task, client kind, definition), and made again whenever one
 * of the options' values changed. */
interface Plan {
  task: string;
  clusterClient: boolean;
  definition: TaskDefinition | null;
  /** The options' values it was made from, in KNOWN's order. */
  values: unknown[];
  template: KeyTemplate | undefined;
  prefix: string;
  shards: number;
  cluster: boolean;
  maxKeyLength: number;
  maxPayloadBytes: number;
  timeoutMs: number;
  /** How long a definition read is used (definitionMaxAge). */
  maxAgeMs: number;
  /** How long calls fail at once after a call that waited its timeout (outageProbeInterval). */
  probeMs: number;
  /** ARGV 2..4: window ms, max wait ms, `<version>:<replace>`. */
  windowText: string;
  maxWaitText: string;
  versionReplace: string;
  /** ARGV 7: the options JSON the window stores ('' for {}). */
  optionsJson: string;
  /** ARGV 12 onwards: the cap, the edge mode and the history TTL, as far as given. */
  tail: string[];
  exclusive: boolean;
  historyTtlMs: number;
  /** The parameters calls are bound to (null: not bound), and whether a call that does
   * not fit them is refused (the task's `typing`). */
  signature: TaskDefinition["signature"];
  checkArguments: boolean;
  /** `<UTF-8 bytes of task>:<task>:`, or undefined for a task name that is not valid Unicode. */
  identHead: string | undefined;
  /** Per shard: the open key's start and the due key. */
  shardKeys: ([string, string] | undefined)[];
}

const KNOWN_NAMES = new Set(KNOWN);
const plans = new WeakMap<object, Plan>();

function checkedPrefix(prefix: unknown): string {
  const value = prefix ?? "debounce";
  if (typeof value !== "string" || !value || /[{}]/.test(value)) {
    throw new DebounceConfigError(`prefix=${JSON.stringify(value)}: expected a non-empty string without braces`);
  }
  return value;
}

function checkedTask(task: unknown): void {
  if (typeof task !== "string" || !task) {
    throw new DebounceConfigError(`task name ${JSON.stringify(task)}: expected a non-empty string`);
  }
}

function flag(name: string, value: unknown, fallback: boolean): boolean {
  if (value === undefined || value === null) return fallback;
  if (typeof value !== "boolean") {
    throw new DebounceConfigError(`${name}=${JSON.stringify(value)}: expected true or false`);
  }
  return value;
}

function maxCallsOf(options: DebounceOptions, d: TaskDefinition | null): number | null {
  const value = options.maxCalls === undefined ? d?.max_calls ?? null : options.maxCalls;
  if (value === null) return null;
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 1 || value > MAX_CALLS_LIMIT) {
    throw new DebounceConfigError(
      `maxCalls=${JSON.stringify(value)}: expected an integer from 1 to ${MAX_CALLS_LIMIT}, or null`);
  }
  return value;
}

/** The window's and ceiling's ms: the call's options, else the definition's. */
function windowOf(task: string, options: DebounceOptions, d: TaskDefinition | null): [number, number] {
  const given = (v: unknown): boolean => v !== undefined && v !== null;
  if (!given(options.debounce) && d === null) {
    throw new DebounceConfigError(
      `${task}: no definition of this task is published under this prefix in this database, ` +
      "and the call gives no debounce: pass debounce and maxWait, or publish the task's " +
      "definition (a worker of the app writes it as it starts; `celery -A proj debounce " +
      "publish` at deploy time). Check prefix and the client's database if it is published");
  }
  const windowMs = given(options.debounce) ? parseDuration("debounce", options.debounce!) : d!.debounce_ms;
  if (!given(options.maxWait) && d === null) {
    throw new DebounceConfigError(
      `debounce=${JSON.stringify(options.debounce)} needs maxWait: the max wait is the ceiling ` +
      "that guarantees the task runs");
  }
  const maxWaitMs = given(options.maxWait) ? parseDuration("maxWait", options.maxWait!) : d!.max_wait_ms;
  if (maxWaitMs < windowMs) {
    throw new DebounceConfigError(
      `maxWait=${JSON.stringify(options.maxWait ?? `${maxWaitMs}ms`)} is shorter than debounce=` +
      `${JSON.stringify(options.debounce ?? `${windowMs}ms`)}; the max wait must be at least the window`);
  }
  return [windowMs, maxWaitMs];
}

/** The definition's refusals: what this producer cannot call as Python would. */
function refuseUncallable(task: string, d: TaskDefinition | null): void {
  if (d === null) return;
  if (d.collect) {
    throw new DebounceConfigError(
      `${task}: a debounce_collect task (its run takes the list of calls) cannot be called ` +
      "from this producer; nothing was written");
  }
  if (!d.accepts_json) {
    throw new DebounceConfigError(
      `${task}: the app does not accept JSON (accept_content), and this producer writes JSON; ` +
      "nothing was written");
  }
}

/** ARGV 12 onwards (gate.lua's header): the cap, then the edge mode and history TTL. */
function argvTail(maxCalls: number | null, leading: boolean, trailing: boolean,
                  historyTtlMs: number): string[] {
  const tail: string[] = [];
  if (maxCalls !== null) tail.push(String(maxCalls));
  if (leading) {
    if (maxCalls === null) tail.push("");
    tail.push(trailing ? "B" : "L", String(historyTtlMs));
  }
  return tail;
}

function makePlan(task: string, options: DebounceOptions, clusterClient: boolean,
                  values: unknown[], d: TaskDefinition | null): Plan {
  const prefix = checkedPrefix(options.prefix);
  const shards = positiveInt("shards", options.shards, d?.shards ?? 1);
  const maxKeyLength = positiveInt("maxKeyLength", options.maxKeyLength, d?.max_key_length ?? 1024);
  const maxPayloadBytes = positiveInt("maxPayloadBytes", options.maxPayloadBytes,
    d?.max_payload_bytes ?? 1024 * 1024);
  const timeoutMs = timeoutOf(options);
  const maxAgeMs = maxAgeOf(options);
  const probeMs = probeOf(options);
  const cluster = flag("cluster", options.cluster, clusterClient);
  checkedTask(task);
  refuseUncallable(task, d);
  const [windowMs, maxWaitMs] = windowOf(task, options, d);
  const key = options.key ?? d?.key ?? undefined;
  const template: KeyTemplate | undefined = key === undefined ? undefined : parseTemplate(key);
  const replace = flag("replacePayload", options.replacePayload, d?.replace_payload ?? false);
  const maxCalls = maxCallsOf(options, d);
  const leading = flag("leading", options.leading, d?.leading ?? false);
  const trailing = flag("trailing", options.trailing, d?.trailing ?? true);
  if (!leading && !trailing) {
    throw new DebounceConfigError(
      "leading=false, trailing=false: the task would never run; set at least one of them to true");
  }
  const exclusive = flag("exclusive", options.exclusive, d?.exclusive ?? false);
  if (exclusive && (leading || maxCalls !== null)) {
    throw new DebounceConfigError(
      `exclusive with ${leading ? "leading=true" : `maxCalls=${maxCalls}`}: a run that ` +
      "cannot wait for a run of its key to end (as in Python)");
  }
  let maxWaitText = String(maxWaitMs);
  const expires = d?.result_expires_ms ?? null;
  if (leading && !trailing && expires !== null && expires < maxWaitMs) {
    maxWaitText = String(expires);  // the quiet period never outlasts the leading run's result
  }
  let identHead: string | undefined;
  try {
    identHead = windowIdent(task, "");
  } catch {
    identHead = undefined;  // refused per call, after the checks of the call's arguments
  }
  return {
    task, clusterClient, definition: d, values, template, prefix, shards, cluster, maxKeyLength,
    maxPayloadBytes, timeoutMs, maxAgeMs, probeMs, windowText: String(windowMs), maxWaitText,
    versionReplace: `${CONTRACT_VERSION}:${replace ? "1" : "0"}`,
    optionsJson: messageOptions(options, d, exclusive),
    tail: argvTail(maxCalls, leading, trailing, d?.history_ttl_ms ?? DEFAULT_HISTORY_TTL_MS),
    exclusive, historyTtlMs: d?.history_ttl_ms ?? DEFAULT_HISTORY_TTL_MS,
    signature: d?.signature ?? null, checkArguments: d?.check_arguments ?? false,
    identHead, shardKeys: [],
  };
}

/** ARGV[7]: the options JSON the window stores: the definition's (a Python call's without
 * options of its own), with the call's routing and exclusive flag over it ('' for {}). */
function messageOptions(options: DebounceOptions, d: TaskDefinition | null,
                        exclusive: boolean): string {
  const base = d === null || d.options === "{}" ? "" : d.options;
  const routed = options.queue !== undefined || options.routingKey !== undefined ||
    options.exchange !== undefined || options.priority !== undefined;
  if (!routed && exclusive === (d?.exclusive ?? false)) return base;
  const out = (base ? JSON.parse(base) : {}) as Record<string, unknown>;
  const text = (name: string, value: unknown): string => {
    if (typeof value !== "string" || !value) {
      throw new DebounceConfigError(`${name}=${JSON.stringify(value)}: expected a non-empty string`);
    }
    return value;
  };
  if (options.queue !== undefined) out.queue = text("queue", options.queue);
  if (options.routingKey !== undefined) out.routing_key = text("routingKey", options.routingKey);
  if (options.exchange !== undefined) out.exchange = text("exchange", options.exchange);
  if (options.priority !== undefined) {
    const p = options.priority;
    if (typeof p !== "number" || !Number.isInteger(p) || p < 0 || p > 255) {
      throw new DebounceConfigError(`priority=${JSON.stringify(p)}: expected an integer from 0 to 255`);
    }
    out.priority = p;
  }
  const headers = { ...(out.headers as Record<string, unknown> | undefined) };
  if (exclusive) headers.debounce_exclusive = 1; else delete headers.debounce_exclusive;
  if (Object.keys(headers).length) out.headers = headers; else delete out.headers;
  return Object.keys(out).length ? JSON.stringify(out) : "";
}

/** `outageProbeInterval` in ms (after `onOutage` is checked: Node raises only). */
function probeOf(options: DebounceOptions): number {
  if (options.onOutage !== undefined && options.onOutage !== "raise") {
    throw new DebounceConfigError(
      `onOutage=${JSON.stringify(options.onOutage)}: a Node producer can only raise (it ` +
      "has no broker connection to publish the call plainly, as Python's \"publish\" does)");
  }
  return options.outageProbeInterval === undefined ? DEFAULT_PROBE_MS
    : parseDuration("outageProbeInterval", options.outageProbeInterval);
}

function maxAgeOf(options: DebounceOptions): number {
  return options.definitionMaxAge === undefined ? DEFAULT_DEFINITION_MAX_AGE_MS
    : parseDuration("definitionMaxAge", options.definitionMaxAge);
}

function timeoutOf(options: DebounceOptions): number {
  return options.timeout === undefined ? DEFAULT_TIMEOUT_MS : parseDuration("timeout", options.timeout);
}

function checkedOptions(options: unknown): DebounceOptions {
  if (options === undefined) return {};
  if (options === null || typeof options !== "object") {
    throw new DebounceConfigError("options: expected an object (or nothing)");
  }
  const record = options as Record<string, unknown>;
  for (const name of Object.keys(record)) {
    if (!KNOWN_NAMES.has(name)) {
      const close = [...KNOWN].sort((a, b) => distance(name, a) - distance(name, b))[0];
      throw new DebounceConfigError(
        `${name}=${JSON.stringify(record[name])}: unknown option; did you mean '${close}'?`);
    }
  }
  return options as DebounceOptions;
}

const NO_OPTIONS: DebounceOptions = Object.freeze({});

/** The options' values are those `plan` was made from. */
function sameValues(record: Record<string, unknown>, plan: Plan): boolean {
  for (let i = 0; i < KNOWN.length; i++) if (record[KNOWN[i]] !== plan.values[i]) return false;
  return true;
}

/** The plan of (task, options, definition), checked anew only when an option's value changed. */
function planOf(task: string, options: DebounceOptions, clusterClient: boolean,
                definition: TaskDefinition | null): Plan {
  const record = options as unknown as Record<string, unknown>;
  const known = plans.get(options);
  if (known !== undefined && known.task === task && known.clusterClient === clusterClient &&
      known.definition === definition && sameValues(record, known)) {
    return known;
  }
  const plan = makePlan(task, options, clusterClient, KNOWN.map((name) => record[name]), definition);
  plans.set(options, plan);
  return plan;
}

/** `[positional, named]` the key is made of: bound to the published signature, if any. */
function boundArguments(plan: Plan, args: readonly unknown[],
                        kwargs: Record<string, unknown>): [readonly unknown[], Record<string, unknown>] {
  if (plan.signature === null) return [args, kwargs];
  try {
    return bindArguments(plan.signature, args, kwargs);
  } catch (exc) {
    if (exc instanceof UnusableDefault) {
      throw new DebounceConfigError(
        `${plan.task}: the call leaves out ${JSON.stringify(exc.parameter)}, whose default only ` +
        "Python can hold (a date, a float such as 1.0, an object): pass it on the call");
    }
    if (!(exc instanceof BindError)) throw exc;
    if (plan.checkArguments) {
      throw new DebounceConfigError(
        `${plan.task}: the arguments do not match the task's signature (${exc.message}); ` +
        "a Python call would raise TypeError");
    }
    if (plan.template) {
      throw new DebounceKeyError(
        `${plan.task}: key ${plan.template.shown} cannot be resolved: the arguments do not ` +
        `match the task's signature (${exc.message})`);
    }
    return [args, kwargs];
  }
}

/** Everything a call sends to the gate, with every check made first (nothing is sent on
 * an error): the vectors of contract/vectors.json are checked against this. */
export function prepare(task: string, call: Call, options?: DebounceOptions,
                        clusterClient = false, definition: TaskDefinition | null = null): PreparedCall {
  const plan = planOf(task, options === undefined ? NO_OPTIONS : checkedOptions(options),
    clusterClient, definition);
  const template = plan.template;
  const args = call?.args ?? [];
  const kwargs = call?.kwargs ?? {};
  if (!Array.isArray(args)) throw new DebounceConfigError("args: task args must be an array");
  if (kwargs === null || typeof kwargs !== "object" || Array.isArray(kwargs)) {
    throw new DebounceConfigError("kwargs: task keyword arguments must be an object");
  }
  const [positional, named] = boundArguments(plan, args, kwargs as Record<string, unknown>);
  let key = template ? resolveTemplate(template, positional, named) : "";
  const body = `[${pyJson(args, false, "args")}, ${pyJson(kwargs, false, "kwargs")}, {}]`;
  if (body.length > plan.maxPayloadBytes) {  // the body is ASCII: characters are bytes
    throw new DebouncePayloadError(
      `${task}: arguments serialize to ${body.length} bytes, above maxPayloadBytes=${plan.maxPayloadBytes}`);
  }
  if (!template) key = "args:" + blake2bHex(Buffer.from(pyJson([positional, named], true), "ascii"));
  // a string has at most as many code points as UTF-16 units: count them only when over
  const length = key.length > plan.maxKeyLength ? codePoints(key) : key.length;
  if (length > plan.maxKeyLength) {
    throw new DebounceKeyError(
      `key resolved to ${length} characters (${JSON.stringify(key.slice(0, 40))}...), above ` +
      `maxKeyLength=${plan.maxKeyLength}`);
  }
  const ident = plan.identHead === undefined ? windowIdent(task, key) : plan.identHead + key;
  const shard = shardOf(ident, plan.shards);
  let keys = plan.shardKeys[shard];
  if (keys === undefined) {
    const tag = shardTag(plan.prefix, shard, plan.shards, plan.cluster);
    keys = plan.shardKeys[shard] = [`${tag}:open:`, `${tag}:due`];
  }
  return {
    task, key, ident, shard, body, timeoutMs: plan.timeoutMs, exclusive: plan.exclusive,
    historyTtlMs: plan.historyTtlMs,
    keys: [keys[0] + ident, keys[1]],
    // a fresh id: a caller's own id needs the fixed-id ARGV group (aliases), not offered here
    argv: [randomUUID(), plan.windowText, plan.maxWaitText, plan.versionReplace, "", body,
      plan.optionsJson, ...(plan.tail.length ? ["", "", "", "", ...plan.tail] : [])],
  };
}

type RedisClient = Redis | Cluster;
/** An ioredis client (or Cluster) of the Redis store, or a node-postgres Pool of the
 * PostgreSQL store. */
type Client = RedisClient | PostgresPool;

interface Script { text: string; sha: string }
const sha1 = (text: string): string => createHash("sha1").update(text, "utf8").digest("hex");
const PLAIN: Script = { text: GATE_SCRIPT, sha: sha1(GATE_SCRIPT) };
const SHARDED_TEXT = GATE_SCRIPT.replace("local SHARDED_WAKE = false", "local SHARDED_WAKE = true");
const SHARDED: Script = { text: SHARDED_TEXT, sha: sha1(SHARDED_TEXT) };
const scriptOf = new WeakMap<object, Promise<Script>>();
/** The scripts of scriptOf once known, so that a call need not wait for them. */
const scriptKnown = new WeakMap<object, Script>();

function isCluster(redis: object): redis is Cluster {
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
      if (error) reject(new NotSent(error.message)); else resolve();
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
    return new DebounceBackendError(
      `debounce Redis unreachable for the gate call of ${task} (${message}); nothing was sent`);
  }
  return new DebounceOutcomeUnknown(
    `the reply to the gate call of ${task} was lost (${message}); the outcome is unknown: it ` +
    "may or may not have run, and it was not sent again");
}

/** Send one call through the gate: open the window of (task, key) or join it. The task's
 * published definition is read first (one HGET, or one query on PostgreSQL, then cached
 * for `definitionMaxAge`). */
export function gate(client: Client, task: string, call: Call,
                     options?: DebounceOptions): Promise<GateResult> {
  let prefix: string;
  let maxAgeMs: number;
  let timeoutMs: number;
  let probeMs: number;
  let session: PostgresSession | undefined;
  try {
    const known = plans.get(options ?? NO_OPTIONS);
    if (known !== undefined && known.task === task &&
        sameValues((options ?? NO_OPTIONS) as unknown as Record<string, unknown>, known)) {
      // the hot path: options seen before, their definition still fresh
      ({ prefix, maxAgeMs, timeoutMs, probeMs } = known);
    } else {
      const checked = checkedOptions(options);
      checkedTask(task);
      prefix = checkedPrefix(checked.prefix);
      timeoutMs = timeoutOf(checked);
      maxAgeMs = maxAgeOf(checked);
      probeMs = probeOf(checked);
    }
    if (openBreakers > 0) {
      const refused = breakerRefusal(client, timeoutMs);
      if (refused !== undefined) return Promise.reject(refused);
    }
    if (isPostgres(client)) {
      session = { schema: schemaOf(prefix, options?.schema), timeoutMs };
      prefix = `${prefix}\u0001${session.schema ?? ""}`;  // the definitions' cache key
    } else if (options?.schema !== undefined) {
      throw new DebounceConfigError("schema: a PostgreSQL option; this client is Redis's");
    }
    const cached = cachedDefinition(client, prefix, task, maxAgeMs);
    if (cached !== undefined) {
      return watched(client, timeoutMs, probeMs, send(client, session, task, call, options, cached));
    }
  } catch (exc) {
    return Promise.reject(exc);  // a refusal rejects, as from an async function
  }
  const pg = session;
  const read = (): Promise<string | null> => pg !== undefined
    ? readPostgresDefinition(client as PostgresPool, pg, task)
    : readDefinition(client as RedisClient, prefix, task, timeoutMs);
  return watched(client, timeoutMs, probeMs, definitionOf(client, prefix, task, maxAgeMs, read).then(
    (definition) => send(client, pg, task, call, options, definition)));
}

/** Per client, while its store is taken for down: until when calls fail at once, and
 * whether a call is trying it again (Python's breaker, producer/outage.py). */
const breakers = new WeakMap<object, { until: number; probing: boolean }>();
let openBreakers = 0;

/** The error of a call the client's open breaker refuses at once; undefined when the call
 * may go (the breaker is shut, or this call is the one that tries again). */
function breakerRefusal(client: object, timeoutMs: number): Error | undefined {
  const breaker = breakers.get(client);
  if (breaker === undefined) return undefined;
  if (Date.now() < breaker.until || breaker.probing) {
    return new DebounceBackendError(
      `the store did not answer a call within its timeout (${timeoutMs} ms): calls fail at ` +
      "once until one call finds it back (outageProbeInterval); nothing was sent");
  }
  breaker.probing = true;
  return undefined;
}

/** `result`, minding the breaker: a call that failed after waiting its whole timeout opens
 * it (or keeps it open), a call that got an answer shuts it. */
function watched(client: object, timeoutMs: number, probeMs: number,
                 result: Promise<GateResult>): Promise<GateResult> {
  const started = Date.now();
  return result.then((answer) => {
    if (breakers.delete(client)) openBreakers--;
    return answer;
  }, (exc: unknown) => {
    const breaker = breakers.get(client);
    if (exc instanceof DebounceBackendError && Date.now() - started >= timeoutMs * 0.9) {
      if (breaker === undefined) openBreakers++;
      breakers.set(client, { until: Date.now() + probeMs, probing: false });
    } else if (breaker !== undefined) {
      breakers.delete(client);  // it answered (a refusal, a fast error): not taken for down
      openBreakers--;
    }
    throw exc;
  });
}

/** The call prepared against `definition`, sent to the client's store. */
function send(client: Client, session: PostgresSession | undefined, task: string, call: Call,
              options: DebounceOptions | undefined,
              definition: TaskDefinition | null): Promise<GateResult> {
  if (session === undefined) {
    const redis = client as RedisClient;
    return sendGate(redis, prepare(task, call, options, isCluster(redis), definition));
  }
  const p = prepare(task, call, options, false, definition);
  return postgresGate(client as PostgresPool, session, {
    task, ident: p.ident, taskId: p.argv[0], windowMs: p.argv[1], maxWaitMs: p.argv[2],
    replace: p.argv[3].endsWith("1"), body: p.body, optionsJson: p.argv[6],
    exclusive: p.exclusive, maxCalls: p.argv[11] ?? "", edge: p.argv[12] ?? "",
    historyTtlMs: p.historyTtlMs,
  }).then(([taskId, opened, deadlineMs, calls, nowMs, edge]) =>
    ({ taskId, opened, deadlineMs, calls, nowMs, edge }));
}

/** The definition JSON of `task` (HGET `<prefix>:tasks`), on the gate's connection. */
async function readDefinition(redis: RedisClient, prefix: string, task: string,
                              ms: number): Promise<string | null> {
  try {
    if (redis.status === "end") throw new NotSent("the client was closed (quit or disconnect)");
    const conn = gateConnection(redis);
    if (conn.status !== "ready") await whenReady(conn, ms);
    return await once(conn, conn.hget(`${prefix}:tasks`, task), ms);
  } catch (exc) {
    const message = exc instanceof Error ? exc.message : String(exc);
    if (exc instanceof NotSent) {
      throw new DebounceBackendError(
        `debounce Redis unreachable for reading the definition of ${task} (${message}); nothing was sent`);
    }
    throw new DebounceBackendError(
      `debounce Redis: the definition of ${task} could not be read (${message}); nothing was written`);
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
    const run = (): Promise<unknown> =>
      once(conn, conn.evalsha(script.sha, 2, ...prepared.keys, ...prepared.argv), ms);
    try {
      reply = await run();
    } catch (exc) {
      if (!(exc instanceof Error && exc.message.startsWith("NOSCRIPT"))) throw exc;
      // NOSCRIPT: it did not run. Load it (SCRIPT LOAD, as the documented ACL allows; on a
      // cluster into every master) and run it by SHA once more.
      const nodes = isCluster(conn) ? conn.nodes("master") : [conn];
      await Promise.all(nodes.map((node) => once(conn, node.script("LOAD", script.text), ms)));
      reply = await run();
    }
  } catch (exc) {
    throw translate(exc, task);
  }
  const row = reply as unknown[];
  return {
    taskId: String(row[0]), opened: Number(row[1]) === 1, deadlineMs: Number(row[2]),
    calls: Number(row[3]), nowMs: Number(row[4]), edge: row.length > 5 ? String(row[5]) : "",
  };
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
