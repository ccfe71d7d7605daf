"""The handler app the end-to-end drills run in real ``dtq-worker`` processes.

Every handler appends JSON lines (``start``/``end`` events with wall-clock times and the worker
pid) to ``$E2E_RECORD_DIR/<pid>.jsonl``, one file per process so lines never interleave.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from dtq.worker import Options, PermanentError, Runtime, Task

runtime = Runtime(Options(lease_renew_every=0.25, shutdown_grace=0.5))


def _record(event: str, task: Task, **extra: Any) -> None:
    folder = Path(os.environ["E2E_RECORD_DIR"])
    line = {
        "event": event,
        "task_id": str(task.id),
        "attempt": task.attempt,
        "pid": os.getpid(),
        "t": time.time(),
        **extra,
    }
    with (folder / f"{os.getpid()}.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def _payload(task: Task) -> dict[str, Any]:
    return task.payload if isinstance(task.payload, dict) else {}


@runtime.handler("record")
async def record(task: Task) -> None:
    """Record start and end around an optional sleep of ``payload.sleep`` seconds."""
    _record("start", task, name=_payload(task).get("name"))
    await asyncio.sleep(float(_payload(task).get("sleep", 0)))
    _record("end", task, name=_payload(task).get("name"))


@runtime.handler("flaky")
def flaky(task: Task) -> None:
    """Fail the first ``payload.fail_times`` attempts, then succeed (a sync handler)."""
    _record("start", task)
    if task.attempt <= int(_payload(task).get("fail_times", 2)):
        raise RuntimeError(f"flaky failure on attempt {task.attempt}")
    _record("end", task)


@runtime.handler("always_fail")
async def always_fail(task: Task) -> None:
    """Fail every attempt."""
    _record("start", task)
    raise ValueError("this handler always fails")


@runtime.handler("poison")
async def poison(task: Task) -> None:
    """Fail permanently at once."""
    raise PermanentError("bad payload")


@runtime.handler("sleep_first")
async def sleep_first(task: Task) -> None:
    """Sleep ``payload.seconds`` on the first delivery of the task, finish at once afterwards."""
    flag = Path(os.environ["E2E_RECORD_DIR"]) / f"{task.id}.seen"
    first = not flag.exists()
    flag.touch()
    _record("start", task, first=first)
    if first:
        await asyncio.sleep(float(_payload(task).get("seconds", 30)))
    _record("end", task)


@runtime.handler("cancellable")
async def cancellable(task: Task) -> None:
    """Sleep ``payload.seconds`` (default 30), recording ``cancelled`` when the runtime cancels
    it (issue 14 item 1: its task was cancelled)."""
    _record("start", task)
    try:
        await asyncio.sleep(float(_payload(task).get("seconds", 30)))
    except asyncio.CancelledError:
        _record("cancelled", task)
        raise
    _record("end", task)


@runtime.handler("fail_first")
async def fail_first(task: Task) -> None:
    """Fail permanently on the first delivery of the task, succeed on any later one (a manual
    retry resets the attempt count, so the flag file tells the deliveries apart)."""
    flag = Path(os.environ["E2E_RECORD_DIR"]) / f"{task.id}.failed"
    first = not flag.exists()
    flag.touch()
    _record("start", task, first=first)
    if first:
        raise PermanentError("first delivery fails")
    _record("end", task)
