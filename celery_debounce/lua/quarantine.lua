-- quarantine.lua: set aside taken windows whose record cannot be published.
--
-- KEYS[1]  <tag>:leased       zset; the id leaves it (never retried)
-- KEYS[2]  <tag>:quarantine   zset task id -> quarantined ms
-- Touches, by name: <tag>:win:<id>  st -> "quarantined", qe reason; loses its TTL
--                   so an operator can look at it (celery debounce inspect)
-- ARGV[1]  <tag>    ARGV[2]  task id    ARGV[3]  reason
--
-- Returns 1 if the record was quarantined, 0 if it was gone.

local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local key = ARGV[1] .. ':win:' .. ARGV[2]
redis.call('ZREM', KEYS[1], ARGV[2])
if redis.call('EXISTS', key) == 0 then
  return 0
end
redis.call('HSET', key, 'st', 'quarantined', 'qe', ARGV[3])
redis.call('PERSIST', key)
redis.call('ZADD', KEYS[2], now, ARGV[2])
return 1
