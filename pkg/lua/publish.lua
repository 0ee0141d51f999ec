-- publish.lua: publish the next version of one plane's policy, atomically.
--
-- KEYS[1]  the plane's policy hash, qp:{P}:policy, with the fields
--            current  the current version number N (decimal)
--            hash     the content hash of version N
--            v<n>     the encoding of version n, for the last K versions
--            sources  what the publisher compiled version N from (opaque;
--                     the manager's objects in force), when it gave any
--            sig<n>   the signature of version n, "<key id>:<signature>"
--                     (opaque here but for the key id), when signed
-- ARGV[1]  the content hash of the policy to publish (hex SHA-256)
-- ARGV[2]  the policy's encoding as version ARGV[5]; opaque, never parsed here
-- ARGV[3]  K, how many versions to keep (an integer >= 1)
-- ARGV[4]  the pub/sub channel that hears of new versions, qp:{P}:policy
-- ARGV[5]  the version ARGV[2] was encoded as: base + 1 (see ARGV[6])
-- ARGV[6]  floor: a version the next one must exceed even when Redis holds
--          less (an integer >= 0; absent or '' is 0). base = max(current,
--          floor): after Redis lost its data, the caller's record of the
--          last version keeps versions growing instead of restarting at 1.
-- ARGV[7]  sources: stored in the sources field (absent or '': none)
-- ARGV[8]  the signature of ARGV[2], "<key id>:<signature>" (absent or '':
--          unsigned)
--
-- Returns {version, outcome}:
--   {current, 0}   the current version's content hash is ARGV[1], it is
--                  signed by the key ARGV[8] names (or both are unsigned) and
--                  current >= floor: nothing is published (also when ARGV[5]
--                  is stale, so publishing the current content never
--                  conflicts); the sources field is set to ARGV[7] if given
--   {N, 1}         stored: ARGV[2] is now v<N> and current is N = ARGV[5]
--   {base, -1}     conflict: ARGV[5] is not base + 1 (another publisher got
--                  there first, the caller guessed, or the floor is above
--                  what it guessed); nothing changed. The caller encodes the
--                  policy as base + 1 and calls again; the reply carries
--                  base, so no extra read.
--
-- Side effects, only when stored: HSET v<N>, hash, current and sources
-- (HDEL sources when ARGV[7] is empty: the old one described another
-- version) and sig<N> when ARGV[8] is given; HDEL every v<n> and sig<n>
-- with n <= N - K (whatever K earlier calls used);
-- PUBLISH N (decimal) on ARGV[4]. When unchanged: HSET sources if ARGV[7]
-- is given and differs.
--
-- Complexity: O(F + B): F fields of the hash (K + 3 when every publisher
-- keeps K) scanned once to drop old versions, B bytes of encoding and
-- sources stored (or compared).
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
local floor = 0
if ARGV[6] and ARGV[6] ~= '' then
  floor = tonumber(ARGV[6])
end
local sources = ARGV[7] or ''
local sig = ARGV[8] or ''

-- signer is the key id of a signature field's value; '' when unsigned.
local function signer(value)
  if not value then
    return ''
  end
  return string.match(value, '^([^:]*):') or ''
end

if hash == '' then
  return redis.error_reply('ERR publish.lua: empty content hash')
end
if not keep or keep < 1 or keep ~= math.floor(keep) then
  return redis.error_reply('ERR publish.lua: versions to keep must be an integer >= 1, got ' .. tostring(ARGV[3]))
end
if not want or want < 1 or want ~= math.floor(want) then
  return redis.error_reply('ERR publish.lua: version must be an integer >= 1, got ' .. tostring(ARGV[5]))
end
if not floor or floor < 0 or floor ~= math.floor(floor) then
  return redis.error_reply('ERR publish.lua: floor must be an integer >= 0, got ' .. tostring(ARGV[6]))
end

local current = 0
local raw = redis.call('HGET', key, 'current')
if raw then
  current = tonumber(raw)
  if not current or current < 1 or current ~= math.floor(current) then
    return redis.error_reply('ERR publish.lua: ' .. key .. ' holds a corrupt current version ' .. tostring(raw))
  end
end

-- Content signed by another key (or signed where it was not, or the
-- reverse) is published again, so that a manager that starts signing, or
-- rotates its key, gets a version its enforcers verify.
if current > 0 and current >= floor and redis.call('HGET', key, 'hash') == hash
    and signer(redis.call('HGET', key, 'sig' .. string.format('%d', current))) == signer(sig) then
  if sources ~= '' and redis.call('HGET', key, 'sources') ~= sources then
    redis.call('HSET', key, 'sources', sources)
  end
  return {current, 0}
end
local base = current
if floor > base then
  base = floor
end
if want ~= base + 1 then
  return {base, -1}
end

local n = string.format('%d', want)
redis.call('HSET', key, 'v' .. n, blob, 'hash', hash, 'current', n)
if sig ~= '' then
  redis.call('HSET', key, 'sig' .. n, sig)
end
if sources ~= '' then
  redis.call('HSET', key, 'sources', sources)
else
  redis.call('HDEL', key, 'sources')
end

local oldest = want - keep
for _, field in ipairs(redis.call('HKEYS', key)) do
  local v = tonumber(string.match(field, '^v(%d+)$') or string.match(field, '^sig(%d+)$'))
  if v and v <= oldest then
    redis.call('HDEL', key, field)
  end
end

redis.call('PUBLISH', channel, n)
return {want, 1}
