"""Value types of the worker runtime: what a handler receives and how the runtime is tuned.

These are re-exported by :mod:`dtq.entrypoints.runtime` and by the public :mod:`dtq.worker`
(the Python form of the spec's ``pkg/worker``, §6 Types); import them from there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias
from uuid import UUID

from dtq.application.execution import ExecutionService
from dtq.application.ports import Queue
from dtq.application.registry import WorkerRegistryService
from dtq.domain.entities import DEFAULT_PRIORITY


@dataclass(frozen=True, slots=True)
class Task:
    """The unit of work delivered to a handler (spec §6 ``Task``).

    Attributes:
        id: the task's id (``tasks.id``).
        job_id: the job the task belongs to.
        kind: the handler key the task was submitted with, e.g. ``email.send``.
        payload: the task's JSON payload, already decoded (dict, list, str, number, bool or None).
        attempt: 1-based attempt number of this delivery. A redelivery after a lost worker
            reuses the number (spec §4 attempt invariant), so it is not a unique run key.
    """

    id: UUID
    job_id: UUID
    kind: str
    payload: Any
    attempt: int


#: A task handler: ``async def h(task) -> None`` or a plain ``def h(task) -> None``.
#: Returning means success; raising means failure (retried while attempts remain);
#: raising :class:`PermanentError` fails the task at once (spec §6 Success / Failure).
Handler: TypeAlias = Callable[[Task], Awaitable[None]] | Callable[[Task], None]


class PermanentError(Exception):
    """Raise from a handler to fail the task at once, without using its remaining retries.

    Use it for errors another attempt cannot fix (a malformed payload, a rejected request).
    The message becomes the run's ``error`` text as ``"PermanentError: <message>"``; a subclass
    is reported under its own class name.
    """


@dataclass(frozen=True, slots=True)
class Options:
    """How the worker runtime behaves (spec §6 ``Options``). All durations are seconds.

    Attributes:
        default_timeout: deadline of one handler call; None means no deadline. When it passes
            the handler is cancelled (an async one) or abandoned in its thread (a sync one) and
            the attempt fails with ``"timed out after N s"``, retried by policy.
        heartbeat_every: lease heartbeat period. The runtime uses
            ``min(heartbeat_every, lease_duration / 3)`` (``LEASE_DURATION``, as the execution
            service's policy has it) so a lease never lapses between beats.
        concurrency: how many handlers run at once (slots); None takes ``WORKER_CONCURRENCY``.
            One fetch loop pops and claims work only into free slots.
        shutdown_grace: on a graceful stop, how long running handlers may take to finish
            before they are cancelled and handed back.
        sync_threads: size of the thread pool that runs plain (``def``) handlers.
        priorities: ready-queue tiers to pop, highest first (``queue:ready:{priority}``).
        poll_timeout: how long one pop blocks waiting for work; it also bounds how long a
            pop already in flight delays a stop.
        claim_batch: most task ids (a count) popped and claimed together in one store
            transaction (``ExecutionService.claim_many``); a pop takes
            ``min(free slots, claim_batch)``. 1 claims one task per transaction.
        complete_batch: most successes (a count) recorded together in one store transaction
            (``ExecutionService.complete_many``). Successes are committed as soon as the
            previous commit returns, so batches form only while a commit is in flight; no
            timer delays a success on an idle worker. The fetch loop also stops claiming while
            ``complete_batch`` successes are waiting for a commit (backpressure).

    Raises:
        ValueError: a value is out of range (non-positive durations, empty priorities, ...).
    """

    default_timeout: float | None = None
    heartbeat_every: float = 5.0
    concurrency: int | None = None
    shutdown_grace: float = 10.0
    sync_threads: int = 8
    priorities: tuple[str, ...] = (DEFAULT_PRIORITY,)
    poll_timeout: float = 1.0
    claim_batch: int = 32
    complete_batch: int = 128

    def __post_init__(self) -> None:
        if self.default_timeout is not None and self.default_timeout <= 0:
            raise ValueError("default_timeout must be > 0 seconds, or None for no deadline")
        if self.heartbeat_every <= 0:
            raise ValueError("heartbeat_every must be > 0 seconds")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1, or None for WORKER_CONCURRENCY")
        if self.shutdown_grace < 0:
            raise ValueError("shutdown_grace must be >= 0 seconds")
        if self.sync_threads < 1:
            raise ValueError("sync_threads must be >= 1")
        if self.poll_timeout <= 0:
            raise ValueError("poll_timeout must be > 0 seconds")
        if self.claim_batch < 1:
            raise ValueError("claim_batch must be >= 1 task")
        if self.complete_batch < 1:
            raise ValueError("complete_batch must be >= 1 task")
        priorities = tuple(self.priorities)
        if not priorities or not all(isinstance(p, str) and p for p in priorities):
            raise ValueError("priorities must be a non-empty sequence of tier names")
        object.__setattr__(self, "priorities", priorities)


class WorkerSettings(Protocol):
    """The part of ``dtq.entrypoints.config.Settings`` the runtime reads (spec §8)."""

    @property
    def worker_id(self) -> str:
        """``WORKER_ID``: written to ``task_runs.worker_id`` and the lease hash."""
        ...

    @property
    def worker_concurrency(self) -> int:
        """``WORKER_CONCURRENCY``: handler slots when ``Options.concurrency`` is None."""
        ...

    @property
    def worker_heartbeat_interval(self) -> float:
        """``WORKER_HEARTBEAT_INTERVAL`` in seconds: period of the ``workers`` row upsert."""
        ...

    @property
    def worker_metrics_listen(self) -> str | None:
        """Address (``":9100"``, ``"host:port"``) of the metrics endpoint; empty/None = off."""
        ...


class WorkerServices(Protocol):
    """The part of ``dtq.entrypoints.container.Services`` the runtime uses."""

    @property
    def execution(self) -> ExecutionService:
        """Claim, report and heartbeat (spec §5 claim flow)."""
        ...

    @property
    def registry(self) -> WorkerRegistryService:
        """The ``workers`` registry heartbeat (spec §4)."""
        ...

    @property
    def queue(self) -> Queue:
        """The ready lists the fetch loop pops from."""
        ...

    @property
    def settings(self) -> WorkerSettings:
        """Process configuration."""
        ...
