-- list.lua: walk pending windows in deadline order, filtered, for `celery debounce inspect`.
--
-- KEYS[1]  <tag>:due   zset ident -> deadline ms (read only)
-- Reads, by name (same hash tag): <tag>:open:<ident>  fields id fs mw n mc tr cb
-- ARGV[1]  <tag>
-- ARGV[2]  where to start: "-inf" or a deadline ms (inclusive, with ARGV[3]), or the
--          cursor "<score> <ident>" this script returned: resume right after that member
--          in (score, member) order, also when it left the set meanwhile
-- ARGV[3]  with a bare score: members with exactly that score already examined
--          (skipped here); ignored with a cursor
-- ARGV[4]  max members to examine in this call (bounds the time Redis is blocked)
-- ARGV[5]  max matches to return
-- ARGV[6]  ident prefix every match starts with ("" for any task)
-- ARGV[7]  Lua pattern the window's key must match ("" for any key); a superset
--          of the operator's glob, which the caller checks exactly
--
-- Walking by score (not rank) keeps the walk right while dispatchers remove
-- windows from the front. A member removed between two calls (taken, cancelled)
-- never makes the walk skip another: the cursor names the last member examined,
-- and members with its score are ordered by bytes (as Redis orders them), so the
-- resume point is found by a binary search among them. Read only.
-- Returns {examined, cursor ("<score> <ident>" of the last member examined, or
-- ARGV[2] when none was), members at the last score examined in this call, done
-- (1 when the set has no more members), rows...} where each row is
-- {ident, id, fs, dl, mw, n, mc, tr, cb}: dl is the due score, mw the max wait ms, mc the
-- window's call cap (nil: none), tr "1" for a trailing window opened during the quiet
-- period of a leading run (see gate.lua; nil otherwise), cb the bytes of a collect
-- window's body (nil: not a collect window; see gate.lua).

--@include keys

local tag = ARGV[1]
local start = ARGV[2]
local skip = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local want = tonumber(ARGV[5])
local prefix = ARGV[6]
local pattern = ARGV[7]

-- true when a sorts before b in Redis's order of equal-score members (memcmp)
local function before(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

local members
local last = start
local at_last = skip
local space = string.find(start, ' ', 1, true)
if space then
  local score = string.sub(start, 1, space - 1)
  local member = string.sub(start, space + 1)
  local from
  local now_at = redis.call('ZSCORE', KEYS[1], member)
  if now_at and tonumber(now_at) == tonumber(score) then
    from = redis.call('ZRANK', KEYS[1], member) + 1
  else
    -- it left the set (or moved): first rank after it among the members at its score
    local lo = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. score)
    local hi = lo + redis.call('ZCOUNT', KEYS[1], score, score)
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if before(member, redis.call('ZRANGE', KEYS[1], mid, mid)[1]) then
        hi = mid
      else
        lo = mid + 1
      end
    end
    from = lo
  end
  members = redis.call('ZRANGE', KEYS[1], from, from + budget - 1, 'WITHSCORES')
  last = score
  at_last = 0
else
  members = redis.call('ZRANGE', KEYS[1], start, '+inf', 'BYSCORE', 'LIMIT', skip, budget,
    'WITHSCORES')
end
local out = {}
local found = 0
local examined = 0
local last_member = nil
for i = 1, #members, 2 do
  local ident = members[i]
  local score = members[i + 1]
  examined = examined + 1
  last_member = ident
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
    local row = redis.call('HMGET', open_key(tag, ident), 'id', 'fs', 'mw', 'n', 'mc', 'tr',
      'cb')
    if row[1] then
      found = found + 1
      out[found] = {ident, row[1], row[2], score, row[3], row[4], row[5], row[6], row[7]}
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
local cursor = start
if last_member then
  cursor = last .. ' ' .. last_member
end
local reply = {examined, cursor, at_last, done}
for i = 1, found do
  reply[i + 4] = out[i]
end
return reply
