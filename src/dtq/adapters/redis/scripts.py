"""Lua scripts of ``RedisQueue`` (spec §5): each is one atomic server-side step and one round trip.

Key layout in ``dtq.adapters.redis.keys``, member encoding in ``dtq.adapters.redis.queue``. Every
script declares all the keys it touches in KEYS, except ``PROMOTE_DUE``, which can only know the
marker and ready-list keys after reading the sorted set: it builds them from the tagged prefix,
so they share the hash slot of its KEYS[1] (safe on Redis Cluster, see ``keys``).
"""

from __future__ import annotations

# KEYS[2i-1] marker of the i-th id, KEYS[2i] its ready list; ARGV[1] marker ttl ms, ARGV[i+1] the
# i-th task id. For each id in turn: SET NX the marker and, only if it was set, LPUSH the id (a
# repeated id finds its own marker and is skipped). Returns how many ids were pushed.
ENQUEUE_MANY = """
local pushed = 0
for i = 1, #ARGV - 1 do
  if redis.call('SET', KEYS[2 * i - 1], '1', 'NX', 'PX', ARGV[1]) then
    redis.call('LPUSH', KEYS[2 * i], ARGV[i + 1])
    pushed = pushed + 1
  end
end
return pushed
"""

#: enqueue_unlisted: KEYS = (marker, ready list, routed list) triples; ARGV = marker TTL ms, scan
#: limit, ids. After SET NX of the marker, the id is pushed onto its ready list only if it is not
#: among the oldest ``scan limit`` entries of its ready list nor of the routed list of its
#: (priority, kind) (the tail, where the oldest ids wait; kind-aware routing, issue 15 item 2: an
#: id routed to a kind no worker serves waits there). A list is read from the tail in
#: chunks of 1,000 (LRANGE), each chunk once per call into a Lua set, and only as deep as the
#: ids looked up require: a page of n ids found within depth d costs O(n + d) instead of one
#: LPOS scan per id, and an id absent from the list costs one scan to ``scan limit``.
ENQUEUE_UNLISTED = """
local pushed = 0
local limit = tonumber(ARGV[2])
local chunk = 1000
local lists = {}
local function listed(ready, id)
  local seen = lists[ready]
  if seen == nil then
    seen = {ids = {}, depth = 0, ended = false}
    lists[ready] = seen
  end
  while not seen.ids[id] and not seen.ended and seen.depth < limit do
    local take = math.min(chunk, limit - seen.depth)
    local entries = redis.call('LRANGE', ready, -(seen.depth + take), -(seen.depth + 1))
    for _, entry in ipairs(entries) do seen.ids[entry] = true end
    seen.depth = seen.depth + take
    if #entries < take then seen.ended = true end
  end
  return seen.ids[id] == true
end
for i = 1, #ARGV - 2 do
  local id = ARGV[i + 2]
  local ready = KEYS[3 * i - 1]
  if redis.call('SET', KEYS[3 * i - 2], '1', 'NX', 'PX', ARGV[1]) then
    if not listed(ready, id) and not listed(KEYS[3 * i], id) then
      redis.call('LPUSH', ready, id)
      pushed = pushed + 1
    end
  end
end
return pushed
"""

# KEYS[2i-1] marker of the i-th id, KEYS[2i] the routed list of its (priority, kind); ARGV[1]
# marker ttl ms, ARGV[i+1] the i-th task id. For each id: SET the marker (re-armed for a full TTL,
# the delivery is pending again) and LPUSH the id onto the routed list (kind-aware routing,
# issue 15 item 2). Returns how many ids were routed.
ROUTE = """
for i = 1, #ARGV - 1 do
  redis.call('SET', KEYS[2 * i - 1], '1', 'PX', ARGV[1])
  redis.call('LPUSH', KEYS[2 * i], ARGV[i + 1])
end
return #ARGV - 1
"""

# KEYS = ready lists, highest tier first; ARGV[1] most ids to take (>= 1). Never blocks.
# Takes the oldest ids of the first tier, then of the next, until ARGV[1] ids are taken.
# Returns the ids in pop order (RPOP with a count needs Redis >= 6.2).
POP_MANY = """
local want = tonumber(ARGV[1])
local taken = {}
for _, key in ipairs(KEYS) do
  if #taken >= want then break end
  local ids = redis.call('RPOP', key, want - #taken)
  if ids then
    for _, id in ipairs(ids) do taken[#taken + 1] = id end
  end
end
return taken
"""

# KEYS[i] lease hash of the i-th lease; ARGV[1] ttl ms, then per lease three values: worker id,
# run id, deadline_ms (ARGV[3i-1], ARGV[3i], ARGV[3i+1]). Each hash is replaced whole (DEL, HSET)
# and given its TTL in the same atomic step, so no hash ever exists without a TTL. Returns the
# number of leases written.
SET_LEASES = """
local ttl = ARGV[1]
for i, key in ipairs(KEYS) do
  local at = 3 * i - 1
  redis.call('DEL', key)
  redis.call('HSET', key, 'worker_id', ARGV[at], 'run_id', ARGV[at + 1],
    'deadline_ms', ARGV[at + 2])
  redis.call('PEXPIRE', key, ttl)
end
return #KEYS
"""

# KEYS[1] lease hash; ARGV[1] run id, ARGV[2] ttl ms, ARGV[3] new deadline_ms.
EXTEND_LEASE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[1] then return 'lost' end
redis.call('HSET', KEYS[1], 'deadline_ms', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 'extended'
"""

# KEYS[1] lease hash; ARGV[1] run id, ARGV[2] worker id, ARGV[3] deadline_ms, ARGV[4] ttl ms.
# Create the hash (with its TTL) only if no hash exists; if one exists and names ARGV[1], extend
# it like EXTEND_LEASE; otherwise leave it alone. Check and write are one step, so a lease another
# run wrote in the meantime is never overwritten. Returns 'extended' or 'lost'.
RECREATE_LEASE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'worker_id', ARGV[2], 'run_id', ARGV[1], 'deadline_ms', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 'extended'
end
if redis.call('HGET', KEYS[1], 'run_id') ~= ARGV[1] then return 'lost' end
redis.call('HSET', KEYS[1], 'deadline_ms', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 'extended'
"""

# KEYS[i] lease hash, ARGV[i] the run id it must name to be deleted. Returns how many were deleted.
DELETE_LEASES = """
local deleted = 0
for i, key in ipairs(KEYS) do
  if redis.call('HGET', key, 'run_id') == ARGV[i] then
    deleted = deleted + redis.call('DEL', key)
  end
end
return deleted
"""

# KEYS[1] scheduled zset; ARGV[1] the tagged key prefix (``KeyLayout.prefix``: its hash tag puts
# the marker and ready-list keys built from it in KEYS[1]'s slot), ARGV[2] limit, ARGV[3] marker
# ttl ms.
PROMOTE_DUE = """
local t = redis.call('TIME')
local now_ms = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, ARGV[2])
local pushed = 0
for _, member in ipairs(members) do
  redis.call('ZREM', KEYS[1], member)
  local sep = string.find(member, '|[^|]*$')
  if sep then
    local priority = string.sub(member, 1, sep - 1)
    local task_id = string.sub(member, sep + 1)
    local marker = ARGV[1] .. 'queue:pending:' .. task_id
    if redis.call('SET', marker, '1', 'NX', 'PX', ARGV[3]) then
      redis.call('LPUSH', ARGV[1] .. 'queue:ready:' .. priority, task_id)
      pushed = pushed + 1
    end
  end
end
return pushed
"""


# --- reconciler safety (issue 12 bugs 3 and 7) ---------------------------------------------------

# KEYS[1] any key of the layout (not read: it routes the call to the server that holds the keys,
# the master of their slot on a Redis Cluster). Returns TIME: {seconds, microseconds}.
SERVER_TIME = """
return redis.call('TIME')
"""

# KEYS[1] epoch key; ARGV[1] token. The value is "{token}|{created_ms}" by the server's TIME; SET
# without expiry when absent. Returns {value, age_ms, created (1/0)}.
EPOCH = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local value = redis.call('GET', KEYS[1])
local created = 0
if not value then
  value = ARGV[1] .. '|' .. string.format('%d', now_ms)
  redis.call('SET', KEYS[1], value)
  created = 1
end
local sep = string.find(value, '|[^|]*$')
local began = sep and tonumber(string.sub(value, sep + 1)) or now_ms
return {value, string.format('%d', math.max(now_ms - began, 0)), created}
"""
