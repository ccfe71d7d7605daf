"""What the worker's loops pass to each other: a held claim and its phase, per-kind metrics."""

from __future__ import annotations

import asyncio
import copy
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prometheus_client import Counter, Histogram
from structlog.typing import FilteringBoundLogger

from dtq.application.commands import Claim
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.tracing import TraceHandle
from dtq.entrypoints.worker.backend import WorkerExecution
from dtq.entrypoints.worker.config import WorkerConfig

#: Reason written to a run handed back on shutdown (spec §6 Graceful shutdown).
HAND_BACK_REASON = "worker shutting down"

LEASE_LOST = "lease lost"  # another run owns the task now
LEASE_UNCONFIRMED = "lease unconfirmed"  # no renewal succeeded within the lease window
TASK_CANCELLED = "task cancelled"  # the heartbeat answered CANCELLED (issue 14 item 1)
#: Interruptions after which the worker records nothing: the run is no longer ours to end.
RECORD_NOTHING = frozenset({LEASE_LOST, LEASE_UNCONFIRMED, TASK_CANCELLED})
SHUTDOWN = "shutdown"


class Phase(enum.Enum):
    """Where a held claim is; decides what an interruption or a lost lease does to it."""

    STARTING = "starting"  # claimed; its asyncio task has not begun: interrupting marks it
    RUNNING = "running"  # the handler runs: interrupting cancels it
    WAITING = "waiting"  # succeeded, queued for the next completion batch
    COMMITTING = "committing"  # in a complete_many call now: that call decides
    SETTLING = "settling"  # failure / hand-back being recorded, or nothing to do


INTERRUPTIBLE = frozenset({Phase.STARTING, Phase.RUNNING})


@dataclass(frozen=True, slots=True, eq=False)
class Reported:
    """One ``task.progress(value)`` call (a copy of the value); compared by identity, so a new
    report is told apart from the one last written even when the value is None."""

    value: Any


@dataclass(eq=False, slots=True)
class Held:
    """A claim this worker holds, from its claim until its outcome is settled."""

    claim: Claim
    phase: Phase = Phase.STARTING
    task: asyncio.Task[None] | None = None  # the asyncio task running the handler
    interrupted: str | None = None  # LEASE_LOST, LEASE_UNCONFIRMED, TASK_CANCELLED or SHUTDOWN
    duration: float = 0.0  # handler wall time, seconds
    result: Any = None  # the handler's return value (checked storable), recorded with success
    progress: Reported | None = None  # the handler's latest progress report (task.progress)
    progress_written: Reported | None = None  # the report the lease renewal last stored
    trace: TraceHandle | None = None  # parent of its next span (issue 16); None: tracing off

    def report_progress(self, value: Any) -> None:
        """Keep ``value`` (already checked) as the latest progress; one attribute store, so
        safe from a sync handler's thread. The lease renewal writes it."""
        self.progress = Reported(copy.deepcopy(value))

    @property
    def unwritten_progress(self) -> Reported | None:
        """The latest report when its value differs from the last one the renewal stored."""
        latest, written = self.progress, self.progress_written
        if latest is None or latest is written:
            return None
        if written is not None and latest.value == written.value:
            return None
        return latest

    def final_progress(self) -> Mapping[UUID, Any] | None:
        """The ``progress`` argument of the report that ends this run: the latest value if the
        handler reported any (the outcome's transaction writes it), else None."""
        latest = self.progress
        return None if latest is None else {self.claim.task.id: latest.value}

    def interrupt(self, why: str) -> None:
        """Stop the handler (the first reason wins); no-op once it has finished.

        A task cancelled before its first step never runs its body, so a claim whose task has
        not begun is only marked: it checks the mark before calling the handler.
        """
        if self.phase not in INTERRUPTIBLE or self.interrupted is not None:
            return
        self.interrupted = why
        if self.phase is Phase.RUNNING and self.task is not None:
            self.task.cancel()

    @property
    def fields(self) -> dict[str, Any]:
        """Log fields of the claim's run (see :func:`task_fields`)."""
        return task_fields(self.claim)


def task_fields(claim: Claim) -> dict[str, Any]:
    """The log fields that identify a task's run: task_id, job_id, kind, attempt, run_id."""
    return {
        "task_id": str(claim.task.id),
        "job_id": str(claim.task.job_id),
        "kind": claim.task.kind,
        "attempt": claim.run.attempt_number,
        "run_id": str(claim.run.id),
    }


@dataclass(frozen=True, slots=True)
class KindMetrics:
    """The labelled children of one kind, looked up once instead of per task."""

    claimed: Counter
    succeeded: Counter
    duration: Histogram
    extensions: Counter


class Meters:
    """The worker's metrics plus a cache of per-kind children (spec §9 worker metrics)."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self._by_kind: dict[str, KindMetrics] = {}

    def start_at_zero(self, kinds: Iterable[str]) -> None:
        """Create every per-kind series of ``kinds`` at 0 (a series born at its first increment
        hides that increment from ``rate()``/``increase()``: a kind's first failure would escape
        an alert)."""
        m = self.metrics
        for kind in kinds:
            self.kind(kind)
            m.tasks_failed.labels(kind=kind)
            m.tasks_retried.labels(kind=kind)
            m.lease_losses.labels(kind=kind)

    def kind(self, kind: str) -> KindMetrics:
        """The children labelled ``kind=kind`` (created on first use)."""
        found = self._by_kind.get(kind)
        if found is None:
            m = self.metrics
            found = KindMetrics(
                claimed=m.tasks_claimed.labels(kind=kind),
                succeeded=m.tasks_succeeded.labels(kind=kind),
                duration=m.handler_duration.labels(kind=kind),
                extensions=m.lease_extensions.labels(kind=kind),
            )
            self._by_kind[kind] = found
        return found


@dataclass(frozen=True, slots=True)
class Shared:
    """What every loop of one worker run reads and none changes.

    Attributes:
        config: the run's configuration.
        execution: the worker's use cases (claim, report, lease renewal).
        meters: the worker's metrics.
        log: the worker's logger (``worker_id`` bound).
    """

    config: WorkerConfig
    execution: WorkerExecution
    meters: Meters
    log: FilteringBoundLogger
