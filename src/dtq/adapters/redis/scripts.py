"""Lua scripts of ``RedisQueue`` (spec §5): each is one atomic server-side step and one round trip.

Key layout in ``dtq.adapters.redis.keys``, member encoding in ``dtq.adapters.redis.queue``. Every
script declares all the keys it touches in KEYS, except ``PROMOTE_DUE``, which can only know the
marker, ready-list and books keys after reading the sorted set: it builds them from the tagged
prefix, so they share the hash slot of its KEYS[1] (safe on Redis Cluster, see ``keys``). No
script reads a list's entries: each does O(log n) work per id, whatever the lists' length.
"""

from __future__ import annotations

# --- the books of a list (issue 17 item 5) --------------------------------------------------
#
# Every push onto a ready or routed list goes through ``push`` below, which numbers it
# (``{tag}queue:pushes:{list}``) and scores the id with that number in the list's listed ZSET
# (``{tag}queue:listed:{list}``); ``flush``, at the end of each script, writes a call's pushes
# per list with one LPUSH, one ZADD and one SET per 1,000 ids (in push order, as many LPUSHes
# would: blocked poppers are served after the script either way). A list only grows at its head
# and shrinks at its tail, so it holds exactly the pushes numbered above ``popped = pushes -
# LLEN``: ``listed`` answers "is this id still waiting on that list" with one ZSCORE, however
# deep the list (the scripts used to read the list itself, up to 100,000 entries, ~50 ms on a
# 1,000,000-entry list). ``popped`` is read once per list and call (nothing pops inside a
# script). Each call's flush of a list prunes the scores of popped ids, the lowest ranks of the
# ZSET, at most ``prune_most`` of them (1,000 + twice the call's ids: a call's work stays
# proportional to its ids, and pruning outpaces the pops between pushes), so a listed ZSET
# never outgrows the largest backlog its list had. An id with no score (pushed by an older
# version) reads as not listed: pushed once more.
_BOOKS = """
local prune_most = 1000
local books = {}
local function book(list, pushes)
  local b = books[list]
  if b == nil then
    local n = tonumber(redis.call('GET', pushes) or '0')
    b = {pushes_key = pushes, pushes = n, popped = n - redis.call('LLEN', list)}
    books[list] = b
  end
  return b
end
local function push(list, pushes, listed_ids, id, entry)
  local b = book(list, pushes)
  if b.ids == nil then
    b.ids, b.scored, b.listed = {}, {}, listed_ids
  end
  b.pushes = b.pushes + 1
  b.ids[#b.ids + 1] = entry or id
  b.scored[#b.scored + 1] = b.pushes
  b.scored[#b.scored + 1] = id
end
local function listed(list, pushes, listed_ids, id)
  local seq = redis.call('ZSCORE', listed_ids, id)
  if not seq then return false end
  local b = book(list, pushes)
  seq = tonumber(seq)
  return seq > b.popped and seq <= b.pushes
end
local function flush()
  for list, b in pairs(books) do
    if b.ids ~= nil then
      if b.popped > 0 then
        local stale = redis.call('ZCOUNT', b.listed, '-inf', b.popped)
        if stale > 0 then
          redis.call('ZREMRANGEBYRANK', b.listed, 0, math.min(stale, prune_most) - 1)
        end
      end
      for i = 1, #b.ids, 1000 do
        redis.call('LPUSH', list, unpack(b.ids, i, math.min(i + 999, #b.ids)))
      end
      for i = 1, #b.scored, 2000 do
        redis.call('ZADD', b.listed, unpack(b.scored, i, math.min(i + 1999, #b.scored)))
      end
      redis.call('SET', b.pushes_key, b.pushes)
    end
  end
end
"""

# The push scripts' KEYS and ARGV (``queue._Books``): KEYS[1..n] the markers of the n ids,
# then the books of each list the call pushes to or looks at, once per list: (list, pushes,
# listed) triples, the j-th at KEYS[n + 3j - 2 .. n + 3j]. ARGV[1] marker ttl ms, ARGV[2] n,
# ARGV[3 .. n + 2] the ids, then for each id the number j of its list(s).

# For each id in turn: SET NX its marker and, only if it was set, push the id onto its ready
# list (a repeated id finds its own marker and is skipped). Returns how many ids were pushed.
# ENQUEUE_MANY's ARGV may go on with (i, entry) pairs after the list numbers: the i-th id's
# carried entry (``queue.carried_entry``: the id, "|", its snapshot), pushed instead of the bare
# id when the list was empty (nothing on it at the call's start, nothing pushed to it before in
# the call), else dropped: only an idle list's pushes carry, so a backlog holds bare ids.
ENQUEUE_MANY = (
    _BOOKS
    + """
local n = tonumber(ARGV[2])
prune_most = 1000 + 2 * n
local carried = {}
for j = 2 * n + 3, #ARGV, 2 do
  carried[tonumber(ARGV[j])] = ARGV[j + 1]
end
local pushed = 0
for i = 1, n do
  if redis.call('SET', KEYS[i], '1', 'NX', 'PX', ARGV[1]) then
    local at = n + 3 * tonumber(ARGV[n + 2 + i]) - 2
    local entry = carried[i]
    if entry ~= nil then
      local b = book(KEYS[at], KEYS[at + 1])
      if b.ids ~= nil or b.pushes ~= b.popped then entry = nil end
    end
    push(KEYS[at], KEYS[at + 1], KEYS[at + 2], ARGV[i + 2], entry)
    pushed = pushed + 1
  end
end
flush()
return pushed
"""
)

#: enqueue_unlisted: each id has two list numbers, ARGV[n + 1 + 2i] its ready list's and
#: ARGV[n + 2 + 2i] the routed list's of its (priority, kind). After SET NX of the marker, the id
#: is pushed onto its ready list only if it waits on neither list (``listed``: O(log n) per id,
#: whatever the lists' length). Returns how many ids were pushed.
ENQUEUE_UNLISTED = (
    _BOOKS
    + """
local n = tonumber(ARGV[2])
prune_most = 1000 + 2 * n
local pushed = 0
for i = 1, n do
  if redis.call('SET', KEYS[i], '1', 'NX', 'PX', ARGV[1]) then
    local id = ARGV[i + 2]
    local r = n + 3 * tonumber(ARGV[n + 1 + 2 * i]) - 2
    local k = n + 3 * tonumber(ARGV[n + 2 + 2 * i]) - 2
    if not listed(KEYS[r], KEYS[r + 1], KEYS[r + 2], id)
        and not listed(KEYS[k], KEYS[k + 1], KEYS[k + 2], id) then
      push(KEYS[r], KEYS[r + 1], KEYS[r + 2], id)
      pushed = pushed + 1
    end
  end
end
flush()
return pushed
"""
)

# For each id: SET its marker (re-armed for a full TTL, the delivery is pending again) and push
# the id onto its list, the routed list of its (priority, kind) (kind-aware routing, issue 15
# item 2). Returns how many ids were routed.
ROUTE = (
    _BOOKS
    + """
local n = tonumber(ARGV[2])
prune_most = 1000 + 2 * n
for i = 1, n do
  redis.call('SET', KEYS[i], '1', 'PX', ARGV[1])
  local at = n + 3 * tonumber(ARGV[n + 2 + i]) - 2
  push(KEYS[at], KEYS[at + 1], KEYS[at + 2], ARGV[i + 2])
end
flush()
return n
"""
)

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

# KEYS[1..n] the lease hashes to write, n = ARGV[2]; KEYS[n+1..] pending markers to delete (a
# claim's, in the same round trip); ARGV[1] ttl ms, then per lease three values: worker id, run
# id, deadline_ms (ARGV[3i], ARGV[3i+1], ARGV[3i+2]). Each hash is replaced whole (DEL, HSET) and
# given its TTL in the same atomic step, so no hash ever exists without a TTL. Returns the number
# of leases written.
SET_LEASES = """
local ttl = ARGV[1]
local n = tonumber(ARGV[2])
for i = 1, n do
  local key = KEYS[i]
  local at = 3 * i
  redis.call('DEL', key)
  redis.call('HSET', key, 'worker_id', ARGV[at], 'run_id', ARGV[at + 1],
    'deadline_ms', ARGV[at + 2])
  redis.call('PEXPIRE', key, ttl)
end
for i = n + 1, #KEYS do
  redis.call('DEL', KEYS[i])
end
return n
"""

# KEYS[i] lease hash; ARGV[1] ttl ms, ARGV[2i] the run id it must name, ARGV[2i+1] its new
# deadline_ms. Extends each hash naming its run; returns one state per key, in order:
# 'extended', 'missing' (no hash) or 'lost' (another run's hash, unchanged).
EXTEND_LEASES = """
local states = {}
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 0 then
    states[i] = 'missing'
  elseif redis.call('HGET', key, 'run_id') ~= ARGV[2 * i] then
    states[i] = 'lost'
  else
    redis.call('HSET', key, 'deadline_ms', ARGV[2 * i + 1])
    redis.call('PEXPIRE', key, ARGV[1])
    states[i] = 'extended'
  end
end
return states
"""

# KEYS[1] lease hash; ARGV[1] run id, ARGV[2] worker id, ARGV[3] deadline_ms, ARGV[4] ttl ms.
# Create the hash (with its TTL) only if no hash exists; if one exists and names ARGV[1], extend
# it like EXTEND_LEASES; otherwise leave it alone. Check and write are one step, so a lease another
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
# the marker, ready-list and books keys built from it in KEYS[1]'s slot), ARGV[2] limit, ARGV[3]
# marker ttl ms.
PROMOTE_DUE = (
    _BOOKS
    + """
local t = redis.call('TIME')
local now_ms = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, ARGV[2])
prune_most = 1000 + 2 * #members
local pushed = 0
for _, member in ipairs(members) do
  redis.call('ZREM', KEYS[1], member)
  local sep = string.find(member, '|[^|]*$')
  if sep then
    local priority = string.sub(member, 1, sep - 1)
    local task_id = string.sub(member, sep + 1)
    local marker = ARGV[1] .. 'queue:pending:' .. task_id
    if redis.call('SET', marker, '1', 'NX', 'PX', ARGV[3]) then
      push(ARGV[1] .. 'queue:ready:' .. priority, ARGV[1] .. 'queue:pushes:ready:' .. priority,
        ARGV[1] .. 'queue:listed:ready:' .. priority, task_id)
      pushed = pushed + 1
    end
  end
end
flush()
return pushed
"""
)


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
