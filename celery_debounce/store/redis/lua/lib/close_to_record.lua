-- lib/close_to_record.lua: defines close_to_record(tag, open, id, stamp) -> key, id:
-- the open window hash open (<tag>:open:<ident>) renamed to its record <tag>:win:<id>,
-- never over an existing key: then to <tag>:win:<id>~<stamp>~<k> (the smallest k >= 1
-- whose key does not exist; stamp is now, ms, formatted '%d'), whose field id becomes
-- <id>~<stamp>~<k> and which records <id> as an alias (na + 1, a<na> = {"id": <id>}).
-- Returns the record's key and the id it is closed under. The caller writes the rest
-- (st, i, dl, tries, TTL, lease).
-- Touches: open (renamed), <tag>:win:<id> or <tag>:win:<id>~<stamp>~<k> (EXISTS, then
-- the rename's target; fields id, na, a<na> when renamed aside).
--@include keys
local function close_to_record(tag, open, id, stamp)
  local key = win_key(tag, id)
  if redis.call('RENAMENX', open, key) == 0 then
    local held = id
    local k = 0
    repeat
      k = k + 1
      id = held .. '~' .. stamp .. '~' .. k
      key = win_key(tag, id)
    until redis.call('EXISTS', key) == 0
    redis.call('RENAME', open, key)
    local na = redis.call('HINCRBY', key, 'na', 1)
    redis.call('HSET', key, 'id', id, 'a' .. na, cjson.encode({id = held}))
  end
  return key, id
end
