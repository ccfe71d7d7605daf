"""Huey on Redis.

``huey_consumer <module>.huey --workers 2 --worker-type process`` (2 worker processes; the
consumer's parent only schedules), blocking BRPOP reads (``RedisHuey``'s default), no result
storage (``results=False``). Huey names its keys after the instance name, unique per run.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from huey import RedisHuey

from benchmarks.common import BIN, Drain, redis_addr, temp_prefix
from benchmarks.peers._base import WORKERS, incr, run_workers


def _huey(name: str) -> RedisHuey:
    return RedisHuey(name, url=f"redis://{redis_addr()}/0", results=False)


huey = _huey(os.environ.get("BENCH_HUEY_NAME", "benchhuey"))


def count() -> None:
    incr()


huey.task(name="bench_count")(count)


def drain(n: int, logs: Path) -> Drain:
    name = f"benchhuey{uuid.uuid4().hex[:8]}"
    producer = _huey(name)
    task = producer.task(name="bench_count")(count)
    with temp_prefix("huey") as prefix:
        try:
            for _ in range(n):
                task()
            return run_workers(
                logs,
                prefix,
                n,
                [
                    (
                        "huey",
                        [
                            str(BIN / "huey_consumer"),
                            "benchmarks.peers.huey_peer.huey",
                            "--workers",
                            str(WORKERS),
                            "--worker-type",
                            "process",
                            "--quiet",
                        ],
                    )
                ],
                env={"BENCH_HUEY_NAME": name},
            )
        finally:
            keys = list(producer.storage.conn.scan_iter(match=f"huey.*{name}*", count=1000))
            if keys:
                producer.storage.conn.delete(*keys)
