"""Task and run ids that keep one job's tasks, and its runs, next to each other in the
primary keys of ``tasks`` and ``task_runs`` (issue 17 item 1).

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

A run id (:func:`run_id_for`) is its task's id with the 42 random bits drawn again: with uuid4
run ids, a completion batch's lookup of its ~128 runs read more than 32 leaf pages of the
``task_runs`` primary key, which PostgreSQL then locks as a whole relation, and every
concurrent claim's run insert conflicted with it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from uuid import UUID

#: Most tasks a job's ids can number (the position has 32 bits).
MAX_POSITION = (1 << 32) - 1
#: Tasks whose random bits :func:`job_task_ids` draws at once.
_DRAW_TASKS = 64
_LOW_42 = (1 << 42) - 1
_LOW_48 = (1 << 48) - 1


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
    ids: list[UUID] = []
    prefix = 0
    for start in range(0, count, _DRAW_TASKS):
        # one draw per chunk of tasks (the job's prefix with the first): each draw is a
        # system call with the default source
        k = min(_DRAW_TASKS, count - start)
        bits = randbits(42 * k + (48 if start == 0 else 0))
        if start == 0:
            prefix, bits = (bits & _LOW_48) << 80, bits >> 48
        for position in range(start, start + k):
            value = (
                prefix
                | (0x8 << 76)
                | ((position >> 20) & 0xFFF) << 64
                | (0b10 << 62)
                | (position & 0xFFFFF) << 42
                | (bits & _LOW_42)
            )
            bits >>= 42
            ids.append(UUID(int=value))
    return ids


def run_id_for(task_id: UUID, *, randbits: Callable[[int], int] = secrets.randbits) -> UUID:
    """A new run id for a run of ``task_id``: the task id with its 42 random low bits drawn
    again, so that a job's runs, like its tasks, occupy one contiguous range of the
    ``task_runs`` primary key in position order (claims insert where no completion of an
    earlier batch reads). Distinct runs of one task differ in those 42 bits.

    Args:
        task_id: the task the run belongs to (any UUID; for ids not made by
            :func:`job_task_ids` the result is still a UUID of the same version and variant).
        randbits: the random source (``secrets.randbits`` by default).
    """
    return UUID(int=(task_id.int >> 42 << 42) | randbits(42))
