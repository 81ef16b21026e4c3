-- doctor_claims.lua: `celery debounce doctor`: claims whose lease passed more than a
-- grace ago and that no dispatcher released (take.lua releases 20 per pass).
--
-- KEYS[1]  <tag>:claims   zset task id -> claim lease expiry ms; with repair the id leaves
-- Touches, by name (same tag), with repair, as take.lua's lapse of a claim:
--   <tag>:win:<id>     fields st ("claimed" -> "stale", or "dispatching" when rd was set:
--                      published again), sa (ms), rd (deleted), i (read)
--   <tag>:active       zset; the id leaves it
--   <tag>:leased       zset; a redelivered (rd) window is scored now (published again)
--   <tag>:run:<ident>  hash, field id: deleted when it names this window (its key is free)
--   <tag>:held         zset; <ident> leaves it, and then
--   <tag>:open:<ident> (field hs read) / <tag>:due: a window held behind it is due now
-- ARGV[1]  <tag>    ARGV[2]  "1": repair, "0": only report    ARGV[3]  grace ms
-- ARGV[4]  at most this many
--
-- Returns {id, state, ident or "", lease expiry ms} per claim found.

--@include now
--@include keys

local tag = ARGV[1]
local repair = ARGV[2] == '1'
local now = now_ms()
local found = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]),
                       'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[4]))
for n = 1, #ids, 2 do
  local id = ids[n]
  local key = win_key(tag, id)
  local state = redis.pcall('HGET', key, 'st')
  local ident = redis.pcall('HGET', key, 'i')
  if type(state) ~= 'string' then state = '' end
  if type(ident) ~= 'string' then ident = '' end
  found[#found + 1] = {id, state, ident, ids[n + 1]}
  if repair then
    redis.call('ZREM', KEYS[1], id)
    if state == 'claimed' then
      redis.call('ZREM', active_key(tag), id)
      if redis.call('HGET', key, 'rd') then
        redis.call('HDEL', key, 'rd')
        redis.call('HSET', key, 'st', 'dispatching', 'sa', string.format('%d', now))
        redis.call('ZADD', leased_key(tag), now, id)
      else
        redis.call('HSET', key, 'st', 'stale', 'sa', string.format('%d', now))
        local run = run_key(tag, ident)
        if ident ~= '' and redis.pcall('HGET', run, 'id') == id then
          redis.call('DEL', run)
          if redis.pcall('ZREM', held_key(tag), ident) == 1 and
              type(redis.pcall('HGET', open_key(tag, ident), 'hs')) == 'string' then
            redis.call('ZADD', due_key(tag), now, ident)
          end
        end
      end
    end
  end
end
return found
