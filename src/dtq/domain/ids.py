"""Task ids that keep one job's tasks next to each other in the primary key (issue 17 item 1).

A job's task ids share a random 48-bit prefix and carry the task's position in the submission,
so the ids of one job sort in submission order and occupy a contiguous range of the ``tasks``
primary key; jobs are spread over the key space by their prefixes. The layout is an RFC 9562
version 8 (custom) UUID::

    bits 127..80  job prefix (48 random bits, one draw per job)
    bits  79..76  version 8
    bits  75..64  position, bits 31..20
    bits  63..62  variant 0b10
    bits  61..42  position, bits 19..0
    bits  41..0   random (42 bits per task)

Why: workers pop a job's ready tasks roughly in submission order, so two workers' claim and
completion batches touch mostly disjoint primary-key pages. PostgreSQL's serializable mode
locks the B-tree *pages* an index lookup reads, and a claim or completion (never a HOT update:
status is indexed) inserts into the primary key's pages: with uuid4 ids every batch of 128 ids
reads nearly every leaf page of a 10,000-task job, and two workers' transactions conflicted
(40001) on most tries. A job's range stays bounded by its size on CockroachDB too, where the
random prefix keeps different jobs on different ranges (no single insert hotspot as with
time-ordered ids).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from uuid import UUID

#: Most tasks a job's ids can number (the position has 32 bits).
MAX_POSITION = (1 << 32) - 1


def job_task_ids(count: int, *, randbits: Callable[[int], int] = secrets.randbits) -> list[UUID]:
    """``count`` distinct task ids for one job, in submission order (ascending as UUIDs).

    Args:
        count: how many tasks the job has (0 .. ``MAX_POSITION`` + 1).
        randbits: the random source (``secrets.randbits`` by default; tests pass a seeded one).

    Raises:
        ValueError: ``count`` is negative or beyond ``MAX_POSITION`` + 1.
    """
    if count < 0 or count > MAX_POSITION + 1:
        raise ValueError(f"a job's task ids number 0..{MAX_POSITION + 1}, not {count}")
    prefix = randbits(48) << 80
    ids = []
    for position in range(count):
        value = (
            prefix
            | (0x8 << 76)
            | ((position >> 20) & 0xFFF) << 64
            | (0b10 << 62)
            | (position & 0xFFFFF) << 42
            | randbits(42)
        )
        ids.append(UUID(int=value))
    return ids
