-- lib/aliases.lua: defines aliases(key, reply, na): appends to the list reply the
-- aliases of the window hash key, fields a1 .. a<na> (JSON, written by gate.lua,
-- take.lua and flush.lua; a missing one is skipped), and returns reply. na is the
-- number of aliases when the caller already read field na, else nil (read here).
-- Touches: key, read only (HGET na, HMGET a1 .. a<na>).
local function aliases(key, reply, na)
  na = na or tonumber(redis.call('HGET', key, 'na') or '0')
  if na > 0 then
    local fields = {}
    for k = 1, na do
      fields[k] = 'a' .. k
    end
    local found = redis.call('HMGET', key, unpack(fields))
    for k = 1, na do
      if found[k] then
        reply[#reply + 1] = found[k]
      end
    end
  end
  return reply
end
