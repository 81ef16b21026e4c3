// Compiled (not run) by test/types.test.mjs: the shipped .d.ts as an ESM consumer sees them.
import { Redis } from "ioredis";
import pg from "pg";
import { debounce, DebounceContractMismatch, type DebounceOptions } from "celery-debounced";

const options: DebounceOptions = { debounce: "5m", key: "report:{0}", maxWait: "30m", replacePayload: false };
export async function run(redis: Redis): Promise<string> {
  try {
    return await debounce(redis, "proj.build_report", { args: ["u1"], kwargs: {} }, options);
  } catch (exc) {
    if (exc instanceof DebounceContractMismatch) return `${exc.producer} ${exc.gate}`;
    throw exc;
  }
}
// a task whose definition is published: every option may be left out
export const byName = (redis: Redis): Promise<string> =>
  debounce(redis, "proj.build_report", { args: ["u1"] });
// @ts-expect-error: maxCalls is a number or null
export const badCap: DebounceOptions = { maxCalls: "3" };
// a node-postgres Pool is a client of the PostgreSQL store
export const viaPostgres = (pool: pg.Pool): Promise<string> =>
  debounce(pool, "proj.build_report", { args: ["u1"] }, { schema: "reports" });
