/**
 * celery-debounced: debounce Celery tasks from Node.js. One call is one EVALSHA of the
 * gate script that the Python package's dispatcher and workers read, or one call of its
 * SQL function on the PostgreSQL store (docs/contract.md).
 */
import { anyBreakerOpen, breakerRefusal, watched } from "./breaker.js";
import { cachedDefinition, definitionOf, type TaskDefinition } from "./definitions.js";
import { DebounceConfigError } from "./errors.js";
import {
  type Call, checkedOptions, checkedPrefix, checkedTask, type DebounceOptions, type GateResult,
  maxAgeOf, NO_OPTIONS, plans, prepare, probeOf, sameValues, timeoutOf,
} from "./plan.js";
import {
  isPostgres, postgresGate, type PostgresPool, type PostgresSession, readPostgresDefinition,
  schemaOf,
} from "./postgres.js";
import { isCluster, readDefinition, type RedisClient, sendGate } from "./redis.js";

export { CONTRACT_VERSION } from "./contract.js";
export { parseDuration, type Duration } from "./durations.js";
export * from "./errors.js";
export type { JsonValue } from "./pyjson.js";
export { GATE_SCRIPT } from "./gate-script.js";
export type { Parameter, ParameterKind } from "./binding.js";
export { DEFINITION_FORMAT, parseDefinition, type TaskDefinition } from "./definitions.js";
export type { PostgresConnection, PostgresPool } from "./postgres.js";
export { prepare, type Call, type DebounceOptions, type GateResult, type PreparedCall } from "./plan.js";
export { sendGate } from "./redis.js";

/** An ioredis client (or Cluster) of the Redis store, or a node-postgres Pool of the
 * PostgreSQL store. */
type Client = RedisClient | PostgresPool;

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
    if (anyBreakerOpen()) {
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
