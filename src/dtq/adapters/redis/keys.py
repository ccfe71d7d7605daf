"""The Redis key layout: every key of one deployment under one hash tag (issue 17 item 6).

A key's Redis Cluster hash slot is computed from its hash tag, the text between the first ``{``
and the first ``}`` after it, when that text is not empty. Every key below starts with the same
tagged prefix, so every key of a deployment maps to one slot: a Lua script may touch any of them
(its KEYS, and the marker and ready-list keys ``PROMOTE_DUE`` builds from the prefix), and
multi-key commands (BRPOP over tiers, DEL of markers) are never cross-slot.

=====================================  ======  ==================================================
``{tag}queue:ready:{priority}``        LIST    LPUSH on enqueue, BRPOP over tiers in order
``{tag}queue:pending:{task_id}``       STRING  pending marker, ``SET NX PX marker_ttl``, value "1"
``{tag}lease:task:{task_id}``          HASH    ``worker_id``, ``run_id``, ``deadline_ms``; PEXPIRE
``{tag}queue:scheduled``               ZSET    score = due time in Unix epoch milliseconds
``{tag}epoch``                         STRING  ``"{token}|{created_ms}"``, no TTL (reconciler)
=====================================  ======  ==================================================

``{tag}`` is ``tagged_prefix(REDIS_KEY_PREFIX)``: the default ``dto:`` becomes ``{dto}:``, so the
ready list of the default tier is ``{dto}:queue:ready:default``. A prefix that already holds a
hash tag (``{dto}:``, ``app:{dto}:``) is used as given.

``{tag}queue:routed:{priority}:{kind}`` (LIST, LPUSH by ``ROUTE``, popped with the tiers by the
workers that serve ``kind``) holds the ids a worker that does not serve their kind took off the
tier (kind-aware routing, issue 15 item 2). The routed lists have their own ``queue:routed:``
namespace, so no priority name can make one collide with a ready list. Priority names of the API
(``[a-z0-9_-]``) hold no ``:``, so ``(priority, kind)`` maps to one routed list.

Each list (ready or routed) has two bookkeeping keys that the push scripts keep in step with it
(issue 17 item 5, a million-task backlog): ``{tag}queue:pushes:{list}`` (STRING, no TTL) counts
the pushes the list ever had, and ``{tag}queue:listed:{list}`` (ZSET) scores each id by the number
of its latest push. A list is FIFO (LPUSH at the head, RPOP/BRPOP at the tail), so it holds
exactly the pushes numbered ``pushes - LLEN + 1 .. pushes``: an id is still listed iff its score is
above ``pushes - LLEN``, an O(log n) answer at any depth (``{list}`` is ``ready:{priority}`` or
``routed:{priority}:{kind}``: their own ``queue:pushes:``/``queue:listed:`` namespaces).
"""

from __future__ import annotations

from uuid import UUID


def has_hash_tag(text: str) -> bool:
    """True when ``text`` holds a Redis Cluster hash tag: a ``{`` followed, after at least one
    character, by a ``}`` (the first ``}`` after the first ``{`` is what counts)."""
    start = text.find("{")
    if start < 0:
        return False
    end = text.find("}", start + 1)
    return end > start + 1


def tagged_prefix(prefix: str) -> str:
    """The prefix every key starts with: ``prefix`` wrapped in a hash tag.

    A trailing ``:`` stays outside the tag (``dto:`` becomes ``{dto}:``, ``dto`` becomes
    ``{dto}``); a prefix that already holds a hash tag (``has_hash_tag``) is returned unchanged.

    Raises:
        ValueError: ``prefix`` is empty, or wrapping it gives no hash tag (it starts with ``}``).
    """
    if has_hash_tag(prefix):
        return prefix
    name, separator = (
        (prefix[:-1], ":") if len(prefix) > 1 and prefix.endswith(":") else (prefix, "")
    )
    tagged = f"{{{name}}}{separator}"
    if not has_hash_tag(tagged):
        raise ValueError(f"Redis key prefix {prefix!r} cannot be made a hash tag")
    return tagged


class KeyLayout:
    """The key names of one deployment (see the module docstring).

    Args:
        prefix: ``REDIS_KEY_PREFIX`` as configured (spec §8); tagged with ``tagged_prefix``.

    Raises:
        ValueError: ``prefix`` cannot be made a hash tag (see ``tagged_prefix``).
    """

    __slots__ = (
        "_lease",
        "_listed",
        "_marker",
        "_pushes",
        "_ready",
        "_routed",
        "epoch",
        "prefix",
        "scheduled",
    )

    def __init__(self, prefix: str) -> None:
        #: the tagged prefix every key starts with (also the ARGV of ``PROMOTE_DUE``)
        self.prefix = tagged_prefix(prefix)
        self._ready = f"{self.prefix}queue:ready:"
        self._routed = f"{self.prefix}queue:routed:"
        self._marker = f"{self.prefix}queue:pending:"
        self._lease = f"{self.prefix}lease:task:"
        self._pushes = f"{self.prefix}queue:pushes:"
        self._listed = f"{self.prefix}queue:listed:"
        #: the scheduled ZSET (delays and retry backoff)
        self.scheduled = f"{self.prefix}queue:scheduled"
        #: the reconciler's epoch STRING (``Queue.epoch``)
        self.epoch = f"{self.prefix}epoch"

    def ready(self, priority: str) -> str:
        """The ready LIST of tier ``priority``."""
        return f"{self._ready}{priority}"

    def routed(self, priority: str, kind: str) -> str:
        """The routed LIST of tier ``priority`` and ``kind``: the ids of that kind a worker
        that does not serve it popped from the tier (kind-aware routing, issue 15 item 2)."""
        return f"{self._routed}{priority}:{kind}"

    def ready_books(self, priority: str) -> tuple[str, str, str]:
        """The ready LIST of ``priority`` with its push counter (STRING) and listed ids
        (ZSET), in the order the push scripts take them (see the module docstring)."""
        return (
            f"{self._ready}{priority}",
            f"{self._pushes}ready:{priority}",
            f"{self._listed}ready:{priority}",
        )

    def routed_books(self, priority: str, kind: str) -> tuple[str, str, str]:
        """The routed LIST of ``(priority, kind)`` with its push counter and listed ids."""
        return (
            f"{self._routed}{priority}:{kind}",
            f"{self._pushes}routed:{priority}:{kind}",
            f"{self._listed}routed:{priority}:{kind}",
        )

    def marker(self, task_id: UUID) -> str:
        """The pending-marker STRING of ``task_id``."""
        return f"{self._marker}{task_id}"

    def lease(self, task_id: UUID) -> str:
        """The lease HASH of ``task_id``."""
        return f"{self._lease}{task_id}"
