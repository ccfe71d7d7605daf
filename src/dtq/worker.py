"""The stable public surface for handler authors (the Python form of the spec's ``pkg/worker``).

Import from here, not from ``dtq.entrypoints``::

    from dtq.worker import Options, PermanentError, Runtime, Task

    runtime = Runtime(Options(default_timeout=120.0))

    @runtime.handler("report.generate")
    async def generate(task: Task) -> dict[str, int]:
        if "account" not in task.payload:
            raise PermanentError("payload has no 'account'")  # failed at once, no retry
        ...  # any other exception = failure, retried by policy
        return {"rows": 42}  # success; the return value (JSON) is the task's result

Run it with ``dtq-worker --app mypackage.tasks:runtime``. Handlers may be ``async def`` or plain
``def`` (run in a thread pool). Delivery is at-least-once: a handler must be idempotent, and
``task.attempt`` can repeat after a lost worker (spec §4, §6). A handler's return value (any JSON
value, at most ``API_MAX_RESULT_BYTES`` encoded) is stored as the task's result, and the tasks that
depend on it receive it in ``task.parents``; a value that cannot be stored fails the run for good.
Large data goes by reference: ``ref = await task.artifacts.put(data)`` stores bytes (or a file)
and returns a plain-JSON ref to put in a result or payload; ``await task.artifacts.open(ref)``
streams them back (see :class:`Artifacts`).

A long handler may report progress with ``task.progress(value)`` (any small JSON value): the
latest one is stored with the next lease renewal, and an attempt that follows a reclaim, a
hand-back or a failure receives it as ``task.checkpoint``, so it can resume::

    @runtime.handler("index.build")
    def build(task: Task) -> int:
        start = task.checkpoint or 0
        for chunk in range(start, 100):
            index_chunk(task.payload, chunk)
            task.progress(chunk + 1)  # no round trip: the lease renewal carries it
        return 100

``Task``, ``Handler``, ``PermanentError`` and ``Options`` are defined here with the standard
library only, so importing this module loads no database, Redis, metrics or logging library;
``Runtime`` (the engine, :mod:`dtq.entrypoints.worker.runtime`) is imported on first use.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Protocol, TypeAlias
from uuid import UUID

from dtq.domain.entities import DEFAULT_PRIORITY
from dtq.domain.errors import InvalidPayload
from dtq.domain.names import priority_problem
from dtq.domain.payload import MAX_PROGRESS_BYTES, check_progress

if TYPE_CHECKING:
    from dtq.entrypoints.worker.runtime import Runtime

__all__ = [
    "ArtifactData",
    "ArtifactForbidden",
    "ArtifactNotFound",
    "ArtifactRef",
    "Artifacts",
    "Handler",
    "Options",
    "PermanentError",
    "Runtime",
    "Task",
    "UnstorableProgress",
]


class PermanentError(Exception):
    """Raise from a handler to fail the task at once, without using its remaining retries.

    Use it for errors another attempt cannot fix (a malformed payload, a rejected request).
    The message becomes the run's ``error`` text as ``"PermanentError: <message>"``; a subclass
    is reported under its own class name.
    """


class UnstorableProgress(PermanentError, ValueError):
    """``task.progress(value)`` got a value that cannot be stored: not JSON (dict, list, str,
    finite number, bool, None), a NUL in a string, nested deeper than 64 levels, or over
    64 KiB as JSON. Uncaught, it fails the task at once with this message as the run's error."""


class ArtifactNotFound(PermanentError):
    """``task.artifacts.open`` was given a ref whose artifact does not exist (or a malformed
    ref). Uncaught, it fails the task at once: another attempt would not find it either."""


class ArtifactForbidden(PermanentError):
    """The orchestrator refused ``task.artifacts`` of a worker over HTTP (``--orchestrator``)
    for its token: a 403 (the token lacks the ``submit`` scope an upload needs or the ``read``
    scope a download needs; the message names it) or a 401 (the token was refused). Uncaught, it
    fails the task at once: another attempt with the same token would be refused too."""


#: A plain-JSON artifact ref: ``{"artifact_id": "<uuid>", "size": <int>, "sha256": "<hex>"}``
#: (what ``task.artifacts.put`` and ``POST /v1/artifacts`` return); ``open`` needs only the id.
ArtifactRef: TypeAlias = Mapping[str, Any]
#: What ``task.artifacts.put`` stores: bytes, a binary file object, a path, or async chunks.
ArtifactData: TypeAlias = (
    bytes | bytearray | memoryview | IO[bytes] | os.PathLike[str] | AsyncIterable[bytes]
)


class Artifacts(Protocol):
    """``task.artifacts``: store and read large data by reference (issue 13 item 4).

    The worker runtime provides the implementation (``ARTIFACT_BACKEND``: a directory or an
    S3-compatible bucket shared with the orchestrator, whose ``/v1/artifacts`` serves the same ids).
    """

    async def put(self, data: ArtifactData) -> dict[str, Any]:
        """Store ``data`` (read in chunks, never whole for files and streams) as a new artifact.

        Returns:
            Its ref, ``{"artifact_id", "size", "sha256"}``: plain JSON.
        """
        ...

    async def open(self, ref: ArtifactRef | str) -> AsyncIterator[bytes]:
        """Stream an artifact's bytes, by ref or by id.

        Raises:
            ArtifactNotFound: no artifact has that id, or the ref/id is malformed.
        """
        ...


class _NoArtifacts:
    """``task.artifacts`` of a Task built outside a worker runtime: every call says so."""

    async def put(self, data: ArtifactData) -> dict[str, Any]:
        raise RuntimeError("this Task has no artifact store (it was not delivered by a Runtime)")

    async def open(self, ref: ArtifactRef | str) -> AsyncIterator[bytes]:
        raise RuntimeError("this Task has no artifact store (it was not delivered by a Runtime)")


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
        parents: the results of the task's direct dependencies, by task name (fan-in): what
            each dependency's handler returned. Empty for a task without dependencies.
        checkpoint: the last progress value stored for this task by an earlier attempt
            (reclaimed, handed back at shutdown, or failed and retried), or None: where a
            long task can resume from.
        artifacts: large inputs and outputs by reference (:class:`Artifacts`).
    """

    id: UUID
    job_id: UUID
    kind: str
    payload: Any
    attempt: int
    parents: Mapping[str, Any] = field(default_factory=dict)
    checkpoint: Any = None
    _report: Callable[[Any], None] | None = field(default=None, repr=False, compare=False)

    artifacts: Artifacts = field(default_factory=_NoArtifacts, repr=False, compare=False)

    def progress(self, value: Any) -> None:
        """Report how far the handler got (issue 13 item 5); callable from any thread.

        ``value`` is any small JSON value (at most 64 KiB encoded). No round trip: the latest
        value wins and is written with the next lease renewal, fenced to this run, and the
        success, failure or hand-back that ends the run writes it too, so nothing reported is
        lost. It shows as ``"progress"`` in ``GET /v1/tasks/{id}``, and the next attempt gets
        it as :attr:`checkpoint`. A copy is kept: mutating ``value`` later changes nothing.

        Raises:
            UnstorableProgress: the value cannot be stored (the message says why and where).
        """
        try:
            check_progress(value, max_bytes=MAX_PROGRESS_BYTES)
        except InvalidPayload as exc:
            raise UnstorableProgress(exc.detail) from None
        if self._report is not None:
            self._report(value)


#: A task handler: ``async def h(task) -> Any`` or a plain ``def h(task) -> Any``.
#: Returning means success (the value is the task's result); raising means failure (retried
#: while attempts remain); raising :class:`PermanentError` fails the task at once (spec §6).
Handler: TypeAlias = Callable[[Task], Awaitable[Any]] | Callable[[Task], Any]


@dataclass(frozen=True, slots=True)
class Options:
    """How the worker runtime behaves (spec §6 ``Options``). All durations are seconds.

    Attributes:
        default_timeout: deadline of one handler call; None means no deadline. When it passes
            the handler is cancelled (an async one) or abandoned in its thread (a sync one) and
            the attempt fails with ``"timed out after N s"``, retried by policy.
        lease_renew_every: period of the LEASE renewal (spec §6 Lease). The runtime uses
            ``min(lease_renew_every, LEASE_DURATION / 3)`` so a lease never lapses between
            renewals. Not ``WORKER_HEARTBEAT_INTERVAL``, which paces the ``workers`` registry.
        concurrency: how many handlers run at once (slots); None takes ``WORKER_CONCURRENCY``.
        shutdown_grace: on a graceful stop, how long running handlers may take to finish
            before they are cancelled and handed back.
        sync_threads: size of the thread pool that runs plain (``def``) handlers.
        priorities: ready-queue tiers to pop, highest first (``queue:ready:{priority}``).
        poll_timeout: how long one pop blocks waiting for work; it also bounds how long a
            pop already in flight delays a stop.
        claim_batch: most task ids (a count) popped and claimed together in one store
            transaction; a pop takes ``min(free slots, claim_batch)``. None (the default)
            adapts it: a pop asks for at most 32 ids, twice as many after each pop that came
            back full (the ready lists hold more), up to 256, and 32 again after one that came
            back short; so a deep backlog is claimed in large, cheap transactions and the
            first handlers of a burst start after a small claim.
        complete_batch: most successes (a count) recorded together in one store transaction;
            claiming also pauses while this many successes wait for their commit.
        heartbeat_every: deprecated alias of ``lease_renew_every`` (DeprecationWarning); when
            given it replaces ``lease_renew_every`` and reads back as None.

    Every field is checked when the options are made, so a value that would break a run
    fails here, naming the field (``Options.concurrency must be a positive integer or None,
    not 1.5``): durations are ``int`` or ``float`` seconds (not bools), finite, above 0
    (``shutdown_grace``: 0 or more); counts are ``int`` (not bools, not ``2.0``) of at least 1,
    ``concurrency`` at most 4096 as ``WORKER_CONCURRENCY``; ``priorities`` is a non-empty
    sequence (a list is kept as a tuple; a lone str is refused, not split into letters) of
    names the API accepts (1 to 32 of ``a-z 0-9 _ -``).

    Raises:
        TypeError: a value of the wrong type (``"60"``, ``1.5`` for a count, ``"default"`` for
            ``priorities``).
        ValueError: a value out of range (non-positive or non-finite durations, empty
            priorities, a priority the API refuses, ...).
    """

    default_timeout: float | None = None
    lease_renew_every: float = 5.0
    concurrency: int | None = None
    shutdown_grace: float = 10.0
    sync_threads: int = 8
    priorities: tuple[str, ...] = (DEFAULT_PRIORITY,)
    poll_timeout: float = 1.0
    claim_batch: int | None = None
    complete_batch: int = 128
    heartbeat_every: float | None = None

    def __post_init__(self) -> None:
        if self.heartbeat_every is not None:
            warnings.warn(
                "Options.heartbeat_every is deprecated: use lease_renew_every",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "lease_renew_every", self.heartbeat_every)
            object.__setattr__(self, "heartbeat_every", None)
        if self.default_timeout is not None:
            _seconds("default_timeout", self.default_timeout, none=True)
        _seconds("lease_renew_every", self.lease_renew_every)
        _seconds("shutdown_grace", self.shutdown_grace, zero=True)
        _seconds("poll_timeout", self.poll_timeout)
        if self.concurrency is not None:
            _count("concurrency", self.concurrency, none=True, maximum=MAX_CONCURRENCY)
        _count("sync_threads", self.sync_threads)
        if self.claim_batch is not None:
            _count("claim_batch", self.claim_batch, none=True)
        _count("complete_batch", self.complete_batch)
        object.__setattr__(self, "priorities", _priorities(self.priorities))


#: Most handler slots (``Options.concurrency``), as ``WORKER_CONCURRENCY`` allows.
MAX_CONCURRENCY = 4096


def _seconds(name: str, value: object, *, zero: bool = False, none: bool = False) -> None:
    """Check ``Options.<name>``: a real number (not a bool) of seconds, finite, above 0 (0
    allowed with ``zero``); ``none`` says in the message that None is allowed too.

    Raises:
        TypeError: not a number.
        ValueError: NaN, infinite, or not above 0 (below 0 with ``zero``).
    """
    or_none = " or None" if none else ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"Options.{name} must be a number of seconds{or_none}, not {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        sign = "a non-negative" if zero else "a positive"
        raise ValueError(
            f"Options.{name} must be {sign} finite number of seconds{or_none}, not {value!r}"
        )


def _count(name: str, value: object, *, none: bool = False, maximum: int | None = None) -> None:
    """Check ``Options.<name>``: an ``int`` (not a bool) of at least 1 and at most ``maximum``;
    ``none`` says in the message that None is allowed too.

    Raises:
        TypeError: not an integer (``1.5``, ``2.0``, ``"8"``, ``True``).
        ValueError: below 1 or above ``maximum``.
    """
    wanted = f"Options.{name} must be a positive integer{' or None' if none else ''}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{wanted}, not {value!r}")
    if value < 1:
        raise ValueError(f"{wanted}, not {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"Options.{name} must be at most {maximum}, not {value!r}")


def _priorities(value: object) -> tuple[str, ...]:
    """``Options.priorities`` as a tuple: a non-empty sequence (not a str) of priorities the API
    accepts (:func:`dtq.domain.names.priority_problem`).

    Raises:
        TypeError: a str (it would be one tier per letter), or not iterable.
        ValueError: empty, or a name the API refuses (named).
    """
    wanted = "Options.priorities must be a sequence of priority names"
    if isinstance(value, str | bytes):
        raise TypeError(f"{wanted}, not the {type(value).__name__} {value!r}; e.g. ({value!r},)")
    if not isinstance(value, Iterable):
        raise TypeError(f"{wanted}, not {value!r}")
    priorities = tuple(value)
    if not priorities:
        raise ValueError(f"{wanted}, not empty")
    for priority in priorities:
        problem = priority_problem(priority)
        if problem is not None:
            raise ValueError(f"Options.priorities: {problem}")
    return priorities


def __getattr__(name: str) -> Any:
    """Import :class:`Runtime` on first use (it pulls in the worker's infrastructure)."""
    if name == "Runtime":
        from dtq.entrypoints.worker.runtime import Runtime

        return Runtime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
