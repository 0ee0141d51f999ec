-- publish.lua: publish the next version of one plane's policy, atomically.
--
-- KEYS[1]  the plane's policy hash, qp:{P}:policy, with the fields
--            current  the current version number N (decimal)
--            hash     the content hash of version N
--            v<n>     the encoding of version n, for the last K versions
-- ARGV[1]  the content hash of the policy to publish (hex SHA-256)
-- ARGV[2]  the policy's encoding as version ARGV[5]; opaque, never parsed here
-- ARGV[3]  K, how many versions to keep (an integer >= 1)
-- ARGV[4]  the pub/sub channel that hears of new versions, qp:{P}:policy
-- ARGV[5]  the version ARGV[2] was encoded as: current + 1, or 1 when none
--
-- Returns {version, outcome}:
--   {current, 0}   the current version's content hash is ARGV[1]: nothing
--                  changed and nothing is published (also when ARGV[5] is
--                  stale, so publishing the current content never conflicts)
--   {N, 1}         stored: ARGV[2] is now v<N> and current is N = ARGV[5]
--   {current, -1}  conflict: ARGV[5] is not current + 1 (another publisher
--                  got there first, or the caller guessed); nothing changed.
--                  The caller encodes the policy as current + 1 and calls
--                  again; the reply carries current, so no extra read.
--
-- Side effects, only when stored: HSET v<N>, hash and current; HDEL every
-- v<n> with n <= N - K (whatever K earlier calls used); PUBLISH N (decimal)
-- on ARGV[4].
--
-- Complexity: O(F + B): F fields of the hash (K + 2 when every publisher
-- keeps K) scanned once to drop old versions, B bytes of encoding stored.
--
-- Why the caller names N. The version number lives inside the encoding (the
-- policy's envelope carries it), but N is only known here. Rewriting the
-- encoding in Lua would tie this script to the envelope's JSON layout, so
-- the script takes the encoding whole and checks that the caller's N is the
-- next one: an optimistic write that fails cleanly instead of storing a blob
-- whose version disagrees with its field. The loser of a race retries with
-- the current version the reply hands back; some publisher wins every round.

local key = KEYS[1]
local hash = ARGV[1]
local blob = ARGV[2]
local keep = tonumber(ARGV[3])
local channel = ARGV[4]
local want = tonumber(ARGV[5])

if hash == '' then
  return redis.error_reply('ERR publish.lua: empty content hash')
end
if not keep or keep < 1 or keep ~= math.floor(keep) then
  return redis.error_reply('ERR publish.lua: versions to keep must be an integer >= 1, got ' .. tostring(ARGV[3]))
end
if not want or want < 1 or want ~= math.floor(want) then
  return redis.error_reply('ERR publish.lua: version must be an integer >= 1, got ' .. tostring(ARGV[5]))
end

local current = 0
local raw = redis.call('HGET', key, 'current')
if raw then
  current = tonumber(raw)
  if not current or current < 1 or current ~= math.floor(current) then
    return redis.error_reply('ERR publish.lua: ' .. key .. ' holds a corrupt current version ' .. tostring(raw))
  end
end

if current > 0 and redis.call('HGET', key, 'hash') == hash then
  return {current, 0}
end
if want ~= current + 1 then
  return {current, -1}
end

local n = string.format('%d', want)
redis.call('HSET', key, 'v' .. n, blob, 'hash', hash, 'current', n)

local oldest = want - keep
for _, field in ipairs(redis.call('HKEYS', key)) do
  local v = tonumber(string.match(field, '^v(%d+)$'))
  if v and v <= oldest then
    redis.call('HDEL', key, field)
  end
end

redis.call('PUBLISH', channel, n)
return {want, 1}
