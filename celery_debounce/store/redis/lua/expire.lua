-- expire.lua: finish, as REVOKED, queued windows whose message expired in the broker
-- (`expires` passed) without any worker seeing it. A worker that gets an expired
-- message revokes it and finishes the window itself (task_revoked); a broker that
-- discards it (RabbitMQ's per-message TTL) sends no signal, so without this the
-- window stayed `queued` and its callers waited until the record's TTL.
--
-- KEYS[1]  <tag>:expiring  zset task id -> when its message expires (ms, expiring.lua)
-- KEYS[2]  <tag>:active    zset; a finished id leaves it
-- Touches, by name: <tag>:win:<id>  read st; a `queued` one gets st "finished",
--          rs "REVOKED", fa now, xr 1, p and o deleted, the history TTL (as finish.lua);
--          its aliases (na, a1 .. a<na>) are read and kept;
--          <tag>:run:<ident>, <tag>:held, <tag>:open:<ident>, <tag>:due: a finished
--          debounce_exclusive window frees its key, and a window held behind it is due
--          now (as finish.lua does: its message expired, so it can never run)
-- ARGV[1]  <tag>   ARGV[2]  grace ms (clock skew between workers and Redis)
-- ARGV[3]  history TTL ms   ARGV[4]  most ids examined
-- ARGV[5]  the caller's wall clock, ms (optional): a message has expired only once its
--          expiry passed on both clocks, Redis's and the caller's (a worker judges
--          `expires` by its own clock): a step forward of either clock alone (a Redis
--          clock stepped an hour ahead) never revokes a message a worker would still run
--
-- Only a `queued` record is finished: a claimed (running) or finished one is never
-- touched, and its id just leaves the set. A `dispatching` one (published again, not
-- yet acked) is looked at again after the grace. A missing record leaves the set.
-- A window finished here stays in the set, and is returned again by every call
-- (`xr` 1), until the dispatcher has stored REVOKED for its ids and removed it
-- (ZREM): a reply lost, or a dispatcher that dies in between, never leaves a caller
-- without its outcome.
-- Returns {now ms, {id, alias 1, alias 2, ...}, ...} for each window finished.

--@include now
--@include keys

local now = now_ms()
local seen = now
if ARGV[5] and ARGV[5] ~= '' then
  seen = math.min(now, tonumber(ARGV[5]))
end
local upto = string.format('%d', seen - tonumber(ARGV[2]))
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', upto, 'LIMIT', 0, tonumber(ARGV[4]))
local reply = {now}
for _, id in ipairs(ids) do
  local key = win_key(ARGV[1], id)
  local ok, got = pcall(redis.call, 'HMGET', key, 'st', 'xr')
  local st = ok and got[1] or nil
  local finish = st == 'queued'
  local again = st == 'finished' and got[2] == '1'
  if st == 'dispatching' then
    redis.call('ZADD', KEYS[1], string.format('%d', now), id)
  elseif not (finish or again) then
    redis.call('ZREM', KEYS[1], id)
  end
  if finish then
    redis.call('HSET', key, 'st', 'finished', 'rs', 'REVOKED', 'fa', string.format('%d', now),
               'xr', '1')
    redis.call('HDEL', key, 'p', 'o')
    redis.call('PEXPIRE', key, ARGV[3])
    redis.call('ZREM', KEYS[2], id)
    local ident = redis.call('HGET', key, 'i')
    local run = ident and run_key(ARGV[1], ident)
    if run and redis.pcall('HGET', run, 'id') == id then
      redis.call('DEL', run)
      if redis.pcall('ZREM', held_key(ARGV[1]), ident) == 1 and
          type(redis.pcall('HGET', open_key(ARGV[1], ident), 'hs')) == 'string' then
        redis.call('ZADD', due_key(ARGV[1]), string.format('%d', now), ident)
      end
    end
  end
  if finish or again then
    local row = {id}
    local na = tonumber(redis.call('HGET', key, 'na') or '0')
    for k = 1, na do
      local alias = redis.call('HGET', key, 'a' .. k)
      if alias then
        row[#row + 1] = alias
      end
    end
    reply[#reply + 1] = row
  end
end
return reply
