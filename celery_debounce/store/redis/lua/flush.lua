-- flush.lua: close a pending window to new calls and make it due now.
--
-- KEYS[1]  <tag>:open:<ident>  hash; fields id fs mw n read; renamed to <tag>:win:<id>
-- KEYS[2]  <tag>:due           zset; ident removed
-- KEYS[3]  <tag>:leased        zset; id scored now: a lease that has already expired, so
--                              the next take.lua pass (of any dispatcher) takes it first
-- ARGV[1]  ident     ARGV[2]  wake channel (published to, so dispatchers take it at once):
--          <prefix>:wake (PUBLISH) on a single node; on a Redis Cluster with sharded
--          pub/sub <tag>:wake (KEYS[1]'s slot), sent with SPUBLISH: the store loads
--          this script with SHARDED_WAKE true there (store.script_source)
-- ARGV[3]  task id the window must have ("" for whichever window is open): a
--          by-id flush must not hit a newer window opened under the same ident
-- ARGV[4]  record TTL ms (safety expiry of win records, as take.lua sets it)
-- Touches, by name (same hash tag):
--   <tag>:win:<id>  the window, as take.lua leaves it but with tries 0 and no ta:
--                   st "dispatching", i ident, dl now (the flushed deadline), tries 0;
--                   take.lua sets ta and tries 1 and counts it in the stats.
--                   Never renamed over an existing key: as in take.lua, a window whose
--                   win:<id> exists is closed under <id>~<now>~<n> with <id> as alias
--                   (fields na, a<na>)
--   <tag>:ids       hash; <id> removed when it maps to ident
--   <tag>:held      zset; ident removed: a flushed debounce_exclusive window is published
--                   now, whether or not a run of its key is in progress (the operator's
--                   way past a hold behind a run whose message was lost)
--
-- The window is closed in the same step that reads it: the next call opens a new
-- window, and nothing can move the flushed deadline back out.
-- Returns {task id, first seen ms, deadline ms (now), max wait ms, calls} of the
-- window flushed, or false if no (matching) window is open for ident.

--@include now
--@include close_to_record
--@include tag
--@include keys

local SHARDED_WAKE = false

local found = redis.call('HMGET', KEYS[1], 'id', 'fs', 'mw', 'n')
local id = found[1]
if not id or (ARGV[3] ~= '' and id ~= ARGV[3]) then
  return false
end
local now = string.format('%d', now_ms())
local tag = tag_of(KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.pcall('ZREM', held_key(tag), ARGV[1])  -- pcall: a foreign key there never blocks it
if redis.call('HGET', ids_key(tag), id) == ARGV[1] then
  redis.call('HDEL', ids_key(tag), id)
end
local key
key, id = close_to_record(tag, KEYS[1], id, now)
redis.call('HSET', key, 'st', 'dispatching', 'i', ARGV[1], 'dl', now, 'tries', 0)
redis.call('PEXPIRE', key, ARGV[4])
redis.call('ZADD', KEYS[3], now, id)
redis.call(SHARDED_WAKE and 'SPUBLISH' or 'PUBLISH', ARGV[2], now)
return {id, found[2], now, found[3], found[4]}
