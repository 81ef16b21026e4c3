-- claim.lua: a worker started the window's run (task_prerun).
--
-- KEYS[1]  <tag>:win:<id>  hash; st "dispatching"/"queued" -> "claimed", ca claimed ms
-- KEYS[2]  <tag>:leased    zset; the id leaves it (never taken again)
-- KEYS[3]  <tag>:active    zset; the id is added (NX, scored now) and stays until finished
-- ARGV[1]  task id
--
-- A record in any other state (claimed, finished, quarantined) is left as it is:
-- a redelivered or republished run never claims twice.
-- Returns {state before the claim ("" if the record is gone), now ms}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = redis.call('HGET', KEYS[1], 'st')
if not st then
  return {'', now}
end
redis.call('ZREM', KEYS[2], ARGV[1])
if st == 'dispatching' or st == 'queued' then
  redis.call('HSET', KEYS[1], 'st', 'claimed', 'ca', string.format('%d', now))
  redis.call('ZADD', KEYS[3], 'NX', now, ARGV[1])
end
return {st, now}
