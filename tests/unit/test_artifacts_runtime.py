"""``task.artifacts`` through the worker runtime on the memory adapters and the fs store: a
producer stores bytes and returns the ref, a consumer reads them through ``task.parents``; a
missing artifact fails the task at once with ``ArtifactNotFound`` (issue 13 item 4)."""

from __future__ import annotations

import gc
import hashlib
import io
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dtq.application.commands import TaskSpec
from dtq.domain.status import JobStatus, TaskStatus
from dtq.worker import ArtifactNotFound, Options, PermanentError, Runtime, Task
from tests.unit.runtime_harness import build_harness

pytestmark = pytest.mark.timeout(20)

FAST = Options(lease_renew_every=0.1, shutdown_grace=1.0, poll_timeout=0.05)


async def _read(task: Task, ref: Any) -> bytes:
    return b"".join([chunk async for chunk in await task.artifacts.open(ref)])


async def test_a_child_reads_the_artifact_its_parent_stored(tmp_path: Path) -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    data = b"row,score\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(50_000))
    source = tmp_path / "big.csv"
    source.write_bytes(data)
    seen: list[bytes] = []

    @runtime.handler("produce")
    async def produce(task: Task) -> dict[str, Any]:
        return {
            "from_bytes": await task.artifacts.put(b"small"),
            "from_path": await task.artifacts.put(source),
            "from_file": await task.artifacts.put(io.BytesIO(b"file object")),
        }

    @runtime.handler("consume")
    async def consume(task: Task) -> int:
        refs = task.parents["a"]
        seen.extend([await _read(task, refs[k]) for k in ("from_bytes", "from_path", "from_file")])
        return len(seen)

    result = await h.submit_tasks(
        TaskSpec("a", "produce"), TaskSpec("b", "consume", depends_on=("a",))
    )
    async with h.running(runtime):
        job = await h.wait_job(result.job_id)

    assert job.job.status is JobStatus.COMPLETED
    assert seen == [b"small", data, b"file object"]
    ref = {t.name: t for t in job.tasks}["a"].result["from_path"]
    assert ref["size"] == len(data)
    assert ref["sha256"] == hashlib.sha256(data).hexdigest()
    assert await h.artifacts.stat(ref["artifact_id"]) == len(data)  # the API serves the same id


@pytest.mark.parametrize(
    "ref", [{"artifact_id": str(uuid.uuid4())}, {"artifact_id": "nope"}, {"size": 3}]
)
async def test_a_missing_artifact_fails_the_task_at_once(ref: dict[str, Any]) -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("read")
    async def read(task: Task) -> None:
        await task.artifacts.open(task.payload)

    task_id = await h.one("read", payload=ref, max_attempts=3)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    assert view.task.attempt == 1  # permanent: another attempt would not find it either
    assert (view.task.last_error or "").startswith("ArtifactNotFound: ")


def test_artifact_not_found_is_a_permanent_error() -> None:
    assert issubclass(ArtifactNotFound, PermanentError)


async def test_a_task_built_by_hand_says_it_has_no_artifact_store() -> None:
    task = Task(id=uuid.uuid4(), job_id=uuid.uuid4(), kind="k", payload=None, attempt=1)
    with pytest.raises(RuntimeError, match="no artifact store"):
        await task.artifacts.put(b"x")


async def test_a_harness_removes_its_artifact_directory_when_it_goes() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"kept until the harness goes"

    harness = build_harness()
    ref = await harness.artifacts.put(chunks())
    assert ref.size == len(b"kept until the harness goes")
    root = harness.artifacts_dir
    assert root.is_dir()

    del harness, ref
    gc.collect()
    assert not root.exists()
