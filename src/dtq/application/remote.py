"""The HTTP worker protocol's use cases (issue 15 item 1): the orchestrator claims, renews and
reports on behalf of a worker that holds no database or Redis credentials.

Every step goes through :class:`~dtq.application.execution.ExecutionService`, the native
runtime's own use cases, so markers, leases and fencing are exactly the native worker's; this
service only adds what a remote worker cannot do itself: hold a claim request on the blocking
pop (over the routed lists of the worker's kinds, as a native worker's) and rebuild a
``Claim`` from a run id. Design notes: ARCHITECTURE.md, "Workers over HTTP (issue 15 item 1)".
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from uuid import UUID

from dtq.application.commands import Claim, ReportOutcome
from dtq.application.execution import ExecutionService, FailOutcome
from dtq.application.fleet import PRIORITIES, advertised
from dtq.application.ports import Clock, LeaseState, Queue, Store, Transaction
from dtq.application.registry import WorkerRegistryService
from dtq.domain.entities import Task, TaskRun
from dtq.domain.errors import (
    BackendUnavailable,
    Conflict,
    InvalidMetadata,
    InvalidPayload,
    NotFound,
)
from dtq.domain.payload import check_metadata, check_progress, check_result
from dtq.domain.status import RunStatus, TaskStatus

#: Reason written to a run handed back because its claim response had no one to go to.
UNDELIVERED_REASON = "claim not delivered: the worker disconnected"

#: Largest registry ``metadata`` of an HTTP worker, in bytes of JSON.
MAX_METADATA_BYTES = 64 * 1024

#: Most successes one ``complete_many`` records (the native runtime's ``complete_batch``).
SUCCESS_BATCH = 128

#: Workers whose last registry write this process remembers; past that it forgets them all
#: (each then costs one more write on its next claim).
SEEN_MAX = 4096

#: Runs this process remembers (handed out by its claims, or renewed through it while the
#: database answered) so that their heartbeats renew the lease while the database is down;
#: past that the least recently remembered is forgotten.
RUNS_MAX = 65_536


class Unreported(enum.Enum):
    """The ``progress`` of a report or heartbeat that carries none. ``None`` is a value: the
    handler reported ``None`` (a clean start for the next attempt), which is stored."""

    PROGRESS = "no progress reported"


#: ``progress`` argument of a report or heartbeat without one (see :class:`Unreported`).
NO_PROGRESS: Final = Unreported.PROGRESS


class RunNotFound(NotFound):
    """No run has this id."""

    code = "run_not_found"


class RunNotOwned(Conflict):
    """The run belongs to another worker id."""

    code = "run_not_owned"


class LeaseLost(Conflict):
    """The run is no longer the task's live run: stop working on it, report nothing."""

    code = "lease_lost"


class StaleReport(Conflict):
    """The run is no longer the task's live run (it was reclaimed): the report changed nothing."""

    code = "stale_run"


@dataclass(frozen=True, slots=True)
class Renewal:
    """What a remote heartbeat did.

    Attributes:
        lease_expires_at: the lease's new deadline (host clock plus ``LEASE_DURATION``).
        state: EXTENDED, or CANCELLED: the task was cancelled (issue 14 item 1), the worker
            must stop the handler and report nothing.
    """

    lease_expires_at: datetime
    state: LeaseState

    @property
    def cancel(self) -> bool:
        """True when the worker must stop the handler (the task was cancelled)."""
        return self.state is LeaseState.CANCELLED


class RemoteWorkerService:
    """Claims, lease renewals and reports of HTTP workers.

    Args:
        execution: the native runtime's use cases (claim, report, heartbeat, hand-back).
        store: read by run id, and to keep other kinds away from a worker.
        queue: the ready lists a held claim pops from.
        registry: the ``workers`` registry (``register``, ``remove``, and the row a claim
            keeps live).
        clock: dates the ``lease_expires_at`` of a renewal and the registry writes a claim
            skips (default: the system clock).
        refresh_every: seconds after which a claim writes its worker's registry row again
            (``WORKER_HEARTBEAT_INTERVAL``).
        live_within: seconds since its last registry write within which a worker's row is
            widened by a claim rather than replaced (the fleet's live window).
    """

    def __init__(
        self,
        *,
        execution: ExecutionService,
        store: Store,
        queue: Queue,
        registry: WorkerRegistryService,
        clock: Clock | None = None,
        refresh_every: float = 30.0,
        live_within: float = 120.0,
    ) -> None:
        self._registry = registry
        self._refresh_every = timedelta(seconds=refresh_every)
        self._live_within = live_within
        # worker id -> (when this process last wrote its row, the kinds and priorities the
        # row lists then; None for kinds: the row lists none, so any claim widens it)
        self._seen: dict[str, tuple[datetime, frozenset[str] | None, frozenset[str]]] = {}
        # run id -> (the run, its task's job id and kind): what a heartbeat needs to renew the
        # lease without the database (insertion order: least recently remembered first)
        self._runs: dict[UUID, tuple[TaskRun, UUID, str]] = {}
        self._execution = execution
        self._successes = _SuccessBatches(execution)
        self._store = store
        self._queue = queue
        self._clock = clock

    @property
    def lease_duration(self) -> float:
        """``LEASE_DURATION`` in seconds."""
        return self._execution.policy.lease_duration

    # -- claim ---------------------------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        *,
        kinds: Collection[str],
        priorities: Sequence[str],
        max_count: int,
        wait: float,
        gone: asyncio.Event | None = None,
    ) -> list[Claim]:
        """Hold until up to ``max_count`` tasks of ``kinds`` are claimed for ``worker_id``, or
        ``wait`` seconds pass (then none).

        First the worker's registry row is kept live with what the claim names
        (``WorkerRegistryService.serving``), so the fleet counts it for ``kinds`` and
        ``priorities``: written when this process has not written it within
        ``refresh_every`` or it lacks one of them, skipped otherwise; a failed write is left to
        the next claim.

        The wait is one blocking ``Queue.pop_many`` over the worker's priorities and the routed
        lists of its kinds (never a poll of the database or Redis); its ids go through
        ``ExecutionService.claim_many`` with ``kinds``, the native claim, which routes a task of
        another kind to its kind's list instead of claiming it (issue 15 item 2); the hold
        goes on until a claim or the end of ``wait``.

        When ``gone`` is set (the client disconnected), a pop in flight is let finish (a
        cancelled blocking pop would lose the ids the server already took) and what it brought
        is put back unclaimed; claims committed before ``gone`` was noticed are handed back
        (``ExecutionService.hand_back``, no retry charged). Claims whose response is then lost
        on the wire are reclaimed after their lease, like those of a silent worker.

        Args:
            worker_id: the claiming worker's id (written to the runs and leases).
            kinds: the kinds the worker runs (non-empty).
            priorities: ready-queue tiers, highest first (non-empty).
            max_count: most claims to return (>= 1).
            wait: seconds to hold for the first task (>= 0).
            gone: set when nobody waits for the answer any more.

        Returns:
            The claims (tasks ``running`` with a new run each), possibly empty.

        Raises:
            BackendUnavailable: the database or Redis failed (nothing was claimed, or the
                claims committed are left to reclaim).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        wanted = frozenset(kinds)
        await self._serving(worker_id, wanted, priorities)
        while True:
            remaining = max(0.0, deadline - loop.time())
            ids = await self._pop(priorities, remaining, max_count, gone, wanted)
            if gone is not None and gone.is_set():
                await self._put_back(ids)
                return []
            if not ids:
                return []
            # The native claim: a popped task of a kind not in ``wanted`` is not claimed but
            # moved to its kind's routed list (kind-aware routing, issue 15 item 2).
            claims = await self._execution.claim_many(ids, worker_id, wanted)
            if claims and gone is not None and gone.is_set():
                await self._hand_back(claims)
                return []
            for claim in claims:
                self._remember(claim.run, claim.task)
            if claims or remaining <= 0:
                return claims

    async def _serving(
        self, worker_id: str, kinds: frozenset[str], priorities: Sequence[str]
    ) -> None:
        now = self._now()
        seen = self._seen.get(worker_id)
        if (
            seen is not None
            and now - seen[0] < self._refresh_every
            and seen[1] is not None
            and kinds <= seen[1]
            and seen[2].issuperset(priorities)
        ):
            return
        if len(self._seen) >= SEEN_MAX:
            self._seen.clear()
        recent = seen is not None and now - seen[0] < timedelta(seconds=self._live_within)
        listed = (seen[1] or frozenset(), seen[2]) if seen is not None and recent else None
        # noted before the write, so the worker's concurrent claims do not write it too
        self._seen[worker_id] = (
            now,
            kinds if listed is None else kinds | listed[0],
            frozenset(priorities) if listed is None else listed[1].union(priorities),
        )
        try:
            await self._registry.serving(
                worker_id, kinds=kinds, priorities=priorities, live_within=self._live_within
            )
        except BackendUnavailable:  # the claim reports the outage itself; the next one retries
            self._seen.pop(worker_id, None)

    def _now(self) -> datetime:
        return self._clock.now() if self._clock is not None else datetime.now(UTC)

    async def _pop(
        self,
        priorities: Sequence[str],
        timeout: float,
        max_count: int,
        gone: asyncio.Event | None,
        kinds: frozenset[str],
    ) -> list[UUID]:
        pop = asyncio.ensure_future(
            self._queue.pop_many(priorities, timeout, max_count, kinds=kinds)
        )
        if gone is not None:
            watcher = asyncio.ensure_future(gone.wait())
            try:
                await asyncio.wait({pop, watcher}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watcher.cancel()
        return await pop  # never cancelled early: the ids the server took would be lost

    async def _put_back(self, task_ids: Sequence[UUID]) -> None:
        for task_id in task_ids:
            with contextlib.suppress(BackendUnavailable):  # the reconciler re-pushes it
                await self._execution.put_back(task_id)

    async def _hand_back(self, claims: Sequence[Claim]) -> None:
        for claim in claims:
            self._runs.pop(claim.run.id, None)
            with contextlib.suppress(BackendUnavailable):  # its lease lapses: reclaimed
                await self._execution.hand_back(claim, UNDELIVERED_REASON)

    def lease_expires_at(self, claim: Claim) -> datetime:
        """The deadline the claim wrote to its lease: the run's start plus the lease."""
        return claim.run.started_at + timedelta(seconds=self.lease_duration)

    async def register(
        self, worker_id: str, hostname: str | None, metadata: dict[str, Any]
    ) -> None:
        """Upsert the worker's registry row (``WorkerRegistryService.heartbeat``).

        Raises:
            InvalidMetadata: ``metadata`` cannot be stored (NUL, too deep, over
                ``MAX_METADATA_BYTES``; field below ``metadata``).
            BackendUnavailable: the database failed.
        """
        check_metadata(metadata)
        if len(json.dumps(metadata, separators=(",", ":")).encode()) > MAX_METADATA_BYTES:
            raise InvalidMetadata(
                f"metadata is over {MAX_METADATA_BYTES} bytes as JSON", field="metadata"
            )
        await self._registry.heartbeat(worker_id, hostname, metadata)
        self._seen[worker_id] = (
            self._now(),
            advertised(metadata, "kinds"),
            advertised(metadata, "priorities", PRIORITIES) or frozenset(),
        )

    async def unregister(self, worker_id: str) -> None:
        """Delete the worker's registry row (it stopped on purpose); idempotent. Its next
        claim, if any, records it again.

        Raises:
            BackendUnavailable: the database failed.
        """
        self._seen.pop(worker_id, None)
        await self._registry.remove(worker_id)

    # -- runs ----------------------------------------------------------------------------------

    async def load(self, run_id: UUID, worker_id: str) -> Claim:
        """The claim of run ``run_id`` as it is now (two reads; not the claim's hot path).

        Raises:
            RunNotFound: no run has this id (field ``run_id``).
            RunNotOwned: the run was claimed by another worker id.
            BackendUnavailable: the database failed.
        """

        async def read(tx: Transaction) -> tuple[TaskRun, Task | None] | None:
            run = await tx.runs.get(run_id)
            if run is None:
                return None
            return run, await tx.tasks.get(run.task_id)

        found = await self._store.run(read)
        task = None if found is None else found[1]
        if found is None or task is None:
            raise RunNotFound(f"no run has id {run_id}", field="run_id")
        run = found[0]
        if run.worker_id != worker_id:
            raise RunNotOwned(f"run {run_id} belongs to another worker id")
        return Claim(task=task, run=run, worker_id=run.worker_id)

    async def heartbeat(self, run_id: UUID, worker_id: str, progress: Any = NO_PROGRESS) -> Renewal:
        """Extend the run's lease (``ExecutionService.heartbeat``) and, when ``progress`` is
        given (not ``NO_PROGRESS``; None clears it), store it fenced on the run
        (``ExecutionService.record_progress``).

        The run is read from the database first (cancelled? still the task's live run?). While
        the database is down, a run this process remembers (handed out by its claims, or
        renewed through it since; at most ``RUNS_MAX``, forgotten once reported) is renewed
        from Redis alone, as a native worker's heartbeat is: the ownership check is against
        the remembered worker id, and the lease's compare on the run id is the fence
        (LOST when another run holds it). A run it does not remember, a lease that is missing
        (the store decides), or ``progress`` (it cannot be stored) still raise
        ``BackendUnavailable`` then.

        Raises:
            InvalidPayload: ``progress`` cannot be stored (field below ``progress``).
            RunNotFound, RunNotOwned: as :meth:`load`.
            LeaseLost: the run is no longer live (finished, reclaimed, taken over).
            BackendUnavailable: the database or Redis failed.
        """
        if progress is not NO_PROGRESS:
            check_progress(progress)
        try:
            claim = await self.load(run_id, worker_id)
        except BackendUnavailable:
            remembered = self._remembered(run_id, worker_id)
            if remembered is None:
                raise
            claim = remembered
        else:
            if claim.run.status is RunStatus.CANCELLED:  # the task was cancelled while it ran
                self._runs.pop(run_id, None)
                return Renewal(self._deadline(), LeaseState.CANCELLED)
            if claim.task.status is not TaskStatus.RUNNING or claim.task.current_run_id != run_id:
                self._runs.pop(run_id, None)
                raise LeaseLost(f"run {run_id} is no longer the task's live run")
            self._remember(claim.run, claim.task)
        expires = self._deadline()
        state = await self._execution.heartbeat(claim)
        if state is not LeaseState.EXTENDED:
            self._runs.pop(run_id, None)
        if state is LeaseState.LOST:
            raise LeaseLost(f"run {run_id} is no longer the task's live run")
        if progress is not NO_PROGRESS and state is LeaseState.EXTENDED:
            await self._execution.record_progress([(claim, progress)])
        return Renewal(expires, state)

    def _deadline(self) -> datetime:
        """A renewal's ``lease_expires_at``: now plus ``LEASE_DURATION``."""
        return self._now() + timedelta(seconds=self.lease_duration)

    def _remember(self, run: TaskRun, task: Task) -> None:
        """Note what a heartbeat of ``run`` needs without the database (most recent last)."""
        if self._runs.pop(run.id, None) is None and len(self._runs) >= RUNS_MAX:
            del self._runs[next(iter(self._runs))]
        self._runs[run.id] = (run, task.job_id, task.kind)

    def _forget(self, run_ids: Collection[UUID]) -> None:
        for run_id in run_ids:
            self._runs.pop(run_id, None)

    def _remembered(self, run_id: UUID, worker_id: str) -> Claim | None:
        """The claim of a remembered run (a heartbeat while the database is down), rebuilt
        with what a lease renewal reads; None when this process does not remember the run.

        Raises:
            RunNotOwned: the run was handed to another worker id.
        """
        known = self._runs.get(run_id)
        if known is None:
            return None
        run, job_id, kind = known
        if run.worker_id != worker_id:
            raise RunNotOwned(f"run {run_id} belongs to another worker id")
        task = Task(
            id=run.task_id,
            job_id=job_id,
            name="",
            kind=kind,
            payload=None,
            status=TaskStatus.RUNNING,
            scheduled_at=run.started_at,
            created_at=run.started_at,
            updated_at=run.started_at,
            attempt=run.attempt_number,
            started_at=run.started_at,
            current_run_id=run.id,
        )
        return Claim(task=task, run=run, worker_id=run.worker_id)

    async def succeed(
        self, run_id: UUID, worker_id: str, result: Any, *, progress: Any = NO_PROGRESS
    ) -> ReportOutcome:
        """Record the run's success with ``result`` (``ExecutionService.complete_many``);
        ``progress`` (unless ``NO_PROGRESS``) is the run's last progress, written with it.

        Successes reported while a commit is in flight are recorded together by the next one
        (at most ``SUCCESS_BATCH``), as the native runtime batches its own: one transaction
        per batch instead of one per task, so concurrent reports of one job do not conflict
        with each other (SERIALIZABLE) but share a commit. A batch that fails fails each of
        its reports alike.

        Returns:
            RECORDED, or DUPLICATE for a replay of a success already recorded.

        Raises:
            InvalidPayload: ``result`` cannot be stored (``API_MAX_RESULT_BYTES``, JSON rules).
            RunNotFound, RunNotOwned: as :meth:`load`.
            StaleReport: the run is no longer live; nothing changed.
            BackendUnavailable: the database or Redis failed.
        """
        if result is not None:
            check_result(result, max_bytes=self._execution.policy.max_result_bytes)
        final = _checked_progress(progress)
        claim = await self.load(run_id, worker_id)
        outcome = await self._successes.record(claim, result, final)
        self._runs.pop(run_id, None)
        if outcome is ReportOutcome.STALE:
            raise StaleReport(f"run {run_id} is no longer the task's live run")
        return outcome

    async def succeed_many(
        self, worker_id: str, reports: Sequence[tuple[UUID, Any, Any]]
    ) -> list[str]:
        """Record several successes ``(run_id, result, progress)`` of one worker (``progress``
        ``NO_PROGRESS`` when the report has none): one read of
        their runs and tasks, one ``ExecutionService.complete_many`` (at most
        ``SUCCESS_BATCH``; the caller bounds it).

        Returns:
            Per report, in order: ``recorded``, ``duplicate`` (a replay), ``stale_run`` (the run
            is no longer live; nothing changed), ``run_not_found`` or ``run_not_owned``.

        Raises:
            InvalidPayload: a result or progress cannot be stored (field ``[i].result…``;
                nothing was recorded).
            BackendUnavailable: the database or Redis failed (nothing, or all, was recorded:
                send the batch again; recorded reports answer ``duplicate``).
        """
        limit = self._execution.policy.max_result_bytes
        for i, (_, result, progress) in enumerate(reports):
            for value, what in ((result, "result"), (progress, "progress")):
                if value is None or value is NO_PROGRESS:
                    continue
                try:
                    if what == "result":
                        check_result(value, max_bytes=limit)
                    else:
                        check_progress(value)
                except InvalidPayload as exc:
                    raise InvalidPayload(exc.detail, field=f"[{i}].{exc.field}") from None
        run_ids = [run_id for run_id, _, _ in reports]

        async def read(tx: Transaction) -> tuple[list[TaskRun], list[Task]]:
            runs = await tx.runs.get_many(run_ids)
            return runs, await tx.tasks.get_many([run.task_id for run in runs])

        runs, tasks = await self._store.run(read)
        run_of = {run.id: run for run in runs}
        task_of = {task.id: task for task in tasks}
        answers: list[str] = []
        wanted: list[tuple[int, Claim, Any, Any]] = []
        for i, (run_id, result, progress) in enumerate(reports):
            run = run_of.get(run_id)
            task = None if run is None else task_of.get(run.task_id)
            if run is None or task is None:
                answers.append(RunNotFound.code)
            elif run.worker_id != worker_id:
                answers.append(RunNotOwned.code)
            else:
                answers.append("")
                wanted.append((i, Claim(task=task, run=run, worker_id=worker_id), result, progress))
        if wanted:
            outcomes = await self._execution.complete_many(
                [claim for _, claim, _, _ in wanted],
                [result for _, _, result, _ in wanted],
                progress={c.task.id: p for _, c, _, p in wanted if p is not NO_PROGRESS} or None,
            )
            for (i, _, _, _), outcome in zip(wanted, outcomes, strict=True):
                answers[i] = StaleReport.code if outcome is ReportOutcome.STALE else str(outcome)
        self._forget(run_ids)  # each report has its answer: no heartbeat of it follows
        return answers

    async def fail(
        self,
        run_id: UUID,
        worker_id: str,
        error: str,
        *,
        permanent: bool,
        progress: Any = NO_PROGRESS,
    ) -> FailOutcome:
        """Record the run's failure (``ExecutionService.fail``: retried by policy unless
        ``permanent``); ``progress`` (unless ``NO_PROGRESS``) is written with it: the retry's
        checkpoint.

        Returns:
            The outcome (RECORDED, or DUPLICATE for a replay) and the retry's due time.

        Raises:
            InvalidPayload: ``progress`` cannot be stored.
            RunNotFound, RunNotOwned: as :meth:`load`.
            StaleReport: the run is no longer live; nothing changed.
            BackendUnavailable: the database or Redis failed.
        """
        final = _checked_progress(progress)
        claim = await self.load(run_id, worker_id)
        outcome = await self._execution.fail(
            claim, error, permanent=permanent, progress=_final(claim, final)
        )
        self._runs.pop(run_id, None)
        if outcome.outcome is ReportOutcome.STALE:
            raise StaleReport(f"run {run_id} is no longer the task's live run")
        return outcome

    async def release(
        self, run_id: UUID, worker_id: str, reason: str, *, progress: Any = NO_PROGRESS
    ) -> ReportOutcome:
        """Give the run's task back at once (``ExecutionService.hand_back``: a worker shutting
        down; no retry and no crash budget charged); ``progress`` (unless ``NO_PROGRESS``) is
        written with it.

        Returns:
            RECORDED.

        Raises:
            InvalidPayload: ``progress`` cannot be stored.
            RunNotFound, RunNotOwned: as :meth:`load`.
            StaleReport: the run is no longer live (also a replay: the run is already dead).
            BackendUnavailable: the database or Redis failed.
        """
        final = _checked_progress(progress)
        claim = await self.load(run_id, worker_id)
        outcome = await self._execution.hand_back(claim, reason, progress=_final(claim, final))
        self._runs.pop(run_id, None)
        if outcome is ReportOutcome.STALE:
            raise StaleReport(f"run {run_id} is no longer the task's live run")
        return outcome


class _SuccessBatches:
    """Coalesces concurrent success reports into ``complete_many`` batches: one commit in
    flight at a time, the next batch taking whatever arrived meanwhile."""

    def __init__(self, execution: ExecutionService) -> None:
        self._execution = execution
        self._waiting: list[tuple[Claim, Any, Any, asyncio.Future[ReportOutcome]]] = []
        self._committing: asyncio.Task[None] | None = None

    async def record(self, claim: Claim, result: Any, progress: Any) -> ReportOutcome:
        outcome: asyncio.Future[ReportOutcome] = asyncio.get_running_loop().create_future()
        self._waiting.append((claim, result, progress, outcome))
        if self._committing is None or self._committing.done():
            self._committing = asyncio.ensure_future(self._commit_all())
        return await asyncio.shield(outcome)  # a caller that goes away leaves the batch alone

    async def _commit_all(self) -> None:
        while self._waiting:
            batch = self._waiting[:SUCCESS_BATCH]
            del self._waiting[:SUCCESS_BATCH]
            claims = [claim for claim, _, _, _ in batch]
            progress = {c.task.id: p for c, _, p, _ in batch if p is not NO_PROGRESS}
            try:
                outcomes = await self._execution.complete_many(
                    claims, [result for _, result, _, _ in batch], progress=progress or None
                )
            except Exception as exc:  # each report answers with the batch's error
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (*_, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():
                    future.set_result(outcome)


def _checked_progress(value: Any) -> Any:
    if value is not NO_PROGRESS:
        check_progress(value)
    return value


def _final(claim: Claim, progress: Any) -> dict[UUID, Any] | None:
    """The ``progress`` argument of a report that ends the claim's run."""
    return None if progress is NO_PROGRESS else {claim.task.id: progress}
