-- ack.lua: mark taken windows as handed to the broker.
--
-- KEYS[1]  <tag>:leased   zset task id -> lease expiry ms
-- KEYS[2]  <tag>:active   zset task id -> time handed to the broker ms (queued, claimed)
-- Touches, by name: <tag>:win:<id>  st "dispatching" -> "queued", pa published ms
-- ARGV[1]  <tag>     ARGV[2..]  task ids that were published
--
-- A window a worker already claimed keeps its state.
-- Returns {how many became queued, now ms (their pa and active score)}.

--@include now
--@include keys

local now = string.format('%d', now_ms())
local queued = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local key = win_key(ARGV[1], id)
  redis.call('ZREM', KEYS[1], id)
  if redis.call('HGET', key, 'st') == 'dispatching' then
    redis.call('HSET', key, 'st', 'queued', 'pa', now)
    redis.call('ZADD', KEYS[2], now, id)
    queued = queued + 1
  end
end
return {queued, tonumber(now)}
