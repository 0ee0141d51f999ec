-- bucket.lua: what every script that keeps a plane's levels shares, written
-- once and composed in front of each of them when it loads (script.go: the
-- SHA-1 is the composed text's). It is not a script of its own.
--
-- Levels. A call names its levels in one binary string of records, one
-- per level, each starting with 8 little-endian int64 (LEVEL_FORMAT):
-- algorithm (0 none, 1 token bucket, 2 sliding window, 3 share bucket),
-- rate, burst, period µs, the index in KEYS of the key that holds the
-- level's state, the offset (from 0) and length of its field in the
-- call's fields string, and the next level that is a field of the same
-- hash (the levels of one hash are a ring: the last names the first; 0
-- without a field). A level without a field is the whole key (a bucket's
-- string or a window's list); one with a field is that field of a hash
-- (pkg/keyspace: a tenant's hash holds its tenant, allowance, share and
-- endpoint buckets). A script's records may carry more int64 after these
-- 8 (its width says how many; extra reads them). Records are read when a
-- level is first needed, not all at once.
--
-- A bucket is 32 bytes, four little-endian int64 (BUCKET_FORMAT): level
-- in token·µs, last refill µs, and the period and rate it was written with
-- (binary: packing and unpacking is C, where formatting and parsing text is
-- Lua and garbage). A missing bucket is full; a value of another shape
-- reads as missing. A bucket read with another period has its tokens
-- rescaled (to within a token: doubles).
--
-- Hashes. The fields of one hash that a call names are read together, with
-- one HMGET, the first time one of them is needed, and the written ones
-- written together, with one HSET, when the script ends (flush). A hash
-- expires as a whole: at the latest of the times its fields' buckets were
-- written to be full again (rounded up to whole seconds, so that a busy
-- tenant's hash moves its expiry once a second, not with every call),
-- which the hash keeps in its field x ('<i8', µs of the scripts' clock).
-- Its fields are bounded by the policy (tenant, allowance, share, one per
-- limited endpoint), so a field that stays behind until its hash expires
-- costs little.
--
-- Migration. A field missing from its hash is read from the key of its own
-- that version 1 of the layout kept it in (legacy), with one MGET per hash
-- and call for all its missing fields: a bucket an earlier version wrote
-- is carried over, not taken as full. Such keys expire on their own; the
-- field is written, and the key no longer read, when the bucket changes.

local BUCKET_FORMAT = '<i8i8i8i8'
local LEVEL_FORMAT = '<i8i8i8i8i8i8i8i8'
-- a bucket of a limit that never refills (rate 0) expires after a week
-- without a debit: state for holders requests name must not live forever
local NO_REFILL_TTL_MS = 7 * 24 * 3600 * 1000

-- clock returns the time a script decides at, µs: arg, or Redis TIME when
-- arg is 0 (what production does: one clock for the whole fleet).
local function clock(arg)
  local now = tonumber(arg)
  if now == 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- floor(a / b) for integers up to 2^53, b > 0, exactly: the float quotient
-- is off by at most one.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- The call's levels (use_levels), and what is known of them, by level
-- index: the key index of each level read, and its field (false: none).
local lv_records, lv_width, lv_fields = '', 0, ''
local lv_key, lv_field = {}, {}
-- By KEYS index, for hashes: field -> value (false: none); the field x
-- read; the latest time a written field is full again; the HSET arguments.
local hash_values, hash_expiry, hash_latest, hash_writes = {}, {}, {}, {}

-- use_levels sets the call's levels: records of width int64, and fields.
local function use_levels(records, width, fields)
  lv_records, lv_width, lv_fields = records, width, fields
end

-- level_count is the number of levels of the call.
local function level_count()
  return #lv_records / (8 * lv_width)
end

-- level_limit returns level i's algorithm, rate, burst and period µs, and
-- notes where it is.
local function level_limit(i)
  local alg, rate, burst, per, key, off, n = struct.unpack(LEVEL_FORMAT, lv_records, 8 * lv_width * (i - 1) + 1)
  lv_key[i], lv_field[i] = key, n > 0 and string.sub(lv_fields, off + 1, off + n)
  return alg, rate, burst, per
end

-- extra returns level i's first extra int64 (format '<i8', '<i8i8', ...).
local function extra(i, format)
  return struct.unpack(format, lv_records, 8 * lv_width * (i - 1) + 65)
end

-- level_key is the key that holds level i (after level_limit).
local function level_key(i)
  return KEYS[lv_key[i]]
end

-- load_hash reads every field of the hash of level i that the call's
-- levels name (its ring), and from version 1's keys those it lacks.
local function load_hash(i)
  local k = lv_key[i]
  local key = KEYS[k]
  local names, j = {'x'}, i
  repeat
    local off, n, nxt = struct.unpack('<i8i8i8', lv_records, 8 * lv_width * (j - 1) + 41)
    names[#names + 1] = string.sub(lv_fields, off + 1, off + n)
    j = nxt
  until j == i or j == 0
  local got = redis.call('HMGET', key, unpack(names))
  local values = {}
  hash_values[k], hash_expiry[k], hash_latest[k] = values, got[1] and struct.unpack('<i8', got[1]) or 0, 0
  -- version 1 kept field f or f:rest of qp:{P}:h:H as qp:{P}:f:H or
  -- qp:{P}:f:H:rest (pkg/keyspace)
  local at = string.find(key, '}:h:', 1, true)
  local prefix, holder = at and string.sub(key, 1, at + 1), at and string.sub(key, at + 4)
  local missing, old = nil, nil
  for m = 2, #names do
    local field, v = names[m], got[m]
    values[field] = v
    if not v and prefix then
      if not missing then missing, old = {}, {} end
      missing[#missing + 1] = field
      old[#old + 1] = prefix .. string.sub(field, 1, 1) .. ':' .. holder .. string.sub(field, 2)
    end
  end
  if missing then
    local vs = redis.call('MGET', unpack(old))
    for m, field in ipairs(missing) do values[field] = vs[m] end
  end
end

-- stored is the value that holds level i's bucket (false when none), after
-- level_limit; a window's is read by the script itself (LRANGE level_key).
local function stored(i)
  local field = lv_field[i]
  if not field then return redis.call('GET', KEYS[lv_key[i]]) end
  if not hash_values[lv_key[i]] then load_hash(i) end
  return hash_values[lv_key[i]][field]
end

-- read_bucket returns the level and last refill of a bucket of rate, burst
-- and period per stored as v, capped at top (token·µs; its burst, or more
-- where a script allows), and whether it was written with another rate or
-- period; nil when v holds no bucket.
local function read_bucket(v, rate, burst, per, top)
  if not v or #v ~= 32 then return nil end
  local l, last, p, r = struct.unpack(BUCKET_FORMAT, v)
  if p ~= per then -- the period changed: rescale the tokens
    if l >= burst * p then l = burst * per else l = math.floor(l * per / p) end
  end
  return math.min(l, top), last, p ~= per or r ~= rate
end

-- full_ms is how long a bucket of rate holding level token·µs of full
-- takes to be full again, in ms, plus linger ms: when losing it changes
-- nothing. A bucket of rate 0 never refills: a week.
local function full_ms(full, level, rate, linger)
  if rate <= 0 then return NO_REFILL_TTL_MS end
  return math.ceil((full - level) / rate / 1000) + linger
end

-- write_bucket stores level i's bucket (after stored(i)), of rate and per,
-- to expire after ms: a whole key at once, a field at flush.
local function write_bucket(i, level, last, rate, per, now, ms)
  local v = struct.pack(BUCKET_FORMAT, level, last, per, rate)
  local k, field = lv_key[i], lv_field[i]
  if not field then
    redis.call('SET', KEYS[k], v, 'PX', string.format('%d', ms))
    return
  end
  hash_values[k][field] = v
  local w = hash_writes[k]
  if not w then
    w = {}
    hash_writes[k] = w
  end
  w[#w + 1], w[#w + 2] = field, v
  hash_latest[k] = math.max(hash_latest[k], now + ms * 1000)
end

-- flush writes every hash's written fields, and its expiry when it grew.
local function flush(now)
  for k, w in pairs(hash_writes) do
    if hash_latest[k] > hash_expiry[k] then
      local expiry = math.ceil(hash_latest[k] / 1000000) * 1000000
      w[#w + 1], w[#w + 2] = 'x', struct.pack('<i8', expiry)
      redis.call('HSET', KEYS[k], unpack(w))
      redis.call('PEXPIRE', KEYS[k], string.format('%d', math.ceil((expiry - now) / 1000)))
    else
      redis.call('HSET', KEYS[k], unpack(w))
    end
  end
end

-- read_window returns a window's entries, oldest first: their times and
-- costs, and the sum of the costs.
local function read_window(key)
  local at, cost, sum = {}, {}, 0
  for j, item in ipairs(redis.call('LRANGE', key, 0, -1)) do
    local a, c = string.match(item, '^(%d+):(%d+)$')
    at[j], cost[j] = tonumber(a), tonumber(c)
    sum = sum + cost[j]
  end
  return at, cost, sum
end
