"""Drivers for the queues a user would pick instead of dtq, run on the same 10,000 no-op tasks.

Each driver module (``celery_peer``, ``rq_peer``, ``dramatiq_peer``, ``huey_peer``,
``procrastinate_peer``) defines its task app at import time from ``BENCH_PEER_*`` environment
variables (so its worker processes import the very same module) and a ``drain(n, logs, **opts)``
that: creates its own Redis prefix / database, enqueues ``n`` tasks with no worker running,
starts 2 worker processes, waits until all ran, VERIFIES that every task ran (a Redis counter
each task increments, plus the peer's own durable record where it has one), stops the workers
and removes everything it created.

A peer whose package is not installed is reported as "not installed", never a crash.
"""

from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import median, say


@dataclass(frozen=True)
class Peer:
    """One configuration of one peer."""

    name: str  # short id used on the command line and in the table
    label: str  # what the table shows
    module: str  # driver module under benchmarks.peers
    durable: bool  # state kept in a database (True) or in Redis only
    options: dict[str, Any] = field(default_factory=dict)


PEERS: tuple[Peer, ...] = (
    Peer("huey", "Huey (Redis)", "huey_peer", durable=False),
    Peer("dramatiq", "Dramatiq (Redis)", "dramatiq_peer", durable=False),
    Peer("celery", "Celery (Redis, no results)", "celery_peer", durable=False),
    Peer("rq", "RQ (Redis)", "rq_peer", durable=False),
    Peer("procrastinate", "Procrastinate (PostgreSQL)", "procrastinate_peer", durable=True),
    Peer(
        "celery-pg",
        "Celery (Redis + PostgreSQL results)",
        "celery_peer",
        durable=True,
        options={"pg_results": True},
    ),
)


@dataclass
class PeerResult:
    """What one peer did: ``status`` is ``ok``, ``not installed`` or ``error``."""

    peer: Peer
    status: str
    rates: list[float] = field(default_factory=list)
    detail: str = ""

    @property
    def rate(self) -> float:
        return median(self.rates)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.peer.name,
            "label": self.peer.label,
            "durable": self.peer.durable,
            "status": self.status,
            "tasks_per_s": self.rate if self.rates else None,
            "runs": self.rates,
            "detail": self.detail,
        }


def run_peer(peer: Peer, n: int, runs: int, logs: Path, *, keep_going: Any = None) -> PeerResult:
    """Drain ``n`` tasks ``runs`` times with ``peer``; ``keep_going()`` may cut repeats short.

    Import failures of the peer's package mean "not installed"; any other failure is reported
    as ``error`` with its last line, so one broken peer never stops the benchmark.
    """
    try:
        driver = importlib.import_module(f"benchmarks.peers.{peer.module}")
    except ImportError as exc:
        return PeerResult(peer, "not installed", detail=str(exc))
    result = PeerResult(peer, "ok")
    for run in range(runs):
        if run > 0 and keep_going is not None and not keep_going():
            result.detail = f"{run} of {runs} runs (time budget)"
            break
        try:
            drain = driver.drain(n, logs / peer.name, **peer.options)
        except Exception as exc:
            say(traceback.format_exc(limit=3))
            if result.rates:
                result.detail = f"run {run + 1} failed: {exc}"
                break
            return PeerResult(peer, "error", detail=f"{type(exc).__name__}: {exc}")
        result.rates.append(drain.rate)
        say(f"  {peer.name}: {drain.rate:,.0f} tasks/s ({drain.window:.2f}s)")
    return result
