"""The Lua scripts: one per operation, each atomic on the server (Redis runs a script alone).

Every script gets no KEYS (a standalone Redis, not Cluster: the keys it
touches depend on what it reads) and ``ARGV[1]`` = the backend's prefix; the
shared helpers (``PRELUDE``) build the key names of ``consensus_redis.layout``.
Time is the server's: ``TIME`` (Redis 7 replicates a script's effects, not the
script, so reading the clock in a writing script is allowed) and key expiry,
which Redis judges by its own clock, frozen for the length of a script.

Every change appends one entry to the change stream, with an explicit id
``<seq>-0`` from a counter, so a reader sees a gap (trimming) as a jump.
Replies are arrays whose first element names the outcome: ``ok``, ``exists``,
``missing``, ``conflict``, ``fenced``, ``sealed``, ``lost`` or ``other``.

A migration's seal (``consensus_redis.seal``) is the key ``sealed``: each
storage script refuses first thing while it exists, so a write racing the
``SET`` that seals runs wholly before it (applied) or after it (refused).
"""

from __future__ import annotations

#: Entries the change stream keeps (approximately); a reader further behind resynchronizes.
STREAM_LENGTH = 100_000

PRELUDE = r"""
local P = ARGV[1]
local function k(...) return P .. "\0" .. table.concat({...}, "\0") end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function emit(kind, name)
  local seq = redis.call('INCR', k('seq'))
  redis.call('XADD', k('changes'), 'MAXLEN', '~', '@STREAM_LENGTH@', seq .. '-0', 't', kind, 'n', name)
end
local function parent(key)
  local cut = key:match('^.*()/')
  if cut then return key:sub(1, cut - 1) end
  return ''
end
local function alive(sid) return redis.call('EXISTS', k('s', sid)) == 1 end
local function elect(service)
  local head = redis.call('ZRANGE', k('c', service), 0, 0)[1] or false
  if head == redis.call('HGET', k('l', service), 'id') then return end
  if head then
    local term = redis.call('INCR', k('t', service))
    redis.call('HSET', k('l', service), 'id', head, 'term', term)
    local ceiling = redis.call('GET', k('ceiling'))
    if ceiling and term > tonumber(ceiling) then redis.call('SET', k('ceiling'), term) end
  else
    redis.call('DEL', k('l', service))
  end
  emit('e', service)
end
local function drop(sid)
  local owned = k('o', sid)
  local groups, services = {}, {}
  for _, entry in ipairs(redis.call('SMEMBERS', owned)) do
    local kind = entry:sub(1, 1)
    local name, id = entry:sub(2):match('^(.*)%z([^%z]*)$')
    if kind == 'g' and redis.call('HGET', k('go', name), id) == sid then
      redis.call('HDEL', k('g', name), id)
      redis.call('HDEL', k('go', name), id)
      groups[name] = true
    elseif kind == 'e' and redis.call('HGET', k('co', name), id) == sid then
      redis.call('ZREM', k('c', name), id)
      redis.call('HDEL', k('co', name), id)
      services[name] = true
    end
  end
  for name in pairs(groups) do emit('g', name) end
  for name in pairs(services) do elect(name) end
  redis.call('DEL', owned, k('s', sid))
  redis.call('ZREM', k('leases'), sid)
end
local function reap_owners(owners)
  local sids = redis.call('HVALS', owners)
  for _, sid in ipairs(sids) do
    if not alive(sid) then drop(sid) end
  end
end
-- A leave or resign of ``id`` (owners: its hash of owners) by ``sid``: nil if ``sid`` holds it,
-- else the reply: 'ok' if nobody holds it, 'other' while another session that holds it lives
-- (a dead one is dropped first: then 'ok').
local function release_reply(owners, id, sid)
  local owner = redis.call('HGET', owners, id)
  if not owner then return {'ok'} end
  if owner == sid then return nil end
  if alive(owner) then return {'other'} end
  drop(owner)
  return {'ok'}
end
local function sealed() return redis.call('EXISTS', k('sealed')) == 1 end
local function fence_ok()
  local service = ARGV[2]
  if service == '' then return true end
  reap_owners(k('co', service))
  local lead = redis.call('HMGET', k('l', service), 'id', 'term')
  return lead[1] == ARGV[3] and lead[2] == ARGV[4]
end
""".replace("@STREAM_LENGTH@", str(STREAM_LENGTH))

#: Storage: ARGV = prefix, fence service ('' for none), fence leader, fence term, key, ...
PUT = r"""
if sealed() then return {'sealed'} end
if not fence_ok() then return {'fenced'} end
local key, value = ARGV[5], ARGV[6]
local target = k('kv', key)
if redis.call('EXISTS', target) == 1 then return {'exists'} end
local version = redis.call('INCR', k('rev'))
redis.call('HSET', target, 'v', value, 'n', version)
redis.call('SADD', k('ns', parent(key)), key)
redis.call('ZADD', k('all'), 0, key)
emit('v', key)
emit('k', parent(key))
return {'ok', version}
"""

#: ARGV[6] = value, ARGV[7] = expected version ('' for any).
UPDATE = r"""
if sealed() then return {'sealed'} end
if not fence_ok() then return {'fenced'} end
local key, value, expected = ARGV[5], ARGV[6], ARGV[7]
local target = k('kv', key)
local current = redis.call('HGET', target, 'n')
if not current then return {'missing'} end
if expected ~= '' and current ~= expected then return {'conflict', current} end
local version = redis.call('INCR', k('rev'))
redis.call('HSET', target, 'v', value, 'n', version)
emit('v', key)
return {'ok', version}
"""

#: ARGV[6] = expected version ('' for any).
DELETE = r"""
if sealed() then return {'sealed'} end
if not fence_ok() then return {'fenced'} end
local key, expected = ARGV[5], ARGV[6]
local target = k('kv', key)
local current = redis.call('HGET', target, 'n')
if not current then return {'missing'} end
if expected ~= '' and current ~= expected then return {'conflict', current} end
redis.call('DEL', target)
redis.call('SREM', k('ns', parent(key)), key)
redis.call('ZREM', k('all'), key)
emit('v', key)
emit('k', parent(key))
return {'ok'}
"""

#: One page of a walk: ARGV = prefix, namespace prefix ('' or 'ns/'), after ('' to start), limit.
WALK_PAGE = r"""
local prefix, after, limit = ARGV[2], ARGV[3], tonumber(ARGV[4])
local low = '[' .. prefix
if after ~= '' then low = '(' .. after end
local high = '+'
if prefix ~= '' then high = '[' .. prefix .. '\255' end
local keys = redis.call('ZRANGEBYLEX', k('all'), low, high, 'LIMIT', 0, limit)
local out = {}
for _, key in ipairs(keys) do
  local row = redis.call('HMGET', k('kv', key), 'v', 'n')
  if row[2] then
    table.insert(out, key)
    table.insert(out, row[1])
    table.insert(out, row[2])
  end
end
return {'ok', #keys, out}
"""

#: Sessions: ARGV = prefix, session id, ttl in ms, old session id ('' for none) to drop first.
OPEN = r"""
local sid, ttl, old = ARGV[2], tonumber(ARGV[3]), ARGV[4]
if old ~= '' then drop(old) end
redis.call('SET', k('s', sid), ttl, 'PX', ttl)
redis.call('ZADD', k('leases'), now_ms() + ttl, sid)
return {'ok'}
"""

#: Renew this session and reap expired ones: ARGV = prefix, session id, ttl in ms.
#: Replies ``ok`` and the ms until the earliest other lease expires, or ``lost`` (after dropping it).
RENEW = r"""
local sid, ttl = ARGV[2], tonumber(ARGV[3])
if not alive(sid) then
  drop(sid)
  return {'lost'}
end
local now = now_ms()
redis.call('PEXPIRE', k('s', sid), ttl)
redis.call('ZADD', k('leases'), now + ttl, sid)
for _, other in ipairs(redis.call('ZRANGEBYSCORE', k('leases'), '-inf', now, 'LIMIT', 0, 100)) do
  if alive(other) then
    redis.call('ZADD', k('leases'), now + redis.call('PTTL', k('s', other)), other)
  else
    drop(other)
  end
end
local first = redis.call('ZRANGE', k('leases'), 0, 0, 'WITHSCORES')
return {'ok', tonumber(first[2]) - now}
"""

#: ARGV = prefix, session id.
CLOSE = r"""
drop(ARGV[2])
return {'ok'}
"""

#: Membership: ARGV = prefix, session id, group, member id, data.
JOIN = r"""
local sid, group, member, data = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if not alive(sid) then return {'lost'} end
reap_owners(k('go', group))
if redis.call('HEXISTS', k('go', group), member) == 1 then return {'exists'} end
redis.call('HSET', k('g', group), member, data)
redis.call('HSET', k('go', group), member, sid)
redis.call('SADD', k('o', sid), 'g' .. group .. '\0' .. member)
emit('g', group)
return {'ok'}
"""

#: ARGV = prefix, session id, group, member id. ``other``: another session holds it.
LEAVE = r"""
local sid, group, member = ARGV[2], ARGV[3], ARGV[4]
local reply = release_reply(k('go', group), member, sid)
if reply then return reply end
redis.call('HDEL', k('g', group), member)
redis.call('HDEL', k('go', group), member)
redis.call('SREM', k('o', sid), 'g' .. group .. '\0' .. member)
emit('g', group)
return {'ok'}
"""

#: ARGV = prefix, group. Replies ``ok`` and the member hash (id, data, ...).
MEMBERSHIP = r"""
reap_owners(k('go', ARGV[2]))
return {'ok', redis.call('HGETALL', k('g', ARGV[2]))}
"""

#: Election: ARGV = prefix, session id, service, candidate id. Replies ``ok`` and 1 if it leads now.
NOMINATE = r"""
local sid, service, candidate = ARGV[2], ARGV[3], ARGV[4]
if not alive(sid) then return {'lost'} end
reap_owners(k('co', service))
if redis.call('HEXISTS', k('co', service), candidate) == 1 then return {'exists'} end
redis.call('ZADD', k('c', service), redis.call('INCR', k('rev')), candidate)
redis.call('HSET', k('co', service), candidate, sid)
redis.call('SADD', k('o', sid), 'e' .. service .. '\0' .. candidate)
elect(service)
if redis.call('HGET', k('l', service), 'id') == candidate then return {'ok', 1} end
return {'ok', 0}
"""

#: ARGV = prefix, session id, service, candidate id.
RESIGN = r"""
local sid, service, candidate = ARGV[2], ARGV[3], ARGV[4]
local reply = release_reply(k('co', service), candidate, sid)
if reply then return reply end
redis.call('ZREM', k('c', service), candidate)
redis.call('HDEL', k('co', service), candidate)
redis.call('SREM', k('o', sid), 'e' .. service .. '\0' .. candidate)
elect(service)
return {'ok'}
"""

#: ARGV = prefix, service. Replies ``ok`` and the leader and term, or ``missing``.
LEADERSHIP = r"""
reap_owners(k('co', ARGV[2]))
local lead = redis.call('HMGET', k('l', ARGV[2]), 'id', 'term')
if not lead[1] then return {'missing'} end
return {'ok', lead[1], lead[2]}
"""

#: The term ceiling: ARGV = prefix. Replies ``ok`` and the highest term any service has had.
#: ``ceiling`` is kept by ``elect`` once it exists; the first call makes it from every term
#: counter under the prefix (one ``SCAN`` of the key space, in this script: terms a release before
#: the ceiling gave count too).
TERM_CEILING = r"""
local ceiling = redis.call('GET', k('ceiling'))
if ceiling then return {'ok', ceiling} end
local high, cursor = 0, '0'
local counters = (P:gsub('[%*%?%[%]\\]', '\\%0')) .. '\0t\0*'
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', counters, 'COUNT', 1000)
  cursor = page[1]
  for _, name in ipairs(page[2]) do
    local term = tonumber(redis.call('GET', name))
    if term > high then high = term end
  end
until cursor == '0'
redis.call('SET', k('ceiling'), high)
return {'ok', high}
"""

#: ARGV = prefix. Replies ``ok`` and the ids of the sessions whose key has not expired.
LIVE_SESSIONS = r"""
local live = {}
for _, sid in ipairs(redis.call('ZRANGE', k('leases'), 0, -1)) do
  if alive(sid) then table.insert(live, sid) end
end
return {'ok', live}
"""
