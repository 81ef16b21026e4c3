-- alive.lua: a dispatcher's heartbeat, or its clean stop (read by `ping` and `top`).
--
-- KEYS[1]  <tag>:alive    zset dispatcher name -> ms of its last heartbeat
-- KEYS[2]  <tag>:stopped  zset dispatcher name -> ms it stopped cleanly
--          (<tag> is shard 0's: one pair of keys per store, in one slot)
-- ARGV[1]  the dispatcher's name
-- ARGV[2]  '1' a heartbeat (the name leaves KEYS[2]), '0' a clean stop (it leaves KEYS[1])
-- ARGV[3]  how long entries are kept, ms (debounce_history_ttl): older ones are trimmed
--          and both keys expire that long after the last write
-- Returns the Redis time, ms. Time is Redis server time, never the dispatcher's.

--@include now

local now = now_ms()
local keep = tonumber(ARGV[3])
if ARGV[2] == '1' then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[2], now, ARGV[1])
end
for _, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - keep)
  if redis.call('EXISTS', key) == 1 then
    redis.call('PEXPIRE', key, keep)
  end
end
return now
