"""Redis adapter: the ``Queue`` port on lists, markers, lease hashes and a sorted set (spec §5)."""

from dtq.adapters.redis.connection import RedisClient, check_eviction_policy, connect_redis
from dtq.adapters.redis.keys import KeyLayout, tagged_prefix
from dtq.adapters.redis.queue import RedisQueue

__all__ = [
    "KeyLayout",
    "RedisClient",
    "RedisQueue",
    "check_eviction_policy",
    "connect_redis",
    "tagged_prefix",
]
