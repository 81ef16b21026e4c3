-- gate.lua: open a debounce window or join the open one, in one atomic step.
--
-- KEYS[1]  <tag>:open:<ident>   hash, the open window (see docs/design.md)
--            id  task id        fs  first_seen ms     dl  deadline ms
--            mw  max-wait ms    n   calls absorbed    ct  payload content type
--            p   payload        o   opener's options (JSON)
--            ct is left out when it is application/json and o when it is {}
--            (readers use those defaults): about 40 bytes less per window
-- KEYS[2]  <tag>:due            zset ident -> deadline ms
-- ARGV[1]  task id to use if this call opens the window
-- ARGV[2]  window ms          ARGV[3]  max wait ms
-- ARGV[4]  "1" to replace the payload of an open window, else "0"
-- ARGV[5]  payload content type, '' for application/json
-- ARGV[6]  payload            ARGV[7]  opener's options JSON
-- ARGV[8]  ident (the due member)
-- ARGV[9]  wake channel, published to when this window becomes the earliest
--
-- Returns {task id, 1 if opened else 0, deadline ms, calls, now ms}.
-- Time is Redis server time, never the producer's.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])

local found = redis.call('HMGET', KEYS[1], 'id', 'mw')
local id, deadline, opened, calls
if found[1] then
  id = found[1]
  deadline = math.min(now + window, tonumber(found[2]))
  calls = redis.call('HINCRBY', KEYS[1], 'n', 1)
  if ARGV[4] == '1' then
    redis.call('HSET', KEYS[1], 'dl', string.format('%d', deadline), 'p', ARGV[6])
    if ARGV[5] == '' then
      redis.call('HDEL', KEYS[1], 'ct')
    else
      redis.call('HSET', KEYS[1], 'ct', ARGV[5])
    end
  else
    redis.call('HSET', KEYS[1], 'dl', string.format('%d', deadline))
  end
  opened = 0
else
  id = ARGV[1]
  local ceiling = now + tonumber(ARGV[3])
  deadline = math.min(now + window, ceiling)
  redis.call('HSET', KEYS[1],
    'id', id,
    'fs', string.format('%d', now),
    'dl', string.format('%d', deadline),
    'mw', string.format('%d', ceiling),
    'n', 1,
    'p', ARGV[6])
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[1], 'ct', ARGV[5])
  end
  if ARGV[7] ~= '{}' then
    redis.call('HSET', KEYS[1], 'o', ARGV[7])
  end
  opened = 1
  calls = 1
end

local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[2], deadline, ARGV[8])
if first[1] == nil or deadline < tonumber(first[2]) then
  redis.call('PUBLISH', ARGV[9], string.format('%d', deadline))
end

return {id, opened, deadline, calls, now}
