/** What a call derives from its task, its options and its task's definition: every check,
 * the binding of its arguments, its key, ident and the gate's arguments, nothing sent
 * (docs/contract.md). The vectors of contract/vectors.json are checked against `prepare`. */
import { randomUUID } from "node:crypto";
import { BindError, bindArguments, UnusableDefault } from "./binding.js";
import { CONTRACT_VERSION } from "./contract.js";
import type { TaskDefinition } from "./definitions.js";
import { type Duration, parseDuration } from "./durations.js";
import { checkPublishable, type Publisher } from "./broker.js";
import { DebounceConfigError, DebounceKeyError, DebouncePayloadError } from "./errors.js";
import { blake2bHex } from "./hashes.js";
import { dueKey, openKeyStart, shardOf, shardTag, windowIdent } from "./layout.js";
import { pyJson, pyString } from "./pyjson.js";
import { type KeyTemplate, parseTemplate, resolveTemplate, wellFormed } from "./templates.js";

/** A call's arguments: Celery's `args` and `kwargs`. */
export interface Call {
  /** Celery's `args`: values JSON carries as Python would (see JsonValue); any other is
   * refused with DebounceEncodeError, nothing sent. Typed loosely so that values typed by
   * an interface are accepted: an interface has no index signature. */
  args?: readonly unknown[];
  /** Celery's `kwargs`: an object of such values. */
  kwargs?: object;
  /** Celery's `task_id`: an id the caller chose. The window opens under it, or records it
   * as an alias when it joins one; either way the run's outcome is stored under it. */
  taskId?: string;
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
  /** `debounce_collect`, a task option: the run gets every call of its window, as a list.
   * For a task with a definition it must equal the task's (or be left out); for a task
   * with none it declares that the task collects (Python's `send_task` of a task it has
   * not registered). */
  collect?: boolean;
  /** `debounce_exclusive`: runs of one key never overlap (default: the task's). */
  exclusive?: boolean;
  /** Celery's `queue`, `routing_key`, `exchange` and `priority` of the run's message
   * (default: the task's route and options, from its definition). */
  queue?: string;
  routingKey?: string;
  exchange?: string;
  priority?: number;
  /** What a call does when the store does not answer (Python's `debounce_on_outage`):
   * "raise" (the default), or "publish": the call is published as a plain Celery message
   * through `publish`, undebounced (it runs once). After a call that waited its whole
   * `timeout`, calls fail (or publish) at once for `outageProbeInterval` (default 1 s),
   * then one call at a time tries the store again. */
  onOutage?: "raise" | "publish";
  outageProbeInterval?: Duration;
  /** With `onOutage: "publish"`, what sends a plain message to the broker
   * (`redisBroker(client)` for Celery's Redis broker, or your own). */
  publish?: Publisher;
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
  "outageProbeInterval", "publish", "collect"];

/** Python's `debounce_history_ttl` default (ms). */
const DEFAULT_HISTORY_TTL_MS = 3_600_000;
/** Python's largest `debounce_max_calls`. */
const MAX_CALLS_LIMIT = 2 ** 31 - 1;
const DEFAULT_DEFINITION_MAX_AGE_MS = 5000;
/** Python's `debounce_outage_probe_interval` default. */
const DEFAULT_PROBE_MS = 1000;

/** Python's `debounce_redis_timeout` default. */
export const DEFAULT_TIMEOUT_MS = 2000;

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
  /** `[args, kwargs` as the body opens with them (a plain message's body starts so). */
  encoded: string;
  /** `debounce_collect`, and the options JSON the window stores (route, priority...). */
  collect: boolean;
  optionsJson: string;
}

/** A pending window, as an operator's read or flush gives it back (store time, ms). */
export interface WindowInfo {
  taskId: string;
  calls: number;
  firstSeenMs: number;
  deadlineMs: number;
  maxWaitMs: number;
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
  /** True when the store was out and the call was published as a plain message
   * (`onOutage: "publish"`): `taskId` is that message's, and it runs once. */
  published?: boolean;
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
  /** `debounce_collect`: the body is the call's element `[args, kwargs]`. */
  collect: boolean;
  /** Leading edge only (a call with its own task id is refused). */
  leadingOnly: boolean;
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
export const plans = new WeakMap<object, Plan>();

export function checkedPrefix(prefix: unknown): string {
  const value = prefix ?? "debounce";
  if (typeof value !== "string" || !value || /[{}]/.test(value)) {
    throw new DebounceConfigError(`prefix=${JSON.stringify(value)}: expected a non-empty string without braces`);
  }
  return value;
}

export function checkedTask(task: unknown): void {
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
  if (!d.accepts_json) {
    throw new DebounceConfigError(
      `${task}: the app does not accept JSON (accept_content), and this producer writes JSON; ` +
      "nothing was written");
  }
}

/** ARGV 12 onwards (gate.lua's header): the cap, then the edge mode and history TTL,
 * then a collect call's byte budget and embed, each group padded with '' before it. */
function argvTail(maxCalls: number | null, leading: boolean, trailing: boolean,
                  historyTtlMs: number, budget: number | null): string[] {
  const tail: string[] = [];
  if (maxCalls !== null) tail.push(String(maxCalls));
  if (leading) {
    if (maxCalls === null) tail.push("");
    tail.push(trailing ? "B" : "L", String(historyTtlMs));
  }
  if (budget !== null) {
    while (tail.length < 3) tail.push("");
    tail.push(String(budget), EMPTY_EMBED);
  }
  return tail;
}

/** A call's protocol-2 embed without links: this producer sends none. */
const EMPTY_EMBED = "{}";
/** Bytes of a collect run's body besides its calls (producer/collect.py BODY_OVERHEAD), and
 * what the gate adds to a call's element (TIME_PREFIX: the time in ms and a comma). */
const BODY_OVERHEAD = 10;
const TIME_PREFIX = 14;

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
  const collect = flag("collect", options.collect, d?.collect ?? false);
  if (d !== null && collect !== d.collect) {
    throw new DebounceConfigError(
      `collect=${collect} on a call of ${task}, whose definition says ${d.collect}: it is a ` +
      "task option (the task function takes either the list of calls or the call's own " +
      "arguments; as in Python)");
  }
  if (collect && (leading || replace)) {
    throw new DebounceConfigError(
      `${task} is debounce_collect: ${leading ? "leading=true" : "replacePayload=true"} cannot ` +
      "be combined with it (the run gets every call; as in Python)");
  }
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
  const optionsJson = messageOptions(options, d, exclusive, collect);
  // a call an outage would publish plainly is refused now if it could not be, not then
  if (options.onOutage === "publish") checkPublishable(task, optionsJson);
  return {
    task, clusterClient, definition: d, values, template, prefix, shards, cluster, maxKeyLength,
    maxPayloadBytes, timeoutMs, maxAgeMs, probeMs, windowText: String(windowMs), maxWaitText,
    versionReplace: `${CONTRACT_VERSION}:${replace ? "1" : "0"}`,
    optionsJson,
    tail: argvTail(maxCalls, leading, trailing, d?.history_ttl_ms ?? DEFAULT_HISTORY_TTL_MS,
      collect ? maxPayloadBytes : null),
    collect, leadingOnly: leading && !trailing,
    exclusive, historyTtlMs: d?.history_ttl_ms ?? DEFAULT_HISTORY_TTL_MS,
    signature: d?.signature ?? null, checkArguments: d?.check_arguments ?? false,
    identHead, shardKeys: [],
  };
}

/** ARGV[7]: the options JSON the window stores: the definition's (a Python call's without
 * options of its own), with the call's routing and exclusive flag over it ('' for {}). */
function messageOptions(options: DebounceOptions, d: TaskDefinition | null,
                        exclusive: boolean, collect: boolean): string {
  const base = d === null || d.options === "{}" ? "" : d.options;
  const routed = options.queue !== undefined || options.routingKey !== undefined ||
    options.exchange !== undefined || options.priority !== undefined;
  const declared = collect && d === null;  // the definition's options carry it otherwise
  if (!routed && !declared && exclusive === (d?.exclusive ?? false)) return base;
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
  delete headers.debounce_exclusive;
  if (declared) headers.debounce_collect = 1;  // before exclusive, as Python writes them
  if (exclusive) headers.debounce_exclusive = 1;
  if (Object.keys(headers).length) out.headers = headers; else delete out.headers;
  return Object.keys(out).length ? JSON.stringify(out) : "";
}

/** `outageProbeInterval` in ms (after `onOutage` and `publish` are checked). */
export function probeOf(options: DebounceOptions): number {
  if (options.onOutage !== undefined && options.onOutage !== "raise" && options.onOutage !== "publish") {
    throw new DebounceConfigError(
      `onOutage=${JSON.stringify(options.onOutage)}: expected "raise" or "publish"`);
  }
  if (options.onOutage === "publish" && typeof options.publish !== "function") {
    throw new DebounceConfigError(
      `onOutage="publish" needs publish: a function that sends a plain message to the broker ` +
      "(redisBroker(client) for Celery's Redis broker); got " + typeof options.publish);
  }
  return options.outageProbeInterval === undefined ? DEFAULT_PROBE_MS
    : parseDuration("outageProbeInterval", options.outageProbeInterval);
}

export function maxAgeOf(options: DebounceOptions): number {
  return options.definitionMaxAge === undefined ? DEFAULT_DEFINITION_MAX_AGE_MS
    : parseDuration("definitionMaxAge", options.definitionMaxAge);
}

export function timeoutOf(options: DebounceOptions): number {
  return options.timeout === undefined ? DEFAULT_TIMEOUT_MS : parseDuration("timeout", options.timeout);
}

export function checkedOptions(options: unknown): DebounceOptions {
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

export const NO_OPTIONS: DebounceOptions = Object.freeze({});

/** The options' values are those `plan` was made from. */
export function sameValues(record: Record<string, unknown>, plan: Plan): boolean {
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

/** Python's `aliases.MAX_ALIASES`: the most aliases (fixed ids) one window records. */
export const MAX_ALIASES = 10_000;

/** A caller's own task id, checked (undefined: none). */
function fixedId(plan: Plan, taskId: unknown): string | undefined {
  if (taskId === undefined) return undefined;
  if (typeof taskId !== "string" || !taskId || taskId.includes("\0") || !wellFormed(taskId)) {
    throw new DebounceConfigError(`taskId=${JSON.stringify(taskId)}: expected a non-empty string ` +
      "without NUL");
  }
  if (plan.leadingOnly) {
    throw new DebounceConfigError(
      `${plan.task}: leading=true, trailing=false cannot be combined with taskId: a suppressed ` +
      "call's id would never get a result; use trailing=true, or no taskId");
  }
  return taskId;
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
  const fixed = fixedId(plan, call?.taskId);
  const [positional, named] = boundArguments(plan, args, kwargs as Record<string, unknown>);
  let key = template ? resolveTemplate(template, positional, named) : "";
  const encoded = `[${pyJson(args, false, "args")}, ${pyJson(kwargs, false, "kwargs")}`;
  // a collect call's body is its element [args, kwargs(, id)]; the gate adds it to the window's
  const body = plan.collect ? `${encoded}${fixed ? `, ${pyString(fixed)}` : ""}]`
    : `${encoded}, ${EMPTY_EMBED}]`;
  const size = plan.collect ? BODY_OVERHEAD + EMPTY_EMBED.length + body.length + TIME_PREFIX
    : body.length;  // the body is ASCII: characters are bytes
  if (size > plan.maxPayloadBytes) {
    throw new DebouncePayloadError(plan.collect
      ? `${task}: this call makes a body of ${size} bytes on its own, above maxPayloadBytes=${plan.maxPayloadBytes}`
      : `${task}: arguments serialize to ${size} bytes, above maxPayloadBytes=${plan.maxPayloadBytes}`);
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
    keys = plan.shardKeys[shard] = [openKeyStart(tag), dueKey(tag)];
  }
  return {
    task, key, ident, shard, body, timeoutMs: plan.timeoutMs, exclusive: plan.exclusive,
    historyTtlMs: plan.historyTtlMs, encoded, collect: plan.collect, optionsJson: plan.optionsJson,
    keys: [keys[0] + ident, keys[1]],
    // a fresh id: a caller's own id needs the fixed-id ARGV group (aliases), not offered here
    argv: [fixed ?? randomUUID(), plan.windowText, plan.maxWaitText, plan.versionReplace, "", body,
      plan.optionsJson, ...(fixed !== undefined
        ? [`{"id": ${pyString(fixed)}}`, randomUUID(), "0", String(MAX_ALIASES), ...plan.tail]
        : plan.tail.length ? ["", "", "", "", ...plan.tail] : [])],
  };
}

/** The most bytes of bodies and options one chunk of `debounceMany` carries (Python's
 * `store/chunks.py` CHUNK_BYTES): a batch of large bodies is never one huge request. */
export const CHUNK_BYTES = 16 * 1024 * 1024;

/** Consecutive slices of `indexes`, each at most `chunkSize` long and at most `maxBytes`
 * of `bytes(i)` (a slice's first index whatever its size). */
export function chunked(indexes: readonly number[], chunkSize: number,
                        bytes: (i: number) => number, maxBytes = CHUNK_BYTES): number[][] {
  const out: number[][] = [];
  let current: number[] = [];
  let used = 0;
  for (const i of indexes) {
    const size = bytes(i);
    if (current.length && (current.length >= chunkSize || used + size > maxBytes)) {
      out.push(current);
      current = [];
      used = 0;
    }
    current.push(i);
    used += size;
  }
  if (current.length) out.push(current);
  return out;
}
