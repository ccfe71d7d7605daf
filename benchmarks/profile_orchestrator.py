"""``dtq orchestrator`` with round-trip counters: ``python -m benchmarks.profile_orchestrator``.

The counters of :mod:`benchmarks.profile_worker` (SQL statements by constant name, store
transactions and failed tries, Redis commands and pipelines), plus the size of every group
transaction the submit service writes. At exit the counts are written as JSON to
``$PROFILE_COUNTS``. Used by ``benchmarks.profile_submit``; not a part of dtq.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks import profile_worker

GROUPS: collections.Counter[int] = collections.Counter()


def _patch_groups() -> None:
    from dtq.application.submit import SubmitService

    write_group = SubmitService._write_group

    async def counted(self: Any, group: list[Any]) -> None:
        GROUPS[len(group)] += 1
        await write_group(self, group)

    SubmitService._write_group = counted  # type: ignore[method-assign]


def main() -> int:
    profile_worker._patch_psycopg()
    profile_worker._patch_store()
    profile_worker._patch_redis()
    _patch_groups()
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
            }
            Path(target).write_text(json.dumps(counts, indent=2))


if __name__ == "__main__":
    sys.exit(main())
