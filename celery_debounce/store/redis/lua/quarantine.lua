-- quarantine.lua: set aside taken windows whose record cannot be published.
--
-- KEYS[1]  <tag>:leased       zset; the id leaves it (never retried)
-- KEYS[2]  <tag>:quarantine   zset task id -> quarantined ms
-- Touches, by name: <tag>:win:<id>  st -> "quarantined", qe reason; loses its TTL
--                   so an operator can look at it (celery debounce inspect);
--                   reads na and a1 .. a<na> (aliases, see gate.lua)
-- ARGV[1]  <tag>    ARGV[2]  task id    ARGV[3]  reason
--
-- Returns {1, alias 1, alias 2, ...} if the record was quarantined (the caller marks
-- the window's id and its aliases failed, so nobody waits on them), {0} if it was gone.

--@include now
--@include aliases
--@include keys

local now = string.format('%d', now_ms())
local key = win_key(ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[1], ARGV[2])
if redis.call('EXISTS', key) == 0 then
  return {0}
end
redis.call('ZADD', KEYS[2], now, ARGV[2])
redis.call('HSET', key, 'st', 'quarantined', 'qe', ARGV[3])
redis.call('PERSIST', key)
return aliases(key, {1})
