-- doctor_ttl.lua: `celery debounce doctor`: records with no TTL that should have one.
--
-- Touches, by name (same tag), PTTL read, with repair PEXPIRE / PEXPIREAT:
--   <tag>:win:<id>     a taken window (fields st, i read): every one but a quarantined one
--                      (kept until an operator deletes it) and one not yet taken
--                      (st "dispatching", in <tag>:leased: take.lua sets the TTL)
--                      expires; repair: the record TTL
--   <tag>:run:<ident>  repair: the record TTL
--   <tag>:quiet:<ident> repair: PEXPIREAT its field dl (the quiet period's end)
--   <tag>:leased       zset, ZSCORE read
-- KEYS[1]  <tag>:leased
-- ARGV[1]  <tag>    ARGV[2]  "1": repair, "0": only report    ARGV[3]  record TTL ms
-- ARGV[4..]  pairs: kind ("win", "run", "quiet": win_key, run_key, quiet_key of
--            lib/keys.lua), id or ident
--
-- Returns {kind, name, state or "", ident or ""} per record found (field i of a win
-- record; the name itself for the others).

--@include keys

local tag = ARGV[1]
local repair = ARGV[2] == '1'
local ttl = tonumber(ARGV[3])
local found = {}
local key_of = {win = win_key, run = run_key, quiet = quiet_key}  -- by kind
for i = 4, #ARGV - 1, 2 do
  local kind, name = ARGV[i], ARGV[i + 1]
  local key = key_of[kind](tag, name)
  if redis.call('PTTL', key) == -1 then
    local state = ''
    local ident = name
    local finding = true
    if kind == 'win' then
      local st = redis.pcall('HGET', key, 'st')
      if type(st) == 'string' then state = st end
      ident = redis.pcall('HGET', key, 'i')
      if type(ident) ~= 'string' then ident = '' end
      if state == 'quarantined' or
          (state == 'dispatching' and redis.call('ZSCORE', KEYS[1], name)) then
        finding = false
      end
    end
    if finding then
      found[#found + 1] = {kind, name, state, ident}
      if repair then
        if kind == 'quiet' then
          local dl = redis.pcall('HGET', key, 'dl')
          if type(dl) == 'string' and tonumber(dl) then
            redis.call('PEXPIREAT', key, dl)
          else
            redis.call('PEXPIRE', key, ttl)
          end
        else
          redis.call('PEXPIRE', key, ttl)
        end
      end
    end
  end
end
return found
