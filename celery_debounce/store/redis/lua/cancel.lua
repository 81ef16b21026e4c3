-- cancel.lua: drop a pending window so that it never runs.
--
-- KEYS[1]  <tag>:open:<ident>  hash; fields id fs mw n and the aliases na, a1 .. a<na>
--                              (see gate.lua) read, then deleted
-- KEYS[2]  <tag>:due           zset; ident's score (the deadline) read, ident removed
-- KEYS[3]  <tag>:stats         hash; x|<task> cancelled windows of the task, +1;
--                              expires ARGV[3] ms later (history TTL)
-- ARGV[1]  ident
-- ARGV[2]  task id the window must have ("" for whichever window is open): a
--          by-id cancel must not hit a newer window opened under the same ident
-- ARGV[3]  history TTL ms
-- ARGV[4]  the call's token ("" or absent: none): the reply of a cancel is kept 5 min
--          in <tag>:cancelled:<token> (list), and a call with that token finds it and
--          returns it instead of acting: the same call sent again after its reply was
--          lost gets the first answer (the store deletes the key once it has it)
-- ARGV[5]  a record TTL ms, when the caller cannot reach the result backend (a
--          producer in another language): the window's outcome is handed to the
--          dispatchers' expiry sweep. It gets a record <tag>:win:<id> finished as
--          REVOKED (fields id i fs dl mw n na a1 .. st rs fa xr 1, as expire.lua writes
--          one), kept that long (debounce_record_ttl: as long as a window's record
--          waits for its run, so a dispatcher outage does not outlive it), and
--          <tag>:expiring its id at score 0, so the next sweep (expire.lua, its
--          "again" rows) stores REVOKED for the id and its aliases. Absent or "": none.
-- Touches, by name (same hash tag): <tag>:ids  hash; <id> removed when it maps to ident
--                                   <tag>:cancelled:<ARGV[4]>  list, the reply (below)
--                                   <tag>:calls:<cl>  a collect window's call list
--                                   (field cl, see gate.lua), deleted with the window
--                                   <tag>:held  zset; ident removed (debounce_exclusive)
--
-- Only pending windows can be cancelled: once taken, a window is the broker's.
-- The window is read and dropped in one step: what is returned is what was cancelled.
-- Returns {task id, calls absorbed, first seen ms, deadline ms, max wait ms, alias 1, ...}
-- of the cancelled window (the caller marks the aliases revoked too), or false if
-- none (matching) was open.

--@include aliases
--@include now
--@include tag
--@include task_of
--@include keys

local tag = tag_of(KEYS[1])
local done = ARGV[4] and ARGV[4] ~= '' and cancel_marker_key(tag, ARGV[4])
if done and redis.call('EXISTS', done) == 1 then
  return redis.call('LRANGE', done, 0, -1)
end
local found = redis.call('HMGET', KEYS[1], 'id', 'n', 'fs', 'mw', 'na')
if not found[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return false
end
if ARGV[2] ~= '' and found[1] ~= ARGV[2] then
  return false
end
local deadline = redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0'
local reply = {found[1], tonumber(found[2]), found[3], deadline, found[4]}
aliases(KEYS[1], reply, tonumber(found[5] or '0'))
-- the writes that need memory first: at maxmemory the script stops before deleting
local task = task_of(ARGV[1])
if done then
  redis.call('RPUSH', done, unpack(reply))
  redis.call('PEXPIRE', done, 300000)
end
redis.call('HINCRBY', KEYS[3], 'x|' .. task, 1)
redis.call('PEXPIRE', KEYS[3], ARGV[3])
if ARGV[5] and ARGV[5] ~= '' then
  local record = {'id', found[1], 'i', ARGV[1], 'fs', found[3], 'dl', deadline,
                  'mw', found[4], 'n', found[2], 'st', 'finished', 'rs', 'REVOKED',
                  'fa', string.format('%d', now_ms()), 'xr', '1', 'na', #reply - 5}
  for k = 6, #reply do
    record[#record + 1] = 'a' .. (k - 5)
    record[#record + 1] = reply[k]
  end
  local key = win_key(tag, found[1])
  redis.call('HSET', key, unpack(record))
  redis.call('PEXPIRE', key, ARGV[5])
  redis.call('ZADD', expiring_key(tag), 0, found[1])
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.pcall('ZREM', held_key(tag), ARGV[1])  -- a held exclusive window is held no more
local cl = redis.call('HGET', KEYS[1], 'cl')
if cl then
  redis.call('DEL', calls_key(tag, cl))
end
redis.call('DEL', KEYS[1])
if redis.call('HGET', ids_key(tag), found[1]) == ARGV[1] then
  redis.call('HDEL', ids_key(tag), found[1])
end
return reply
