-- tollgate: one token bucket in one Redis string, decided on the server's clock; the
-- decision is bucket_core.lua's `tollgate_bucket`, which this script is appended to.
--
-- KEYS[1]  the bucket
-- ARGV[1]  56 bytes (see bucket_core.lua); bit 1 of its flags: decide at its `at` (a replay)
--          instead of the server's TIME.
local flags, at_h, at_l = struct.unpack('>I4', ARGV[1]), struct.unpack('>I4I4', ARGV[1], 49)
local replay = math.floor(flags / 2) % 2 == 1
local now_us
if replay then
  now_us = at_h * P + at_l
else
  local t = redis.call('TIME')
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
return tollgate_bucket(KEYS[1], ARGV[1], now_us, replay, redis.call('GET', KEYS[1]))
