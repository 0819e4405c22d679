-- tollgate: fixed windows, sliding windows, token buckets and nginx's limit_req in Redis
-- strings, a batch of them decided in one call on the server's clock. Appended to bucket_core.lua, whose `tollgate_bucket` decides a
-- bucket.
--
-- Each value is the engine's own fixed-window word (tollgate's `FixedWindow`, src/policies/
-- window.rs): the window's count in its low b bits (24 for a limit up to 2^24 − 1, else as
-- many as the limit has, at most 32), the window's index + 1 in the high 64 − b, windows of
-- W µs aligned on multiples of W since the Unix epoch. 12 bytes: the tag 'tgw1' (the format,
-- version 1, a 24-bit count) or 'tgwA' to 'tgwH' (a count of 25 to 32 bits: a word means
-- nothing under another width, and a key holding one is refused as any foreign value is) and
-- the word as two big-endian 32-bit limbs. Lua's numbers are doubles, exact
-- below 2^53, so the word is read and written as (hi, lo) limbs: index + 1 is
-- hi·2^(32 − b) + floor(lo / 2^b), the count lo mod 2^b. A value that is not one is refused
-- with the code TOLLGATE_CORRUPT, never read as a window.
--
-- The script decides and writes every key of the batch; the client runs the engine's decision
-- on the word each key held and the instant the script read, and checks that the engine would
-- have written what the script wrote: every decision is the engine's, bit for bit.
--
-- KEYS[i]   the window or bucket of check i
-- ARGV[1]   one argument, big-endian 32-bit words: the batch's flags (bit 0: decide at ARGV[2],
--           a replay, instead of the server's TIME), then per check its kind and its words:
--             1, a window: 7 words
--               flags   bit 0: refused hits count (`FixedWindow::charging_refusals`); bit 2:
--                       `window` is in whole seconds, else in µs (a year is 2^44.8 µs,
--                       beyond one word)
--               limit   the window's limit, at most 2^32 − 1 (above 2^24 − 1, a window of a
--                       second or more)
--               window  the window's length, in µs or seconds (see bit 2), at least 1
--               n (hi, lo)
--               up_to (hi, lo)  a lease: when the window has at least n left, take up to
--                       this many (all there is, if fewer); at most n: exactly n
--             2, a bucket: 14 words, bucket_core.lua's argument
--             3, a sliding window: 7 words
--               flags   bit 2: `window` is in whole seconds, else in µs
--               limit   the window's limit, at most 2^20 − 1
--               window  as a fixed window's
--               n (hi, lo)
--               last (hi, lo)  the engine's largest stored index, 2^(64 − 2·bits(limit)) − 1
--                       (at most 2^53)
--             4, nginx's limit_req: 7 words
--               0
--               burst   B·1000 (below 2^24)
--               0
--               rate (hi, lo)  milli-requests per second (below 2^50)
--               n (hi, lo)
-- ARGV[2]   the replayed instant, µs since the Unix epoch, as decimal text (at most 2^53)
--
-- Returns the instant decided at (µs, two limbs), then per check: for a window, the word the
-- key held before the decision and the word the script wrote (two limbs each; 0 for a missing
-- key, and for nothing written); for a bucket, its 20-byte reply; for a sliding window, the
-- state the key held and the state the script wrote (index + 1 as two limbs, curr, prev; all
-- 0 for a missing key, and for nothing written); for nginx's, the state the key held and the
-- state the script wrote (last as two limbs, the field; 0 for nothing written, the instant
-- decided at for a missing key).
--
-- A sliding window's value is 'tgs1' and the engine's `SlidingWindow` word's three fields as
-- big-endian 32-bit words: index + 1 (two limbs), curr, prev; windows aligned on multiples of
-- W since the Unix epoch. The client packs them into the engine's word (whose layout depends
-- on the limit) and checks the script's write against the engine's decision.
--
-- nginx's value is 'tgn1', the last request's instant in ms since the Unix epoch (two limbs)
-- and the engine's `Nginx` field (the excess + 1,000, in milli-requests; src/policies/
-- nginx.rs). The client decides with the engine on the clock whose origin is the earlier of
-- that instant and now (nginx's decision depends on their difference only) and checks the
-- script's write.
local args = ARGV[1]

local batch_flags, at = struct.unpack('>I4', args)
local replay = batch_flags % 2 == 1
local now_us
if replay then
  now_us = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The count's width of a window of `limit` (the engine's `FixedWindow::count_bits`): 24, or
-- the limit's bits.
local function window_bits(limit)
  local b = 24
  while limit > 2 ^ b - 1 do b = b + 1 end
  return b
end

-- A window value's tag for its count's width.
local function window_tag(b)
  if b == 24 then return 'tgw1' end
  return 'tgw' .. string.char(64 + b - 24)
end

local function window(key, raw, flags, limit, window, nh, nl, uh, ul)
  local charge = flags % 2 == 1
  local w_us = window
  if math.floor(flags / 4) % 2 == 1 then w_us = window * 1000000 end
  local n = nh * P + nl
  local up_to = uh * P + ul
  local hi, lo = 0, 0
  if raw then
    hi, lo = struct.unpack('>I4I4', raw, 5)
  end
  -- The engine's layout for this limit: b bits of count (C = 2^b), the index above them.
  local b = window_bits(limit)
  local C, I = 2 ^ b, 2 ^ (32 - b)
  local MASK, MAX_INDEX = C - 1, 2 ^ (64 - b) - 1
  local stored = hi * I + math.floor(lo / C)
  local count = lo % C
  -- The engine's: the current window's index + 1; the stored index never moves back.
  -- (At most 2^(64 − b) − 1, where the engine's index stops: with 24 bits of count, a window
  -- of under 1.6 ms on the epoch's clock is already there, and never ends.)
  local now_index = math.floor(now_us / w_us) + 1
  if now_index > MAX_INDEX then now_index = MAX_INDEX end
  local index = now_index
  if stored >= now_index then index = stored else count = 0 end
  local next_count = nil
  if n == 0 then
    next_count = nil
  elseif n <= limit and count + n <= limit then
    next_count = count + n
    if up_to > n then
      -- A lease: all the window has left, up to `up_to`.
      next_count = math.min(count + up_to, limit)
    end
  elseif charge and n <= MASK then
    -- Refused and counted, held at the count's largest value.
    local c = count + n
    if c > MASK then c = MASK end
    if c > count then next_count = c end
  end
  local whi, wlo = 0, 0
  if next_count then
    whi = math.floor(index / I)
    wlo = (index % I) * C + next_count
    -- The key lives until its window ends (then a missing key is a fresh window, as the
    -- engine's word of an older window is); 1 ms more for Redis's millisecond clock.
    -- A replayed instant has no relation to the server's real time, and the last window never
    -- ends: no expiry then.
    local value = window_tag(b) .. struct.pack('>I4I4', whi, wlo)
    if replay or index == MAX_INDEX then
      redis.call('SET', key, value)
    else
      local ms = math.ceil((index * w_us - now_us) / 1000) + 1
      redis.call('SET', key, value, 'PX', ms)
    end
  end
  return struct.pack('>I4I4I4I4', hi, lo, whi, wlo)
end

-- a·b as (hi, lo) limbs, for a < 2^21 and b < 2^53: every partial product below 2^53.
local function mul(a, b)
  local b1 = math.floor(b / P)
  local low = a * (b - b1 * P)
  local carry = math.floor(low / P)
  return a * b1 + carry, low - carry * P
end

local function sliding(key, raw, flags, limit, window, nh, nl, mh, ml)
  local w_us = window
  if math.floor(flags / 4) % 2 == 1 then w_us = window * 1000000 end
  local n = nh * P + nl
  local last = mh * P + ml
  local sh, sl, s_curr, s_prev = 0, 0, 0, 0
  if raw then
    sh, sl, s_curr, s_prev = struct.unpack('>I4I4I4I4', raw, 5)
  end
  local stored = sh * P + sl
  -- The engine's general path: the clock's window (index + 1, never past `last`), the counts
  -- as the decision sees them (the stored window's, or the next one's, whose prev is the
  -- stored curr, or none), and δ into the window.
  local now_index = math.floor(now_us / w_us) + 1
  if now_index > last then now_index = last end
  local index, prev, curr = now_index, 0, 0
  if stored >= now_index then
    index, prev, curr = stored, s_prev, s_curr
  elseif stored + 1 == now_index then
    prev = s_curr
  end
  local delta = 0
  if index < last and (index - 1) * w_us <= now_us then delta = now_us - (index - 1) * w_us end
  local wh, wl, wc, wp = 0, 0, 0, 0
  if n >= 1 and n <= limit then
    -- prev·(W − δ) + (curr + n)·W ≤ N·W, in µs (the engine's in ns, over 1,000).
    local ah, al = mul(prev, w_us - delta)
    local bh, bl = mul(curr + n, w_us)
    local xh, xl = add(ah, al, bh, bl)
    local yh, yl = mul(limit, w_us)
    if not lt(yh, yl, xh, xl) then
      wh, wl, wc, wp = math.floor(index / P), index % P, curr + n, prev
      local value = 'tgs1' .. struct.pack('>I4I4I4I4', wh, wl, wc, wp)
      -- The counts matter until the window after this one ends; 1 ms more for Redis's clock.
      if replay or index >= last then
        redis.call('SET', key, value)
      else
        local ms = math.ceil(((index + 1) * w_us - now_us) / 1000) + 1
        redis.call('SET', key, value, 'PX', ms)
      end
    end
  end
  return struct.pack('>I4I4I4I4I4I4I4I4', sh, sl, s_curr, s_prev, wh, wl, wc, wp)
end

local function nginx(key, raw, burst, rh, rl, nh, nl)
  local rate = rh * P + rl
  local n = nh * P + nl
  local now_ms = math.floor(now_us / 1000)
  local lh, ll, field = math.floor(now_ms / P), now_ms % P, 0
  if raw then
    lh, ll, field = struct.unpack('>I4I4I4', raw, 5)
  end
  local last = lh * P + ll
  local elapsed = now_ms - last
  local ms = elapsed
  if elapsed < -60000 then ms = 1 elseif elapsed < 0 then ms = 0 end
  -- Past `cap` ms everything leaks (the field is below 2^24 < 2^25): the product stays exact.
  local cap = math.floor(1000 * 33554432 / rate) + 1
  if ms > cap then ms = cap end
  local left = field - math.floor(rate * ms / 1000)
  if left < 0 then left = 0 end
  local wh, wl, wf = 0, 0, 0
  if n >= 1 and n <= math.floor(burst / 1000) + 1 and left + n * 1000 <= burst + 1000 then
    wf = left + n * 1000
    local stamp = last
    if ms ~= 0 then stamp = now_ms end
    wh, wl = math.floor(stamp / P), stamp % P
    local value = 'tgn1' .. struct.pack('>I4I4I4', wh, wl, wf)
    if replay then
      redis.call('SET', key, value)
    else
      -- Until the field has leaked away: a missing key is then the same node. 2 ms more: for
      -- Redis's millisecond clock, and for the quotient's rounding.
      redis.call('SET', key, value, 'PX', math.ceil(wf * 1000 / rate) + 2 + math.max(0, stamp - now_ms))
    end
  end
  return struct.pack('>I4I4I4I4I4I4', lh, ll, field, wh, wl, wf)
end

-- Each check's kind and where its words start, and every key's value, all read (and checked)
-- before anything is written: a key of the wrong type or content fails the whole batch with
-- nothing changed, not after the keys before it were decided (a script's writes are not
-- rolled back).
local SHAPES = {
  [1] = { words = 28, tag = 'tgw1', bytes = 12, what = 'a tollgate window' }, -- the tag by width
  [2] = { words = 56 },
  [3] = { words = 28, tag = 'tgs1', bytes = 20, what = 'a tollgate sliding window' },
  [4] = { words = 28, tag = 'tgn1', bytes = 16, what = 'a tollgate nginx limit' },
}
local kinds, starts, values = {}, {}, {}
for i, key in ipairs(KEYS) do
  if at + 3 > #args then
    return redis.error_reply('TOLLGATE_ARGS the checks end before key ' .. key)
  end
  local kind
  kind, at = struct.unpack('>I4', args, at)
  local shape = SHAPES[kind]
  if not shape or at + shape.words - 1 > #args then
    return redis.error_reply('TOLLGATE_ARGS check ' .. key .. ' is of kind ' .. kind .. ' or too short')
  end
  kinds[i], starts[i] = kind, at
  at = at + shape.words
  local raw = redis.call('GET', key)
  if raw then
    local why
    local tag, what = shape.tag, shape.what
    if kind == 1 then
      local _, limit = struct.unpack('>I4I4', args, starts[i])
      local b = window_bits(limit)
      tag = window_tag(b)
      if b > 24 then what = 'a tollgate window of a ' .. b .. '-bit count' end
    end
    if kind == 2 then
      why = tollgate_bucket_invalid(raw)
    elseif #raw ~= shape.bytes or string.sub(raw, 1, 4) ~= tag then
      why = 'holds ' .. #raw .. ' bytes that are not ' .. what .. ' (' .. tag .. ', ' .. shape.bytes .. ' bytes)'
    end
    if why then
      return redis.error_reply('TOLLGATE_CORRUPT ' .. key .. ' ' .. why)
    end
  end
  values[i] = raw
end
if at <= #args then
  return redis.error_reply('TOLLGATE_ARGS ' .. (#args - at + 1) .. ' bytes after the last check')
end

local out = { struct.pack('>I4I4', math.floor(now_us / P), now_us % P) }
-- One check after the other: a key named twice in one batch would see the first check's
-- write; the client refuses such batches.
for i, key in ipairs(KEYS) do
  local kind, from, raw = kinds[i], starts[i], values[i]
  local reply
  if kind == 2 then
    reply = tollgate_bucket(key, string.sub(args, from, from + 55), now_us, replay, raw)
  else
    local a, b, c, d, e, f, g = struct.unpack('>I4I4I4I4I4I4I4', args, from)
    if kind == 1 then
      reply = window(key, raw, a, b, c, d, e, f, g)
    elseif kind == 3 then
      reply = sliding(key, raw, a, b, c, d, e, f, g)
    else
      -- nginx's words: 0, burst, 0, rate (two limbs), n (two limbs).
      reply = nginx(key, raw, b, d, e, f, g)
    end
  end
  if type(reply) == 'table' then
    return reply
  end
  out[#out + 1] = reply
end
return table.concat(out)
