"""``dtq orchestrator`` with round-trip counters: ``python -m benchmarks.profile_orchestrator``.

The counters of :mod:`benchmarks.profile_worker` (SQL statements by constant name, store
transactions and failed tries, Redis commands and pipelines), the size of every group
transaction the submit service writes, and the cyclic garbage collector's passes per generation
with the seconds they took (``gc.callbacks``, from the first group on: start-up left out). At
exit the counts are written as JSON to ``$PROFILE_COUNTS``. Used by
``benchmarks.profile_submit``; not a part of dtq.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import profile_worker

GROUPS: collections.Counter[int] = collections.Counter()
#: collections per generation, and the seconds all of them took
GC: dict[str, Any] = {"collections": [0, 0, 0], "seconds": 0.0}
_gc_started = [0.0]
_serving = [False]  # set by the first group: collections before it are the start-up's


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    if not _serving[0]:
        return
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        GC["collections"][info["generation"]] += 1
        GC["seconds"] += time.perf_counter() - _gc_started[0]


def _patch_groups() -> None:
    from dtq.application.submit import SubmitService

    write_group = SubmitService._write_group

    async def counted(self: Any, group: list[Any]) -> None:
        _serving[0] = True
        GROUPS[len(group)] += 1
        await write_group(self, group)

    SubmitService._write_group = counted  # type: ignore[method-assign]


def main() -> int:
    profile_worker._patch_psycopg()
    profile_worker._patch_store()
    profile_worker._patch_redis()
    _patch_groups()
    gc.callbacks.append(_gc_timer)
    from dtq.entrypoints.cli import orchestrator_main

    try:
        return orchestrator_main()
    finally:
        target = os.environ.get("PROFILE_COUNTS")
        if target:
            counts = {
                "sql": profile_worker.SQL,
                "sql_errors": profile_worker.SQL_ERRORS,
                "redis": profile_worker.REDIS,
                "store": profile_worker.STORE,
                "groups": {str(k): v for k, v in sorted(GROUPS.items())},
                "gc": GC,
            }
            Path(target).write_text(json.dumps(counts, indent=2))


if __name__ == "__main__":
    sys.exit(main())
