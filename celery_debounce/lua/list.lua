-- list.lua: walk pending windows in deadline order, filtered, for `celery debounce inspect`.
--
-- KEYS[1]  <tag>:due   zset ident -> deadline ms (read only)
-- Reads, by name (same hash tag): <tag>:open:<ident>  fields id fs mw n
-- ARGV[1]  <tag>
-- ARGV[2]  start score: deadline ms to start from (inclusive) or "-inf"
-- ARGV[3]  members with exactly that score already examined (skipped here)
-- ARGV[4]  max members to examine in this call (bounds the time Redis is blocked)
-- ARGV[5]  max matches to return
-- ARGV[6]  ident prefix every match starts with ("" for any task)
-- ARGV[7]  Lua pattern the window's key must match ("" for any key); a superset
--          of the operator's glob, which the caller checks exactly
--
-- Walking by score (not rank) keeps the walk right while dispatchers remove
-- windows from the front. Read only.
-- Returns {examined, last score, members at last score examined so far (incl. ARGV[3]
-- when the score did not change), done (1 when the set has no more members), rows...}
-- where each row is {ident, id, fs, dl, mw, n}: dl is the due score, mw the max wait ms.

local tag = ARGV[1]
local start = ARGV[2]
local skip = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local want = tonumber(ARGV[5])
local prefix = ARGV[6]
local pattern = ARGV[7]

local members = redis.call('ZRANGE', KEYS[1], start, '+inf', 'BYSCORE', 'LIMIT', skip, budget,
  'WITHSCORES')
local out = {}
local found = 0
local examined = 0
local last = start
local at_last = skip
for i = 1, #members, 2 do
  local ident = members[i]
  local score = members[i + 1]
  examined = examined + 1
  if score == last then
    at_last = at_last + 1
  else
    last = score
    at_last = 1
  end
  local ok = true
  if prefix ~= '' and string.sub(ident, 1, #prefix) ~= prefix then
    ok = false
  end
  if ok and pattern ~= '' then
    local key
    if prefix ~= '' then
      key = string.sub(ident, #prefix + 1)
    else
      local digits = string.match(ident, '^(%d+):')
      key = string.sub(ident, #digits + tonumber(digits) + 3)
    end
    ok = string.find(key, pattern) ~= nil
  end
  if ok then
    local row = redis.call('HMGET', tag .. ':open:' .. ident, 'id', 'fs', 'mw', 'n')
    if row[1] then
      found = found + 1
      out[found] = {ident, row[1], row[2], score, row[3], row[4]}
      if found >= want then
        break
      end
    end
  end
end

local done = 0
if examined < budget and found < want then
  done = 1
end
local reply = {examined, last, at_last, done}
for i = 1, found do
  reply[i + 4] = out[i]
end
return reply
