-- debit.lua: debit tokens from token buckets that decide.lua keeps, after
-- refilling them to now; a bucket is never taken below minus its burst (a
-- debt, which decide.lua refills as any level). The engine uses it to
-- carry what a node took on its own (while Redis was unreachable) into the
-- fleet's buckets when Redis is back, so that the return to central
-- decisions is not a burst of over-admission.
--
-- KEYS[i]  a bucket (see decide.lua for the format); all keys share one
--          hash tag
-- ARGV[1]  now in µs, or 0 for Redis TIME
-- ARGV[1+4(i-1)+1..4]  bucket i: tokens to debit, rate, burst, period µs
--
-- Returns each bucket's whole tokens left after the debit.
--
-- Side effects: writes each bucket with an expiry at the time it would be
-- full again (rate 0: a week), as decide.lua does.
--
-- Complexity: O(#KEYS).

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local out = {}
for i, key in ipairs(KEYS) do
  local a = 1 + 4 * (i - 1)
  local tokens, rate, burst, per = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local cap = burst * per
  local level, last = cap, now
  local v = redis.call('GET', key)
  if v and #v == 32 then
    local l, t, p = struct.unpack('<i8i8i8i8', v)
    if p ~= per then
      if l >= burst * p then l = cap else l = math.floor(l * per / p) end
    end
    level, last = math.min(l, cap), t
  end
  if now > last then
    if rate > 0 then level = math.min(level + (now - last) * rate, cap) end
    last = now
  end
  level = math.max(level - tokens * per, -cap)
  local value = struct.pack('<i8i8i8i8', level, last, per, rate)
  local ms = 7 * 24 * 3600 * 1000 -- rate 0: as decide.lua
  if rate > 0 then ms = math.ceil((cap - level) / rate / 1000) + 1000 end
  redis.call('SET', key, value, 'PX', string.format('%d', ms))
  out[i] = math.floor(level / per)
end
return out
