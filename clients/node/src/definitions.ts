/** Task definitions (docs/contract.md, "Task definitions"): what the Python app publishes
 * of each debounced task in the hash `<prefix>:tasks`, read here by task name, cached
 * per client and read again once older than `definitionMaxAge`. */
import type { Parameter } from "./binding.js";
import { CONTRACT_VERSION } from "./contract.js";
import { DebounceConfigError, DebounceContractMismatch } from "./errors.js";

/** The definition format this package reads (producer/published.py DEFINITION_FORMAT). */
export const DEFINITION_FORMAT = 1;

/** One task's definition, as the Python app published it. */
export interface TaskDefinition {
  format: number;
  contract: number;
  version: string;
  task: string;
  debounce_ms: number;
  max_wait_ms: number;
  key: string | null;
  replace_payload: boolean;
  max_calls: number | null;
  leading: boolean;
  trailing: boolean;
  collect: boolean;
  exclusive: boolean;
  /** The options JSON a call without options of its own stores (route, priority...). */
  options: string;
  accepts_json: boolean;
  check_arguments: boolean;
  /** The parameters calls are bound to; null: none (calls are not bound). */
  signature: Parameter[] | null;
  shards: number;
  max_key_length: number;
  max_payload_bytes: number;
  history_ttl_ms: number;
  result_expires_ms: number | null;
  /** `debounce_record_ttl` in ms (an operator's flush gives its record this expiry). */
  record_ttl_ms?: number;
}

const FIELDS: Record<string, string> = {
  format: "number", contract: "number", version: "string", task: "string",
  debounce_ms: "number", max_wait_ms: "number", replace_payload: "boolean",
  leading: "boolean", trailing: "boolean", collect: "boolean", exclusive: "boolean",
  options: "string", accepts_json: "boolean", check_arguments: "boolean", shards: "number",
  max_key_length: "number", max_payload_bytes: "number", history_ttl_ms: "number",
};

/** The definition of `task` read from the store's JSON text; refused when it is not one
 * this package can follow (another contract, another format, a field missing). */
export function parseDefinition(task: string, text: string): TaskDefinition {
  let found: unknown;
  try {
    found = JSON.parse(text);
  } catch {
    throw new DebounceConfigError(`${task}: its published definition is not JSON`);
  }
  const d = found as Record<string, unknown>;
  if (found === null || typeof found !== "object") {
    throw new DebounceConfigError(`${task}: its published definition is not an object`);
  }
  if (d.contract !== CONTRACT_VERSION) {
    throw new DebounceContractMismatch(
      `${task}: the deployment speaks gate contract ${String(d.contract)}, this package ` +
      `${CONTRACT_VERSION}: install the celery-debounced release of the deployment's ` +
      "celery_debounce (docs/contract.md); nothing was written",
      String(CONTRACT_VERSION), String(d.contract));
  }
  if (d.format !== DEFINITION_FORMAT) {
    throw new DebounceConfigError(
      `${task}: its definition is of format ${String(d.format)}, this package reads ` +
      `${DEFINITION_FORMAT}: install the celery-debounced release of the deployment's celery_debounce`);
  }
  for (const [name, type] of Object.entries(FIELDS)) {
    if (typeof d[name] !== type) {
      throw new DebounceConfigError(`${task}: its published definition has no ${type} ${name}`);
    }
  }
  if (d.task !== task) {
    throw new DebounceConfigError(`${task}: the definition published under its name is of ${String(d.task)}`);
  }
  return found as TaskDefinition;
}

interface Cached {
  at: number;
  definition: TaskDefinition | null;
}

/** Per client: `<prefix>\0<task>` -> the definition read last (null: none published). */
const cache = new WeakMap<object, Map<string, Cached>>();
const reading = new WeakMap<object, Map<string, Promise<TaskDefinition | null>>>();

/** The definition of `task` under `prefix`: the cached one while younger than `maxAgeMs`,
 * else read by `read` (one HGET), one read at a time per (client, prefix, task). */
export function definitionOf(client: object, prefix: string, task: string, maxAgeMs: number,
                             read: () => Promise<string | null>): Promise<TaskDefinition | null> {
  const name = `${prefix}\0${task}`;
  let known = cache.get(client);
  if (known === undefined) { known = new Map(); cache.set(client, known); }
  const hit = known.get(name);
  if (hit !== undefined && Date.now() - hit.at < maxAgeMs) return Promise.resolve(hit.definition);
  let pending = reading.get(client);
  if (pending === undefined) { pending = new Map(); reading.set(client, pending); }
  const inFlight = pending.get(name);
  if (inFlight !== undefined) return inFlight;
  const store = known;
  const waiting = pending;
  const made = read().then((text) => {
    const definition = text === null ? null : parseDefinition(task, text);
    store.set(name, { at: Date.now(), definition });
    return definition;
  }).finally(() => waiting.delete(name));
  pending.set(name, made);
  return made;
}

/** The cached definition of `task`, if any, without reading (the synchronous path). */
export function cachedDefinition(client: object, prefix: string, task: string,
                                 maxAgeMs: number): TaskDefinition | null | undefined {
  const hit = cache.get(client)?.get(`${prefix}\0${task}`);
  return hit !== undefined && Date.now() - hit.at < maxAgeMs ? hit.definition : undefined;
}
