"""Dramatiq on Redis.

Configured as its docs suggest for throughput: ``dramatiq <module> --processes 2 --threads 8``
(2 worker processes, 8 worker threads each; Dramatiq's parent process only supervises), the
default middleware. All keys live under a unique ``namespace``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from benchmarks.common import BIN, ROOT, Drain, Processes, redis_addr, redis_client, temp_prefix
from benchmarks.peers._base import WORKERS, counter_key, incr, wait_all_ran

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
        env = {**os.environ, "BENCH_PEER_PREFIX": prefix, "PYTHONPATH": str(ROOT)}
        client = redis_client()
        with Processes(logs) as procs:
            launched = time.monotonic()
            procs.start(
                "dramatiq",
                [
                    str(BIN / "dramatiq"),
                    "benchmarks.peers.dramatiq_peer",
                    "--processes",
                    str(WORKERS),
                    "--threads",
                    str(THREADS),
                ],
                env,
            )
            try:
                return wait_all_ran(client, counter_key(prefix), n, procs, launched=launched)
            finally:
                procs.stop()
                client.close()
                producer.close()
