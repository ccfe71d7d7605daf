"""Redis adapter: the ``Queue`` port on lists, markers, lease hashes and a sorted set (spec §5)."""

from dtq.adapters.redis.connection import check_eviction_policy, connect_redis
from dtq.adapters.redis.queue import RedisQueue

__all__ = ["RedisQueue", "check_eviction_policy", "connect_redis"]
