-- debit.lua: debit tokens from token buckets that decide.lua keeps, after
-- refilling them to now; a bucket is never taken below empty. The engine
-- uses it to carry what a node admitted on its own (while Redis was
-- unreachable) into the fleet's buckets when Redis is back, so that the
-- return to central decisions is not a burst of over-admission. bucket.lua
-- comes in front of it.
--
-- KEYS     the keys that hold the buckets (pkg/keyspace), each once; all
--          share one hash tag
-- ARGV[1]  now in µs, or 0 for Redis TIME
-- ARGV[2]  the buckets, each once: records of 9 little-endian int64,
--          bucket.lua's 8 (algorithm 1, rate, burst, period µs, the index
--          in KEYS of the bucket's key, the offset and length of its field
--          in ARGV[3], the next level of the same hash), then the tokens
--          to debit
-- ARGV[3]  the records' fields, concatenated
--
-- Returns each bucket's whole tokens left after the debit.
--
-- Side effects: writes each bucket with an expiry at the time it would be
-- full again (rate 0: a week), as decide.lua does.
--
-- Complexity: O(records).

local now = clock(ARGV[1])
use_levels(ARGV[2], 9, ARGV[3])
local out = {}
for i = 1, level_count() do
  local _, rate, burst, per = level_limit(i)
  local tokens = extra(i, '<i8')
  local cap = burst * per
  local level, last = read_bucket(stored(i), rate, burst, per, cap)
  if not level then level, last = cap, now end
  if now > last then
    if rate > 0 then level = math.min(level + (now - last) * rate, cap) end
    last = now
  end
  level = math.max(level - tokens * per, 0)
  write_bucket(i, level, last, rate, per, now, full_ms(cap, level, rate, 1000))
  out[i] = math.floor(level / per)
end
flush(now)
return out
