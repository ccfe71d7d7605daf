"""Two handler apps with different kinds, for the kind-aware routing drill (issue 15 item 2).

``runtime_a`` serves ``route.a`` only and ``runtime_b`` serves ``route.b`` only. Each handler
appends ``{"kind", "name", "pid"}`` to ``$E2E_RECORD_DIR/<pid>.jsonl``, so the drill can tell which
process ran which task.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dtq.worker import Options, Runtime, Task

_OPTIONS = Options(lease_renew_every=0.25, shutdown_grace=0.5, poll_timeout=0.5)
runtime_a = Runtime(_OPTIONS)
runtime_b = Runtime(_OPTIONS)


def _record(task: Task) -> None:
    payload = task.payload if isinstance(task.payload, dict) else {}
    line = {"event": "ran", "kind": task.kind, "name": payload.get("name"), "pid": os.getpid()}
    folder = Path(os.environ["E2E_RECORD_DIR"])
    with (folder / f"{os.getpid()}.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


@runtime_a.handler("route.a")
async def route_a(task: Task) -> None:
    _record(task)


@runtime_b.handler("route.b")
async def route_b(task: Task) -> None:
    _record(task)
