"""Task and run ids of one job (domain/ids.py): version 8, adjacent and ordered by position."""

from __future__ import annotations

import random
import uuid

import pytest

from dtq.domain.ids import MAX_POSITION, job_task_ids, run_id_for


def test_a_jobs_ids_are_distinct_rfc_version_8_and_sorted_by_position() -> None:
    ids = job_task_ids(5_000)
    assert len(set(ids)) == 5_000
    assert ids == sorted(ids)
    assert {i.version for i in ids} == {8}
    assert {i.variant for i in ids} == {uuid.RFC_4122}
    assert len({i.int >> 80 for i in ids}) == 1  # one prefix per job


def test_positions_past_the_low_20_bits_keep_the_order() -> None:
    rng = random.Random(7)
    low = (1 << 20) - 1
    # the position's bits 31..20 sit above the variant bits, its bits 19..0 below them
    many = job_task_ids(low + 3, randbits=rng.getrandbits)
    assert (many[low + 1].int >> 64) & 0xFFF == 1  # position 2**20 carries into the high part
    assert many[low] < many[low + 1] < many[low + 2]


def test_two_jobs_draw_different_prefixes() -> None:
    a, b = job_task_ids(1), job_task_ids(1)
    assert a[0].int >> 80 != b[0].int >> 80


def test_count_out_of_range_is_refused() -> None:
    assert job_task_ids(0) == []
    with pytest.raises(ValueError, match="task ids number"):
        job_task_ids(-1)
    with pytest.raises(ValueError, match="task ids number"):
        job_task_ids(MAX_POSITION + 2)


def test_run_ids_sort_with_their_tasks_and_differ_per_run() -> None:
    tasks = job_task_ids(300)
    runs = [run_id_for(task_id) for task_id in tasks]
    assert runs == sorted(runs)  # a job's runs keep its tasks' order in the primary key
    assert {r.version for r in runs} == {8} and {r.variant for r in runs} == {uuid.RFC_4122}
    assert all(r.int >> 42 == t.int >> 42 for r, t in zip(runs, tasks, strict=True))
    again = {run_id_for(tasks[0]) for _ in range(50)}
    assert len(again) == 50  # each run of one task draws new low bits


def test_a_run_id_for_a_uuid4_task_keeps_its_version_and_variant() -> None:
    task_id = uuid.uuid4()
    run_id = run_id_for(task_id, randbits=lambda n: (1 << n) - 1)
    assert run_id.version == 4 and run_id.variant == uuid.RFC_4122
    assert run_id.int >> 42 == task_id.int >> 42 and run_id.int & ((1 << 42) - 1) == (1 << 42) - 1


def test_a_job_draws_its_random_bits_once_per_64_tasks() -> None:
    draws: list[int] = []
    rng = random.Random(11)

    def counted(bits: int) -> int:
        draws.append(bits)
        return rng.getrandbits(bits)

    assert len(job_task_ids(1, randbits=counted)) == 1
    assert draws == [48 + 42]  # the job's prefix and the task's bits, one system call
    draws.clear()
    ids = job_task_ids(130, randbits=counted)
    assert draws == [48 + 42 * 64, 42 * 64, 42 * 2]
    low = [i.int & ((1 << 42) - 1) for i in ids]
    assert len(set(low)) == 130  # every task takes its own 42 bits of the draws
    assert len({i.int >> 80 for i in ids}) == 1
