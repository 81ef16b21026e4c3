-- finish.lua: the window's run ended (task_postrun with a final state).
--
-- KEYS[1]  <tag>:win:<id>  hash; st -> "finished", rs final Celery state, fa finished ms;
--                          expires after the history TTL
-- KEYS[2]  <tag>:leased    zset; the id leaves it
-- KEYS[3]  <tag>:active    zset; the id leaves it
-- ARGV[1]  task id    ARGV[2]  final Celery state    ARGV[3]  history TTL ms
--
-- Returns 1 if a record was finished, 0 if there was none.

redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'st', 'finished', 'rs', ARGV[2], 'fa', string.format('%d', now))
redis.call('HDEL', KEYS[1], 'p', 'o')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
