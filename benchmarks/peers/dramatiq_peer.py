"""Dramatiq on Redis.

Configured as its docs suggest for throughput: ``dramatiq <module> --processes 2 --threads 8``
(2 worker processes, 8 worker threads each; Dramatiq's parent process only supervises), the
default middleware. All keys live under a unique ``namespace``.
"""

from __future__ import annotations

import os
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from benchmarks.common import BIN, Drain, redis_addr, temp_prefix
from benchmarks.peers._base import WORKERS, incr, run_workers

THREADS = 8


def _broker(prefix: str) -> RedisBroker:
    return RedisBroker(url=f"redis://{redis_addr()}/0", namespace=f"{prefix}dramatiq")


broker = _broker(os.environ.get("BENCH_PEER_PREFIX", "bench:dramatiq:"))
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="bench_count", max_retries=0)
def count() -> None:
    incr()


def drain(n: int, logs: Path) -> Drain:
    with temp_prefix("dramatiq") as prefix:
        producer = _broker(prefix)
        producer.declare_actor(count)
        for _ in range(n):
            producer.enqueue(count.message())
        try:
            return run_workers(
                logs,
                prefix,
                n,
                [
                    (
                        "dramatiq",
                        [
                            str(BIN / "dramatiq"),
                            "benchmarks.peers.dramatiq_peer",
                            "--processes",
                            str(WORKERS),
                            "--threads",
                            str(THREADS),
                        ],
                    )
                ],
            )
        finally:
            producer.close()
