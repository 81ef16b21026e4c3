-- lib/now.lua: defines now_ms(), Redis server time in whole ms, as a Lua number (a
-- script that stores or joins it to a string formats it with '%d').
-- Touches no key; calls TIME.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
