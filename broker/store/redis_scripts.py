"""The Redis store's server-side Lua scripts: every read-modify-write of a job, its
events, a keyed record or the leader lease runs as one script, so it is atomic and
fenced by the leader epoch (``redis.py`` registers and calls them).

ARGV[1] of the job/record scripts is the key prefix; the fence arguments follow
(``RedisStore._base_args``: request token, token TTL, fence key and epoch).
"""

# Lua helpers shared by the scripts: index key names and index moves.
LUA_COMMON = r"""
local p = ARGV[1]
local function jkey(id) return p .. ':job:' .. id end
local function ikey(kind, v) return p .. ':' .. kind .. ':' .. v end
local function reqfield(team, crid) return #team .. ':' .. team .. ':' .. crid end
local function push_events(id, first, n)
  local evk = p .. ':ev:' .. id
  local start = redis.call('LLEN', evk) + 1
  for i = 0, n - 1 do redis.call('RPUSH', evk, ARGV[first + i]) end
  return start
end
local function done(tok, res)
  redis.call('SET', p .. ':tok:' .. tok, res, 'EX', tonumber(ARGV[3]))
  return res
end
local function seen(tok)
  return redis.call('GET', p .. ':tok:' .. tok)
end
-- Leader fencing: ARGV[4] = the lease's epoch key ('' = not fenced), ARGV[5] = our epoch.
local function fenced()
  if ARGV[4] == '' then return false end
  return (redis.call('GET', ARGV[4]) or '0') ~= ARGV[5]
end
"""

# ARGV: prefix, token, token_ttl, fence_key, fence_epoch, id, team, crid, phase, region, data,
#       n_events, events..., [n_riders, (kind, key, data) x n_riders, [checkpoint prefix key]]
# Riders are keyed records written only when the job is (a SubmitJob's audit record).
# The checkpoint prefix key (broker/store/checkpoint_index.py; '' = none) goes into the
# sorted set <p>:ckpt as "<key>\0<id>", read by ZRANGEBYLEX.
# Returns: 1 created | -1 id exists | -2 request id exists | -9 fenced
CREATE = LUA_COMMON + r"""
local tok, id, team, crid, phase, region, data = ARGV[2], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local prev = seen(tok)
if prev then return tonumber(prev) end
if fenced() then return -9 end
local jk = jkey(id)
if redis.call('EXISTS', jk) == 1 then return -1 end
if crid ~= '' and redis.call('HSETNX', p .. ':reqid', reqfield(team, crid), id) == 0 then
  return -2
end
redis.call('HSET', jk, 'd', data, 'v', 1, 'team', team, 'crid', crid, 'phase', phase, 'region', region)
redis.call('ZADD', p .. ':jobs', 0, id)
redis.call('ZADD', ikey('team', team), 0, id)
redis.call('ZADD', ikey('phase', phase), 0, id)
if region ~= '' then redis.call('ZADD', ikey('region', region), 0, id) end
push_events(id, 13, tonumber(ARGV[12]))
local rb = 13 + tonumber(ARGV[12])
local nr = tonumber(ARGV[rb] or '0')
for i = 0, nr - 1 do
  local at = rb + 1 + 3 * i
  redis.call('HSET', p .. ':rec:' .. ARGV[at], ARGV[at + 1], ARGV[at + 2])
end
local ck = ARGV[rb + 1 + 3 * nr]
if ck and ck ~= '' then redis.call('ZADD', p .. ':ckpt', 0, ck .. '\0' .. id) end
return done(tok, 1)
"""

# ARGV: prefix, token, token_ttl, fence_key, fence_epoch, id, expected, team, crid, phase,
#       region, data, n, events...
# Returns: {0, first_seq} ok | {-1, 0} not found | {-2, current} conflict | {-3, 0} reqid taken
#          | {-9, 0} fenced
UPDATE = LUA_COMMON + r"""
local tok, id, expected = ARGV[2], ARGV[6], ARGV[7]
local team, crid, phase, region, data = ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local prev = seen(tok)
if prev then return {0, tonumber(prev)} end
if fenced() then return {-9, 0} end
local jk = jkey(id)
local cur = redis.call('HMGET', jk, 'v', 'team', 'crid', 'phase', 'region')
if not cur[1] then return {-1, 0} end
if cur[1] ~= expected then return {-2, tonumber(cur[1])} end
local oteam, ocrid, ophase, oregion = cur[2], cur[3], cur[4], cur[5]
if team ~= oteam or crid ~= ocrid then
  if crid ~= '' then
    local f = reqfield(team, crid)
    local owner = redis.call('HGET', p .. ':reqid', f)
    if owner and owner ~= id then return {-3, 0} end
    redis.call('HSET', p .. ':reqid', f, id)
  end
  if ocrid ~= '' then redis.call('HDEL', p .. ':reqid', reqfield(oteam, ocrid)) end
end
if team ~= oteam then
  redis.call('ZREM', ikey('team', oteam), id); redis.call('ZADD', ikey('team', team), 0, id)
end
if phase ~= ophase then
  redis.call('ZREM', ikey('phase', ophase), id); redis.call('ZADD', ikey('phase', phase), 0, id)
end
if region ~= oregion then
  if oregion ~= '' then redis.call('ZREM', ikey('region', oregion), id) end
  if region ~= '' then redis.call('ZADD', ikey('region', region), 0, id) end
end
redis.call('HSET', jk, 'd', data, 'v', tonumber(expected) + 1, 'team', team, 'crid', crid,
           'phase', phase, 'region', region)
local start = push_events(id, 14, tonumber(ARGV[13]))
done(tok, start)
return {0, start}
"""

# ARGV: prefix, token, token_ttl, fence_key, fence_epoch, id, n, events...
# Returns first seq, or -1 not found, -9 fenced.
APPEND = LUA_COMMON + r"""
local tok, id = ARGV[2], ARGV[6]
local prev = seen(tok)
if prev then return tonumber(prev) end
if fenced() then return -9 end
if redis.call('EXISTS', jkey(id)) == 0 then return -1 end
return done(tok, push_events(id, 8, tonumber(ARGV[7])))
"""

# ARGV: prefix, token, token_ttl, fence_key, fence_epoch, kind, key, data ('' + del=1: delete)
# Returns 1/0 (written or deleted / not), -9 fenced.
RECORD = LUA_COMMON + r"""
if fenced() then return -9 end
local hk = p .. ':rec:' .. ARGV[6]
if ARGV[9] == '1' then return redis.call('HDEL', hk, ARGV[7]) end
redis.call('HSET', hk, ARGV[7], ARGV[8])
return 1
"""

# KEYS: lease key, epoch key; ARGV: holder, ttl_ms. Returns the epoch, or 0 if another
# holder has the lease. A grant (not a renewal) increments the epoch (leader fencing).
LEASE = r"""
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local e = redis.call('GET', KEYS[2])
  if e then return tonumber(e) end
  return redis.call('INCR', KEYS[2])
end
if cur then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('INCR', KEYS[2])
"""
