-- tollgate: the token bucket's decision on one key, as a function: the bucket script
-- (bucket.lua) and the batch script (windows.lua) both run it.
--
-- The value is the engine's own state (tollgate's `TokenBucket::decide_stored`): the bucket's
-- stamp, the instant it was (or will be) empty in 1/m ns units, and the clock the stamp is
-- counted on: its start in server microseconds, its m, and its offset (the clock's reading at
-- the start, at least the fill). 36 bytes: the tag 'tgb1' (the format, version 1), seven
-- big-endian 32-bit limbs, and a check word computed from them (src/value.rs documents the
-- format; a value that is not one is refused with the code TOLLGATE_CORRUPT, never read as a
-- bucket). Lua's numbers are doubles, exact below 2^53, so every 64-bit quantity here is a
-- (hi, lo) pair of 32-bit limbs.
--
-- The script decides and writes; the client rebuilds the decision's fields (remaining, waits)
-- from the stamp and the clock it returns, with the same engine function, and checks that both
-- agree on the verdict.
--
-- KEYS[1]  the bucket
-- ARGV[1]  56 bytes, fourteen big-endian 32-bit words (one argument: Redis builds one Lua
--          string for it, and one C call unpacks it):
--            flags          bit 0: take (else peek); bit 1: decide at `at` (a replay) instead
--                           of the server's TIME. A replayed instant has no relation to the
--                           server's real time, so a key written at one gets no expiry.
--            cost (2)       n·t in units; at most the fill
--            m              units per nanosecond
--            offset (2)     the clock's offset for a new bucket; at least the fill
--            fill (2)       burst·t
--            last (2)       the last whole microsecond of the quota's lifetime (at most 2^53)
--            lifetime (2)   lifetime_ns·m: the clock stops there
--            at (2)         the replayed instant, µs since the Unix epoch (at most 2^53)
--
-- Returns 20 bytes, five big-endian 32-bit words: taken (0/1), the stamp as it was before the
-- decision (2), and the bucket clock the decision was taken at (2).
local P = 4294967296

local function lt(ah, al, bh, bl)
  return ah < bh or (ah == bh and al < bl)
end
local function add(ah, al, bh, bl)
  local h, l = ah + bh, al + bl
  if l >= P then return h + 1, l - P end
  return h, l
end
-- a − b, for a ≥ b
local function sub(ah, al, bh, bl)
  local h, l = ah - bh, al - bl
  if l < 0 then return h - 1, l + P end
  return h, l
end
-- The check word of a value's seven limbs: a polynomial modulo the largest prime below 2^32,
-- every step below 2^37 (exact in doubles), as src/value.rs computes it.
local CHECK_PRIME = 4294967291
local function checkword(w1, w2, w3, w4, w5, w6, w7)
  local c = 0
  for _, w in ipairs({w1, w2, w3, w4, w5, w6, w7}) do
    c = (c * 31 + w) % CHECK_PRIME
  end
  return c
end
-- Why `raw` (a key's value) is not a tollgate bucket, or nil when it is one.
local function tollgate_bucket_invalid(raw)
  if #raw ~= 36 then
    return 'the value is ' .. #raw .. ' bytes, not a tollgate bucket of 36'
  end
  if string.sub(raw, 1, 4) ~= 'tgb1' then
    return 'the value does not begin with the tag tgb1 of a tollgate bucket'
  end
  local o1, o2, km, kh, kl, sh, sl, check = struct.unpack('>I4I4I4I4I4I4I4I4', raw, 5)
  local want = checkword(o1, o2, km, kh, kl, sh, sl)
  if check ~= want then
    return string.format("the value's check word is %d, not the %d its fields give: not a tollgate bucket, or damaged", check, want)
  end
  if km < 1 or km > 64 then
    return 'the value\'s clock counts ' .. km .. ' units per ns, not 1 to 64'
  end
  return nil
end

-- The decision on `key` under the 56-byte `arg` (ARGV[1] of bucket.lua: its `at` is not
-- read here) at `now_us`, the key holding `raw` (false when missing); `replay`: a replayed
-- instant, so the key gets no expiry. Returns the 20-byte reply, or an error reply.
local function tollgate_bucket(key, arg, now_us, replay, raw)
  local flags, ch, cl, m, oh, ol, fh, fl, last_h, last_l, lh, ll =
    struct.unpack('>I4I4I4I4I4I4I4I4I4I4I4I4', arg)
  local take = flags % 2 == 1
  local last_us = last_h * P + last_l

  local function corrupt(why)
    return redis.error_reply('TOLLGATE_CORRUPT ' .. why)
  end

  local function store(origin, kh, kl, sh, sl, nh, nl)
    -- The key lives until the bucket is full again under every quota that can share it: those
    -- of this unit whose fill is at most the clock's offset k, so until `stamp + k` on the clock
    -- (an expiry from this quota's own fill would hand a slower quota a full bucket too soon).
    -- That is floor(units / (m·10^6)) + 2 ms, at least ceil + 1: 1 ms for Redis's millisecond
    -- clock trailing TIME's microseconds; the doubles' rounding error is far below the rest.
    -- An early expiry would hand out a full bucket too soon; a late one costs nothing.
    local oh1 = math.floor(origin / P)
    local ol1 = origin - oh1 * P
    local value = 'tgb1' .. struct.pack('>I4I4I4I4I4I4I4I4', oh1, ol1, m, kh, kl, sh, sl,
      checkword(oh1, ol1, m, kh, kl, sh, sl))
    if replay then
      redis.call('SET', key, value)
      return
    end
    local ah, al = add(sh, sl, kh, kl)
    local uh, ul = sub(ah, al, nh, nl)
    local ms = math.floor((uh * P + ul) / (m * 1000000)) + 2
    redis.call('SET', key, value, 'PX', ms)
  end

  -- The stored clock and stamp, or a new full bucket on a clock starting now.
  local origin, kh, kl, sh, sl = now_us, oh, ol, sub(oh, ol, fh, fl)
  local restarted = false
  if raw then
    local why = tollgate_bucket_invalid(raw)
    if why then
      return corrupt(why)
    end
    local o1, o2, km
    o1, o2, km, kh, kl, sh, sl = struct.unpack('>I4I4I4I4I4I4I4', raw, 5)
    origin = o1 * P + o2
    if km ~= m or lt(kh, kl, fh, fl) then
      -- A clock of another unit, or one with too little room for this quota's fill: the bucket
      -- restarts empty on this quota's clock (an error toward refusal, never a free burst).
      origin, kh, kl, sh, sl = now_us, oh, ol, oh, ol
      restarted = true
    end
  end

  -- The bucket clock: offset + elapsed·m, elapsed in ns (whole µs here), stopped at the lifetime.
  local e = now_us - origin
  if e < 0 then e = 0 end
  local eh, el
  if e > last_us then
    eh, el = lh, ll
  else
    local k = 1000 * m
    local e1 = math.floor(e / P)
    local lo = (e - e1 * P) * k
    local c = math.floor(lo / P)
    eh, el = e1 * k + c, lo - c * P
  end
  local nh, nl = add(kh, kl, eh, el)
  if nh >= P then nh, nl = P - 1, P - 1 end
  local floor_h, floor_l = sub(nh, nl, fh, fl)

  local taken = 0
  if take then
    -- base = max(stamp, floor); take when base + cost ≤ now, tested as base ≤ now − cost.
    local bh, bl = sh, sl
    if lt(bh, bl, floor_h, floor_l) then bh, bl = floor_h, floor_l end
    local lim_h, lim_l = sub(nh, nl, ch, cl)
    if not lt(lim_h, lim_l, bh, bl) then
      local xh, xl = add(bh, bl, ch, cl)
      store(origin, kh, kl, xh, xl, nh, nl)
      taken = 1
    end
  end
  -- A restart is kept by a take (even a refused one, or the clock would restart at every call
  -- and never refill); a peek writes nothing.
  if restarted and take and taken == 0 then
    store(origin, kh, kl, sh, sl, nh, nl)
  end
  return struct.pack('>I4I4I4I4I4', taken, sh, sl, nh, nl)
end
