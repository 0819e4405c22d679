-- The classic Lua token bucket most users start from, re-implemented from its usual
-- description: HMGET of tokens and last_refill, refill by elapsed·rate from a time the client
-- passes in (float seconds), consume if enough, HMSET both fields and EXPIRE ceil(2·capacity/rate)
-- on every call, reply {allowed, floor(tokens), ceil(missing/rate)}. The peer in the benchmark's
-- redis workload and in tollgate-server's bench/run.sh.
-- KEYS[1] the bucket; ARGV: capacity, rate (tokens/s), now (s), requested.
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'last_refill')
local tokens = tonumber(v[1])
local last = tonumber(v[2])
if tokens == nil then
  tokens = capacity
  last = now
end
local elapsed = math.max(0, now - last)
tokens = math.min(capacity, tokens + elapsed * rate)
local allowed = 0
if tokens >= requested then
  tokens = tokens - requested
  allowed = 1
end
redis.call('HMSET', KEYS[1], 'tokens', tokens, 'last_refill', now)
redis.call('EXPIRE', KEYS[1], math.ceil(2 * capacity / rate))
local missing = 0
if allowed == 0 then missing = requested - tokens end
return {allowed, math.floor(tokens), math.ceil(missing / rate)}
