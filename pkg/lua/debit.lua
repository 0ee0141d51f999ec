-- debit.lua: debit tokens from token buckets that decide.lua keeps, after
-- refilling them to now; a bucket is never taken below minus its burst (a
-- debt, which decide.lua refills as any level). The engine uses it to
-- carry what a node took on its own (while Redis was unreachable) into the
-- fleet's buckets when Redis is back, so that the return to central
-- decisions is not a burst of over-admission.
-- bucket.lua comes in front of it.
--
-- KEYS[i]  a bucket (see decide.lua for the format); all keys share one
--          hash tag
-- ARGV[1]  now in µs, or 0 for Redis TIME
-- ARGV[2]  the buckets: #KEYS records of 5 little-endian int64, bucket.lua's
--          4 (algorithm 1, rate, burst, period µs), then the tokens to
--          debit
--
-- Returns each bucket's whole tokens left after the debit.
--
-- Side effects: writes each bucket with an expiry at the time it would be
-- full again (rate 0: a week), as decide.lua does.
--
-- Complexity: O(#KEYS).

local now = clock(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local _, rate, burst, per, tokens = struct.unpack('<i8i8i8i8i8', ARGV[2], 40 * (i - 1) + 1)
  local cap = burst * per
  local level, last = read_bucket(redis.call('GET', key), rate, burst, per, cap)
  if not level then level, last = cap, now end
  if now > last then
    if rate > 0 then level = math.min(level + (now - last) * rate, cap) end
    last = now
  end
  level = math.max(level - tokens * per, -cap)
  write_bucket(key, level, last, rate, per, cap, 1000)
  out[i] = math.floor(level / per)
end
return out
