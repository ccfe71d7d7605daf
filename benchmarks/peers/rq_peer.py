"""RQ on Redis.

RQ forks a "work horse" per job by default, which caps a no-op workload at a few hundred jobs/s;
its docs offer ``SimpleWorker`` (runs jobs in the worker process) for exactly this, so the driver
starts 2 ``rq worker --worker-class rq.worker.SimpleWorker`` processes. Jobs are enqueued in
pipelined batches with ``result_ttl=0`` (no result kept). RQ has no key prefix: the queue and
worker names are unique per run, and every ``rq:`` key naming them (and each job's key) is
deleted afterwards.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import redis
from rq import Queue

from benchmarks.common import BIN, Drain, redis_addr, temp_prefix
from benchmarks.peers._base import WORKERS, incr, run_workers

_BATCH = 1000


def count() -> None:
    incr()


def drain(n: int, logs: Path) -> Drain:
    tag = uuid.uuid4().hex[:8]
    queue_name = f"bench-rq-{tag}"
    url = f"redis://{redis_addr()}/0"
    with temp_prefix("rq") as prefix:
        raw = redis.Redis.from_url(url)
        queue = Queue(queue_name, connection=raw)
        job_ids: list[str] = []
        try:
            for start in range(0, n, _BATCH):
                datas = [
                    Queue.prepare_data("benchmarks.peers.rq_peer.count", result_ttl=0)
                    for _ in range(min(_BATCH, n - start))
                ]
                job_ids.extend(job.id for job in queue.enqueue_many(datas))
            return run_workers(
                logs,
                prefix,
                n,
                [
                    (
                        f"rq{i}",
                        [
                            str(BIN / "rq"),
                            "worker",
                            "--url",
                            url,
                            "--worker-class",
                            "rq.worker.SimpleWorker",
                            "--name",
                            f"bench-rq-{tag}-{i}",
                            "--disable-job-desc-logging",
                            "--logging_level",
                            "WARNING",
                            queue_name,
                        ],
                    )
                    for i in range(WORKERS)
                ],
            )
        finally:
            _cleanup(raw, tag, job_ids)
            raw.close()


def _cleanup(client: redis.Redis, tag: str, job_ids: list[str]) -> None:
    """Delete every key this run left: its jobs, and anything naming its queue or workers."""
    for start in range(0, len(job_ids), _BATCH):
        client.delete(*(f"rq:job:{j}" for j in job_ids[start : start + _BATCH]))
        client.delete(*(f"rq:results:{j}" for j in job_ids[start : start + _BATCH]))
    keys = list(client.scan_iter(match=f"rq:*bench-rq-{tag}*", count=1000))
    if keys:
        client.delete(*keys)
    client.delete("rq:clean_groups")  # RQ's maintenance lock, taken by our workers
    for key in ("rq:workers", "rq:queues"):
        for member in client.smembers(key):
            if f"bench-rq-{tag}".encode() in member:
                client.srem(key, member)
