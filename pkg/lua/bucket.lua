-- bucket.lua: the bucket code every script that keeps a plane's levels
-- shares, written once and composed in front of each of them when it
-- loads (script.go: the SHA-1 is the composed text's). It is not a script
-- of its own.
--
-- Levels. A call names its levels in KEYS (pkg/keyspace) and their limits
-- in one binary string of records, one per key, each starting with 4
-- little-endian int64: algorithm (0 none, 1 token bucket, 2 sliding
-- window, 3 share bucket), rate, burst, period µs; a script's records may
-- carry more int64 after these (its header says which).
--
-- A bucket is 32 bytes, four little-endian int64 (BUCKET_FORMAT): level
-- in token·µs, last refill µs, and the period and rate it was written with
-- (binary: packing and unpacking is C, where formatting and parsing text is
-- Lua and garbage). A missing bucket is full; a value of another shape
-- reads as missing. A bucket read with another period has its tokens
-- rescaled (to within a token: doubles). A bucket is written with an
-- expiry at the time it would be full again, when losing it changes
-- nothing; one of rate 0 never refills and expires a week after its last
-- write. A sliding window is a list of "at:cost" entries, oldest first.

-- The library functions the scripts call per level, as locals: a global's
-- field is two table lookups a call.
local min, max, floor, ceil = math.min, math.max, math.floor, math.ceil
local spack, sunpack, call = struct.pack, struct.unpack, redis.call

local BUCKET_FORMAT = '<i8i8i8i8'
-- a bucket of a limit that never refills (rate 0) expires after a week
-- without a debit: state for holders requests name must not live forever
local NO_REFILL_TTL_MS = 7 * 24 * 3600 * 1000

-- clock returns the time a script decides at, µs: arg, or Redis TIME when
-- arg is 0 (what production does: one clock for the whole fleet).
local function clock(arg)
  local now = tonumber(arg)
  if now == 0 then
    local t = call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- floor(a / b) for integers up to 2^53, b > 0, exactly: the float quotient
-- is off by at most one.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- read_bucket returns the level and last refill of a bucket of rate, burst
-- and period per stored as v (a GET's reply), capped at top (token·µs; its
-- burst, or more where a script allows), and whether it was written with
-- another rate or period; nil when v holds no bucket.
local function read_bucket(v, rate, burst, per, top)
  if not v or #v ~= 32 then return nil end
  local l, last, p, r = sunpack(BUCKET_FORMAT, v)
  if p ~= per then -- the period changed: rescale the tokens
    if l >= burst * p then l = burst * per else l = floor(l * per / p) end
  end
  return min(l, top), last, p ~= per or r ~= rate
end

-- px_text holds the PX arguments this call formatted, by ms. Redis turns a
-- Lua number argument into text with "%.17g", a floating-point conversion
-- that cost more than a third of a SET PX (perf, BenchmarkDecideScript);
-- an expiry is an integer of ms, formatted as one ("%d") once per value,
-- and the buckets of a batch mostly share their values.
local px_text = {}

-- write_bucket stores a bucket of rate and per at key, holding level
-- token·µs of full at last µs, to expire when it is full again, plus
-- linger ms, and in no less than least ms (optional: reconcile.lua's hold
-- in virtual time).
local function write_bucket(key, level, last, rate, per, full, linger, least)
  local ms = NO_REFILL_TTL_MS
  if rate > 0 then ms = max(ceil((full - level) / rate / 1000) + linger, least or 0) end
  local px = px_text[ms]
  if not px then
    px = string.format('%d', ms)
    px_text[ms] = px
  end
  call('SET', key, spack(BUCKET_FORMAT, level, last, per, rate), 'PX', px)
end

-- read_window returns a window's entries, oldest first: their times and
-- costs, and the sum of the costs.
local function read_window(key)
  local at, cost, sum = {}, {}, 0
  for j, item in ipairs(call('LRANGE', key, 0, -1)) do
    local a, c = string.match(item, '^(%d+):(%d+)$')
    at[j], cost[j] = tonumber(a), tonumber(c)
    sum = sum + cost[j]
  end
  return at, cost, sum
end
