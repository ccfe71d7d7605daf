"""Huey on Redis.

``huey_consumer <module>.huey --workers 2 --worker-type process`` (2 worker processes; the
consumer's parent only schedules), blocking BRPOP reads (``RedisHuey``'s default), no result
storage (``results=False``). Huey names its keys after the instance name, unique per run.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from huey import RedisHuey

from benchmarks.common import BIN, ROOT, Drain, Processes, redis_addr, redis_client, temp_prefix
from benchmarks.peers._base import WORKERS, counter_key, incr, wait_all_ran


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
            env = {
                **os.environ,
                "BENCH_PEER_PREFIX": prefix,
                "BENCH_HUEY_NAME": name,
                "PYTHONPATH": str(ROOT),
            }
            client = redis_client()
            with Processes(logs) as procs:
                launched = time.monotonic()
                procs.start(
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
                    env,
                )
                try:
                    return wait_all_ran(client, counter_key(prefix), n, procs, launched=launched)
                finally:
                    procs.stop()
                    client.close()
        finally:
            keys = list(producer.storage.conn.scan_iter(match=f"huey.*{name}*", count=1000))
            if keys:
                producer.storage.conn.delete(*keys)
