/** Ident, shard and Redis keys (docs/contract.md, section 2). */
import { DebounceConfigError } from "./errors.js";
import { crc16, crc32 } from "./hashes.js";
import { wellFormed } from "./templates.js";

const utf8 = (text: string): Uint8Array => Buffer.from(text, "utf8");

/** `<UTF-8 bytes of task>:<task>:<key>`: injective, a key cannot make another task's ident. */
export function windowIdent(task: string, key: string): string {
  if (!wellFormed(task)) {
    throw new DebounceConfigError(`task name ${JSON.stringify(task)}: not valid Unicode text`);
  }
  if (task.includes("\u0000")) {
    throw new DebounceConfigError(`task name ${JSON.stringify(task)}: a NUL character cannot be stored`);
  }
  return `${utf8(task).length}:${task}:${key}`;
}

/** The shard of a window: crc32(ident) % shards. */
export function shardOf(ident: string, shards: number): number {
  return shards > 1 ? crc32(utf8(ident)) % shards : 0;
}

const SLOTS = 16384;
const clusterTags = new Map<string, string>();

/** The hash tag of `shard` of `shards` on a Redis Cluster: `<shard>`, else `<shard>.<k>`
 * for the smallest k, whose slot falls in the shard's share of the slot range. */
export function clusterShardTag(shard: number, shards: number): string {
  const id = `${shard}/${shards}`;
  const known = clusterTags.get(id);
  if (known !== undefined) return known;
  const low = Math.floor((shard * SLOTS) / shards);
  const high = Math.floor(((shard + 1) * SLOTS) / shards);
  for (let k = -1; ; k++) {
    const candidate = k < 0 ? String(shard) : `${shard}.${k}`;
    const slot = crc16(utf8(candidate)) % SLOTS;
    if (low <= slot && slot < high) {
      clusterTags.set(id, candidate);
      return candidate;
    }
  }
}

/** `<prefix>:{<shard tag>}`, what every key of the shard starts with. */
export function shardTag(prefix: string, shard: number, shards: number, cluster: boolean): string {
  return `${prefix}:{${cluster ? clusterShardTag(shard, shards) : String(shard)}}`;
}

/** `<tag>:open:`, the start of each open window's key (`store/redis/keys.py` open_key). */
export const openKeyStart = (tag: string): string => `${tag}:open:`;
/** `<tag>:due`, the shard's due set. */
export const dueKey = (tag: string): string => `${tag}:due`;
/** `<tag>:stats`, the shard's counters. */
export const statsKey = (tag: string): string => `${tag}:stats`;
/** `<tag>:leased`, the shard's taken windows under a dispatch lease. */
export const leasedKey = (tag: string): string => `${tag}:leased`;
/** The dispatchers' wake channel: `<prefix>:wake`, or on a Redis Cluster with sharded
 * pub/sub `<tag>:wake`. */
export const wakeChannel = (prefix: string): string => `${prefix}:wake`;
export const shardWakeChannel = (tag: string): string => `${tag}:wake`;
/** The hash of the task definitions (`store/redis/keys.py` tasks_key). */
export const tasksKey = (prefix: string): string => `${prefix}:tasks`;
