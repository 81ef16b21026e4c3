/** The PostgreSQL store from Node (docs/node.md, "PostgreSQL"): a call is one simple query
 * on a node-postgres pool, the transaction's settings then `debounce_gate(...)`, as the
 * Python store sends it (store/postgres/sending.py): one round trip, nothing prepared on
 * the server, so a pooler in transaction mode is safe. Written at most once: a call whose
 * reply is lost is never sent again. */
import { connect as connectTo } from "node:net";
import {
  DebounceBackendError, DebounceConfigError, DebounceContractMismatch, DebounceError,
  DebounceOutcomeUnknown,
} from "./errors.js";
import { outage } from "./breaker.js";
import { POSTGRES_SCHEMA_VERSION } from "./gate-script.js";
import { MAX_ALIASES, chunked, type WindowInfo } from "./plan.js";

/** A pooled connection, as node-postgres's `PoolClient` has it. */
export interface PostgresConnection {
  query(text: string): Promise<unknown>;
  release(destroy?: boolean | Error): void;
  on?(event: "error", listener: (error: Error) => void): unknown;
  off?(event: "error", listener: (error: Error) => void): unknown;
}

/** A node-postgres `Pool` (what this package uses of it). */
export interface PostgresPool {
  connect(): Promise<PostgresConnection>;
  query(text: string): Promise<unknown>;
}

/** The `Pool` of node-postgres, told from an ioredis client. */
export function isPostgres(client: object): client is PostgresPool {
  const c = client as Record<string, unknown>;
  return typeof c.query === "function" && typeof c.connect === "function" &&
    typeof c.evalsha !== "function";
}

/** A string literal of `text`, as libpq's PQescapeLiteral writes it: quotes doubled, and
 * with a backslash the E'' form with backslashes doubled (whatever
 * standard_conforming_strings says). */
export function literal(text: string): string {
  const quoted = text.replace(/'/g, "''");
  return text.includes("\\") ? `E'${quoted.replace(/\\/g, "\\\\")}'` : `'${quoted}'`;
}

/** Where a deployment's tables are, and how long a call may take. */
export interface PostgresSession {
  /** `debounce_postgres_schema` (or the prefix that names it); null: the search_path. */
  schema: string | null;
  timeoutMs: number;
}

/** The schema `prefix` names, as the Python settings derive it: the default prefix names
 * none (the connection's search_path), any other names its own schema. */
export function schemaOf(prefix: string, schema: string | undefined): string | null {
  if (schema !== undefined) {
    if (typeof schema !== "string" || !schema || schema.includes("\0") ||
        Buffer.byteLength(schema) > 63) {
      throw new DebounceConfigError(
        `schema=${JSON.stringify(schema)}: expected a PostgreSQL schema name, a non-empty ` +
        "string of at most 63 bytes without NUL");
    }
    return schema;
  }
  return prefix === "debounce" ? null : schemaOf(prefix, prefix);
}

/** The transaction's settings, the first statement of every query (LOCALS_SQL). */
function settings(session: PostgresSession, historyTtlMs: number): string {
  let sql = `SELECT set_config('statement_timeout', '${session.timeoutMs}', true), ` +
    `set_config('debounce.history_ttl_ms', '${historyTtlMs}', true)`;
  if (session.schema !== null) {
    sql += `, set_config('search_path', ${literal(`"${session.schema.replace(/"/g, '""')}"`)}, true)`;
  }
  return sql;
}

/** What debounce_gate takes of a call (store/postgres/gate_args.py, no fixed id). */
export interface PostgresGateCall {
  task: string;
  ident: string;
  taskId: string;
  windowMs: string;
  maxWaitMs: string;
  replace: boolean;
  body: string;
  optionsJson: string;
  exclusive: boolean;
  maxCalls: string;
  edge: string;
  historyTtlMs: number;
  /** A collect call's byte budget and embed ('' for a call that does not collect). */
  budget: string;
  collectEmbed: string;
  /** A call with its own task id: its alias JSON and the id to open under when that one
   * is in use ('' for a call without). */
  alias: string;
  fallbackId: string;
}

/** The gate's answer: `[task id, opened, deadline ms, calls, now ms, edge]`. */
export type PostgresGateRow = [string, boolean, number, number, number, string];

const checked = new WeakMap<object, Map<string, Promise<void>>>();
const SQLSTATE = /^[0-9A-Z]{5}$/;

class NotSent extends Error {}
class NoReply extends Error {}

/** SQLSTATEs of a refused connection that no retry mends: the password, the role, the
 * database or its CONNECT right (Python's store/postgres/link.py MISCONFIGURED). */
const MISCONFIGURED = new Set(["28000", "28P01", "3D000", "42501"]);

/** The error of a connection the server refused for its settings, or undefined. */
function misconfigured(exc: unknown): DebounceConfigError | undefined {
  const code = (exc as { code?: unknown }).code;
  if (typeof code !== "string" || !MISCONFIGURED.has(code)) return undefined;
  return new DebounceConfigError(
    `the PostgreSQL server refused the connection (${code}: ${(exc as Error).message}): ` +
    "check the pool's role, its password, the database and its CONNECT right; nothing was sent");
}

/** `fn(connection)` on a connection of `pool` taken within `ms`; a connection that gave no
 * reply within `ms` is closed (never handed out again). */
async function onConnection<T>(pool: PostgresPool, ms: number,
                               fn: (conn: PostgresConnection) => Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = (make: () => Error) => new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(make()), ms);
  });
  let conn: PostgresConnection;
  try {
    conn = await Promise.race([pool.connect(), late(() => new NotSent(`no connection within ${ms} ms`))]);
  } catch (exc) {
    if (exc instanceof NotSent) throw exc;
    throw misconfigured(exc) ?? new NotSent(exc instanceof Error ? exc.message : String(exc));
  } finally {
    clearTimeout(timer);
  }
  let broken: Error | undefined;
  // a connection that ends while it is ours errs on the call; its own 'error' event must
  // not end the process
  const quiet = (error: Error): void => { broken = error; };
  conn.on?.("error", quiet);
  try {
    return await Promise.race([fn(conn), late(() => new NoReply(`no reply within ${ms} ms`))]);
  } catch (exc) {
    // the server may still be working on it (a commit waiting for a synchronous standby
    // holds its connection slot whatever statement_timeout says): end that too
    if (exc instanceof NoReply) cancelRunning(conn, CANCEL_MS);
    const code = (exc as { code?: unknown }).code;
    if (!(typeof code === "string" && SQLSTATE.test(code))) broken = exc as Error;
    throw exc;
  } finally {
    clearTimeout(timer);
    conn.off?.("error", quiet);
    conn.release(broken ?? false);
  }
}

/** How long a cancel request may take before it is given up (ms). */
const CANCEL_MS = 1000;

/** Ask the server to end what `conn` is running: a CancelRequest on a connection of its
 * own, as libpq's PQcancel sends it (no connection slot needed; through PgBouncer it
 * reaches the linked server connection). Best effort, within `ms`. */
function cancelRunning(conn: PostgresConnection, ms: number): void {
  const c = conn as unknown as { processID?: unknown; secretKey?: unknown; host?: unknown; port?: unknown };
  if (typeof c.processID !== "number" || typeof c.secretKey !== "number") return;
  const host = typeof c.host === "string" && c.host ? c.host : "localhost";
  const port = typeof c.port === "number" ? c.port : 5432;
  const message = Buffer.alloc(16);
  message.writeInt32BE(16, 0);
  message.writeInt32BE(80877102, 4);  // the cancel request code
  message.writeInt32BE(c.processID, 8);
  message.writeInt32BE(c.secretKey, 12);
  const socket = host.startsWith("/") ? connectTo(`${host}/.s.PGSQL.${port}`) : connectTo(port, host);
  socket.setTimeout(ms, () => socket.destroy());
  socket.on("error", () => {});
  socket.on("connect", () => socket.end(message));
}

/** The rows of the last statement of a simple query's answer. */
function lastRows(answer: unknown): Record<string, unknown>[] {
  const results = Array.isArray(answer) ? answer : [answer];
  return (results[results.length - 1] as { rows: Record<string, unknown>[] }).rows;
}

/** Refuse a deployment whose schema is not the one this package speaks, once per pool and
 * schema. */
function checkSchema(pool: PostgresPool, session: PostgresSession): Promise<void> {
  let known = checked.get(pool);
  if (known === undefined) { known = new Map(); checked.set(pool, known); }
  const name = session.schema ?? "";
  let done = known.get(name);
  if (done === undefined) {
    done = onConnection(pool, session.timeoutMs, async (conn) => {
      const answer = await conn.query(
        `${settings(session, 3600000)}; SELECT max(version) AS version FROM debounce_schema`);
      const found = Number(lastRows(answer)[0]?.version);
      if (found !== POSTGRES_SCHEMA_VERSION) {
        throw new DebounceContractMismatch(
          `the PostgreSQL store's schema is version ${found}, this package speaks version ` +
          `${POSTGRES_SCHEMA_VERSION}: install the celery-debounced release of the deployment's ` +
          "celery_debounce (or run its `celery debounce migrate`); nothing was written",
          String(POSTGRES_SCHEMA_VERSION), String(found));
      }
    }).catch((exc: unknown) => {
      known!.delete(name);
      throw translate(exc, "the schema check", false);
    });
    known.set(name, done);
  }
  return done;
}

/** The definition JSON of `task` in the deployment's `debounce_tasks`, or null. */
export async function readPostgresDefinition(pool: PostgresPool, session: PostgresSession,
                                             task: string): Promise<string | null> {
  await checkSchema(pool, session);
  try {
    return await onConnection(pool, session.timeoutMs, async (conn) => {
      const answer = await conn.query(`${settings(session, 3600000)}; ` +
        `SELECT definition FROM debounce_tasks WHERE name = ${literal(task)}`);
      const row = lastRows(answer)[0];
      return row === undefined ? null : String(row.definition);
    });
  } catch (exc) {
    throw translate(exc, `reading the definition of ${task}`, false);
  }
}

/** One call of `debounce_gate` (one round trip, written at most once). */
/** One `SELECT ... FROM debounce_gate(...)` of `call`, its values written as literals. */
function gateStatement(call: PostgresGateCall): string {
  const args = [
    literal(call.ident), literal(call.taskId), call.windowMs, call.maxWaitMs,
    "'application/json'", `decode('${Buffer.from(call.body, "ascii").toString("hex")}', 'hex')`,
    literal(call.optionsJson || "{}"), String(call.replace), String(call.exclusive),
    call.maxCalls === "" ? "NULL" : call.maxCalls,
    call.alias === "" ? "NULL" : literal(call.alias),
    call.fallbackId === "" ? "NULL" : literal(call.fallbackId), "false", String(MAX_ALIASES), "''",
    literal(call.edge), call.budget === "" ? "NULL" : call.budget,
    call.budget === "" ? "NULL" : literal(call.collectEmbed),
  ];
  return "SELECT task_id, opened, deadline_ms, calls, now_ms, edge " +
    `FROM debounce_gate(${args.join(", ")})`;
}

function gateRow(r: Record<string, unknown>): PostgresGateRow {
  return [String(r.task_id), r.opened === true, Number(r.deadline_ms), Number(r.calls),
    Number(r.now_ms), String(r.edge ?? "")];
}

/** One call of `debounce_gate` (one round trip, written at most once). */
export async function postgresGate(pool: PostgresPool, session: PostgresSession,
                                   call: PostgresGateCall): Promise<PostgresGateRow> {
  await checkSchema(pool, session);
  const sql = `${settings(session, call.historyTtlMs)}; ${gateStatement(call)}`;
  try {
    return await onConnection(pool, session.timeoutMs,
      async (conn) => gateRow(lastRows(await conn.query(sql))[0]));
  } catch (exc) {
    throw translate(exc, `the gate call of ${call.task}`, true);
  }
}

/** Many gate calls, at most `chunkSize` and CHUNK_BYTES at a time: each chunk one simple query, one transaction
 * (all its calls written, or none), one round trip. Per call its row, or the error that
 * kept its chunk out (a lost reply: DebounceOutcomeUnknown for the chunk's calls). */
export async function postgresMany(pool: PostgresPool, session: PostgresSession,
                                   calls: readonly PostgresGateCall[],
                                   chunkSize: number): Promise<(PostgresGateRow | Error)[]> {
  const out: (PostgresGateRow | Error)[] = new Array(calls.length);
  if (calls.length === 0) return out;
  try {
    await checkSchema(pool, session);
  } catch (exc) {
    return out.fill(exc as Error);
  }
  const sizes = (i: number): number =>
    Buffer.byteLength(calls[i].body) + Buffer.byteLength(calls[i].optionsJson);
  for (const indexes of chunked([...calls.keys()], chunkSize, sizes)) {
    const start = indexes[0];
    const chunk = indexes.map((i) => calls[i]);
    const sql = [settings(session, chunk[0].historyTtlMs), ...chunk.map(gateStatement)].join("; ");
    try {
      const answer = await onConnection(pool, session.timeoutMs, (conn) => conn.query(sql));
      const results = (answer as { rows: Record<string, unknown>[] }[]).slice(1);
      results.forEach((result, k) => { out[start + k] = gateRow(result.rows[0]); });
    } catch (exc) {
      const error = translate(exc, `a chunk of ${chunk.length} gate call(s) of ${chunk[0].task}`, true);
      for (let k = 0; k < chunk.length; k++) out[start + k] = error;
    }
  }
  return out;
}

const WINDOW_COLUMNS = "task_id, debounce_ms(first_seen) AS first_seen, " +
  "debounce_ms(deadline) AS deadline, max_wait_ms, calls";

function windowOf(row: Record<string, unknown> | undefined): WindowInfo | null {
  if (row === undefined) return null;
  return { taskId: String(row.task_id), firstSeenMs: Number(row.first_seen),
    deadlineMs: Number(row.deadline), maxWaitMs: Number(row.max_wait_ms), calls: Number(row.calls) };
}

/** The open window of `ident`, or null. */
export async function postgresPending(pool: PostgresPool, session: PostgresSession,
                                      ident: string): Promise<WindowInfo | null> {
  await checkSchema(pool, session);
  try {
    return await onConnection(pool, session.timeoutMs, async (conn) => windowOf(lastRows(
      await conn.query(`${settings(session, 3600000)}; SELECT ${WINDOW_COLUMNS} ` +
        `FROM debounce_open WHERE ident = ${literal(ident)}`))[0]));
  } catch (exc) {
    throw translate(exc, "reading a window", false);
  }
}

/** Close the open window of `ident` and make it due now (`debounce_close`, sent at most
 * once); the window as closed, or null when none was open. */
export async function postgresFlush(pool: PostgresPool, session: PostgresSession, task: string,
                                    ident: string): Promise<WindowInfo | null> {
  await checkSchema(pool, session);
  try {
    return await onConnection(pool, session.timeoutMs, async (conn) => windowOf(lastRows(
      await conn.query(`${settings(session, 3600000)}; SELECT ${WINDOW_COLUMNS} ` +
        `FROM debounce_close(${literal(ident)}, '', clock_timestamp())`))[0]));
  } catch (exc) {
    throw translate(exc, `the flush of ${task}'s window`, true);
  }
}

/** Drop the open window of `ident` so that it never runs, its outcome handed to the
 * dispatchers' expiry sweep, which stores REVOKED for its id and aliases
 * (`debounce_cancel_revoking`, sent at most once); the window as cancelled, or null. */
export async function postgresCancel(pool: PostgresPool, session: PostgresSession, task: string,
                                     ident: string, historyTtlMs: number,
                                     recordTtlMs: number): Promise<WindowInfo | null> {
  await checkSchema(pool, session);
  try {
    return await onConnection(pool, session.timeoutMs, async (conn) => windowOf(lastRows(
      await conn.query(`${settings(session, historyTtlMs)}; SELECT ${WINDOW_COLUMNS} ` +
        `FROM debounce_cancel_revoking(${literal(ident)}, '', ${recordTtlMs})`))[0]));
  } catch (exc) {
    throw translate(exc, `the cancel of ${task}'s window`, true);
  }
}

/** An error of the store as the package's errors: a refusal (nothing written), an outage
 * before anything was sent, or a reply lost after the call was sent (`written`). */
function translate(exc: unknown, what: string, written: boolean): Error {
  if (exc instanceof DebounceError) return exc;
  const message = exc instanceof Error ? exc.message : String(exc);
  const code = (exc as { code?: unknown }).code;
  if (exc instanceof NotSent) {
    return outage(new DebounceBackendError(
      `debounce PostgreSQL unreachable for ${what} (${message}); nothing was sent`));
  }
  if (typeof code === "string" && SQLSTATE.test(code)) {
    if (code === "DBR01") return new DebounceConfigError(`replacePayload=true: ${message}`);
    if (code === "42P01" || code === "42883") {
      return new DebounceConfigError(
        `the PostgreSQL store has no celery_debounce schema where this call looked (${message}): ` +
        "check the schema (or prefix) and the database, or run `celery debounce migrate`");
    }
    return new DebounceBackendError(
      `debounce PostgreSQL refused ${what} (${code}: ${message}); nothing was written`);
  }
  if (!written) {
    return outage(new DebounceBackendError(`debounce PostgreSQL: ${what} failed (${message})`));
  }
  return outage(new DebounceOutcomeUnknown(
    `the reply to ${what} was lost (${message}); the outcome is unknown: it may or may not ` +
    "have run, and it was not sent again"));
}
