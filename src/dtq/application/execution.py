"""What a worker does with a popped task id: claim, report, heartbeat, hand back (spec §5, §6).

Every method follows one rule: the transaction first, Redis after its commit (DESIGN §3). Every
write that ends a run is fenced on the run still being the task's live run, so a worker whose
run was reclaimed changes nothing (``ReportOutcome.STALE``).

This module is over 400 lines on purpose: spec §5's claim flow (claim, report, lease, hand back)
lives in one service so that no half of it sits in the worker; split it by use case (claim,
report, lease) if it grows further.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import random
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from dtq.application.commands import Claim, ExecutionPolicy, ReportOutcome
from dtq.application.ports import (
    CarriedTask,
    Clock,
    Lease,
    LeaseState,
    Queue,
    Store,
    Transaction,
)
from dtq.application.transitions import (
    cascade_failure,
    mark_job_failed,
    mark_jobs_started,
    promote_dependents,
    settle_jobs,
)
from dtq.domain.entities import Job, Task, TaskRun
from dtq.domain.errors import (
    BackendUnavailable,
    CommitOutcomeUnknown,
    ConcurrentUpdate,
    StaleRun,
    TaskNotClaimable,
)
from dtq.domain.ids import run_id_for
from dtq.domain.payload import MAX_ERROR_CHARS, storable_text
from dtq.domain.policy import retry_delay
from dtq.domain.status import RunStatus, TaskStatus


@dataclass(frozen=True, slots=True)
class _Followup:
    """Redis work to do after a commit."""

    outcome: ReportOutcome
    enqueue: tuple[Task, ...] = ()
    schedule_at: datetime | None = None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: A report's transaction function; its second argument says whether it replays a call whose
#: COMMIT had an unknown outcome (then a report it finds already recorded is its own).
_TxFn = Callable[[Transaction, bool], Awaitable[_Followup]]


@dataclass(frozen=True, slots=True)
class FailOutcome:
    """What :meth:`ExecutionService.fail` did.

    Attributes:
        outcome: RECORDED, DUPLICATE (already recorded) or STALE (the run is no longer live).
        retry_at: when the retry is due (database clock, aware UTC) if one was scheduled;
            None when the task failed for good or nothing was recorded.
    """

    outcome: ReportOutcome
    retry_at: datetime | None = None

    @property
    def retried(self) -> bool:
        """True when a retry was scheduled."""
        return self.retry_at is not None


class ClaimsUnresolved(BackendUnavailable):
    """A claim transaction's COMMIT outcome is unknown and reading it back failed as well.

    Some of its claims may have committed; ``run_ids`` (task id -> run id) lets
    :meth:`ExecutionService.recover_claims` find them later.
    """

    code = "claims_unresolved"

    def __init__(self, detail: str, run_ids: Mapping[UUID, UUID]) -> None:
        super().__init__(detail)
        self.run_ids = dict(run_ids)


class ExecutionService:
    """The worker-side use cases.

    Args:
        store: the system of record.
        queue: ready lists, markers, leases, scheduled set.
        policy: lease duration, retry backoff, crash budget (seconds).
        clock: the host clock the heartbeat dates a lease's ``deadline_ms`` by (default: the
            system clock, aware UTC).
        rand: floats in ``[0, 1)`` for retry jitter (``domain.policy.retry_delay``); default
            ``random.random``, inject a fixed one in tests.
    """

    def __init__(
        self,
        *,
        store: Store,
        queue: Queue,
        policy: ExecutionPolicy,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._store = store
        self._queue = queue
        self._policy = policy
        self._clock = clock
        self._rand = rand
        #: run id -> set once the lease write of its claim (made with ``on_commit``) returned
        self._leasing: dict[UUID, asyncio.Event] = {}

    @property
    def policy(self) -> ExecutionPolicy:
        """The execution policy in force."""
        return self._policy

    # -- claim ---------------------------------------------------------------------------------

    async def claim_many(
        self,
        task_ids: Sequence[UUID],
        worker_id: str,
        kinds: Collection[str] | None = None,
        *,
        on_commit: Callable[[list[Claim]], None] | None = None,
    ) -> list[Claim]:
        """Claim task ids popped from the ready lists, in one transaction (spec §5 claim flow).

        Each claimable task goes ``queued -> running`` with a new run; then, whatever happened,
        every popped id's pending marker is released (this worker owns those deliveries since
        the pop removed them); then the leases are set. A task that is queued but not yet due
        (a stale duplicate popped early, or one promoted early because the queue server's
        clock runs ahead of the database's) is refused and put back on the scheduled set for
        its due time plus that observed skew (``Queue.server_time`` minus the transaction's
        time, if positive), so a skew costs one wasted claim, not one per promotion interval.
        Unknown, finished or already claimed tasks are refused silently.

        Kind-aware routing (issue 15 item 2): with ``kinds``, a ``queued`` task whose kind is
        not among them is not claimed either; after the transaction it is moved to the routed
        list of its (priority, kind) (``Queue.route``), keeping its pending marker, so that only
        workers serving that kind receive it. The kind is read from the rows the claim reads
        anyway: no statement is added.

        Args:
            task_ids: the popped ids (duplicates are claimed once).
            worker_id: this worker's identity.
            kinds: the kinds this worker serves (the same as its ``Queue.pop_many``); None
                claims every kind (the worker fails what it has no handler for).
            on_commit: called once with the committed claims (in the order of ``task_ids``,
                possibly none) right after the commit, before the Redis writes that follow it
                are awaited: a worker starts the handlers there, so their start does not wait
                for the lease write's round trip. A lone claim's write is sent only after the
                tasks ``on_commit`` started have taken their first step (one turn of the event
                loop); a batch's is sent first. Until that write returns, :meth:`complete_many`,
                :meth:`fail` and :meth:`hand_back` of these claims wait for it before deleting
                their leases. Not called when the claim raises.

        Returns:
            The claims, in the order of ``task_ids``; refused ids are left out.

        A Redis error after the commit does not raise: the claims are returned (the worker owns
        them once committed; see :meth:`_after_claim`).

        Raises:
            ClaimsUnresolved: the COMMIT outcome is unknown and reading it back failed; some
                claims may be ours: pass its ``run_ids`` to :meth:`recover_claims`.
            BackendUnavailable: the database failed before anything committed (the marker
                releases were still attempted).
        """
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return []
        served = None if kinds is None else frozenset(kinds)
        run_ids = {task_id: run_id_for(task_id) for task_id in ids}
        # a lone id popped with its snapshot is claimed without reading it, on the first try
        # only (a re-run reads: the snapshot was refused or is used up)
        carried = [c] if len(ids) == 1 and (c := self._queue.carried(ids[0])) else []

        async def claim(tx: Transaction) -> _ClaimBatch:
            if carried:
                batch = await _claim_carried(tx, carried.pop(), run_ids, worker_id, served)
                if batch is not None:
                    return batch
            return await _claim_tx(tx, ids, run_ids, worker_id, served)

        try:
            try:
                batch = await self._store.run(claim)
            except CommitOutcomeUnknown:
                try:
                    batch = await self._store.run(
                        lambda tx: _claim_recovered(tx, run_ids, worker_id)
                    )
                except BackendUnavailable as exc:
                    raise ClaimsUnresolved(str(exc), run_ids) from exc
        except BaseException:
            await self._queue.release_markers(ids)
            raise
        if on_commit is None:
            await self._after_claim(ids, batch)
            return batch.claims
        leased = asyncio.Event()
        runs = [claim.run.id for claim in batch.claims]
        for run_id in runs:
            self._leasing[run_id] = leased
        try:
            on_commit(batch.claims)
            if len(batch.claims) == 1:  # the idle path: the handler first, then the write
                await asyncio.sleep(0)
        finally:  # the leases are written whatever the callback did
            try:
                await self._after_claim(ids, batch)
            finally:
                for run_id in runs:
                    del self._leasing[run_id]
                leased.set()
        return batch.claims

    async def _leases_written(self, run_ids: Sequence[UUID]) -> None:
        """Wait until the lease writes of these runs' claims (``claim_many``'s ``on_commit``
        path) have returned, so that a lease is never deleted before it is written."""
        if not self._leasing:
            return
        for leased in {self._leasing[r] for r in run_ids if r in self._leasing}:
            await leased.wait()

    async def recover_claims(self, run_ids: Mapping[UUID, UUID], worker_id: str) -> list[Claim]:
        """Learn which claims of an unresolved claim transaction committed (``ClaimsUnresolved``).

        Read-only and idempotent: a task is claimed by us exactly when the run id we gave it is
        its live run. The markers of every id are released and the found claims' leases set.

        Returns:
            The claims that committed (those this worker owns now).

        Raises:
            BackendUnavailable: the database failed again (call it again later).
        """
        batch = await self._store.run(lambda tx: _claim_recovered(tx, dict(run_ids), worker_id))
        await self._after_claim(list(run_ids), batch)
        return batch.claims

    async def _after_claim(self, ids: list[UUID], batch: _ClaimBatch) -> None:
        """After a claim commit: release the markers and write the leases (one call), route
        the tasks of kinds this worker does not serve, schedule the not due.

        A Redis error (``BackendUnavailable``) here is swallowed: the claims are committed and
        the worker owns them (a missing lease is re-created by the next heartbeat, a marker
        expires, a due queued task is re-pushed by the reconciler).
        """
        # The leases and the marker releases in one call, a routing in parallel: the claim's
        # latency is on the path to the handler's start. A routed id keeps its marker: it is
        # listed again.
        leases = [self._lease(claim) for claim in batch.claims]
        steps = []
        if batch.misrouted:
            routed = {task_id for task_id, _, _ in batch.misrouted}
            ids = [task_id for task_id in ids if task_id not in routed]
            steps.append(self._queue.route(batch.misrouted))
        set_leases = self._queue.set_leases(leases, self._policy.lease_ttl, release=ids)
        if steps:
            results = await asyncio.gather(set_leases, *steps, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, BackendUnavailable):
                    raise result  # a bug, not an outage
        else:  # awaited in place: no task of its own on a lone claim's path
            with contextlib.suppress(BackendUnavailable):
                await set_leases
        if batch.not_due:
            # Promoted early because the queue's clock runs ahead of the database's: put it
            # back at its due time plus that skew, so the next promotion is the last one.
            skew = timedelta(0)
            with contextlib.suppress(BackendUnavailable):
                skew = max(await self._queue.server_time() - batch.now, timedelta(0))
            for task_id, priority, due in batch.not_due:
                with contextlib.suppress(BackendUnavailable):
                    await self._queue.schedule(task_id, priority, due + skew)

    async def put_back(self, task_id: UUID) -> bool:
        """Return a popped id this worker will not claim (it is shutting down).

        The delivery ends unclaimed, so its pending marker is released (spec §5, second release
        path) and, if the task is still ``queued``, the id is pushed again behind a new marker so
        another worker takes it at once instead of after a reconcile interval. No run is created.

        Returns:
            True when the id was pushed again.

        Raises:
            BackendUnavailable: the database or Redis failed (the marker release was attempted).
        """

        async def read(tx: Transaction) -> Task | None:
            return await tx.tasks.get(task_id)

        try:
            task = await self._store.run(read)
        finally:
            await self._queue.release_markers([task_id])
        if task is None or task.status is not TaskStatus.QUEUED:
            return False
        return await self._queue.enqueue_many([(task_id, task.priority)]) == 1

    # -- outcomes ------------------------------------------------------------------------------

    async def complete_many(
        self,
        claims: Sequence[Claim],
        results: Sequence[Any] | None = None,
        *,
        progress: Mapping[UUID, Any] | None = None,
    ) -> list[ReportOutcome]:
        """Record handler successes, in one transaction (spec §6 Success).

        Each task ``completed`` with its result (``results[i]`` for ``claims[i]``, any JSON
        value already checked by ``domain.payload.check_result``; None or no ``results``:
        null), written by the same statement that completes it; its run ``succeeded``;
        dependents whose dependencies are all complete are promoted to ``queued``; job statuses
        are settled. After the commit the leases are deleted and the promoted tasks pushed
        (the result costs no statement of its own). ``progress`` (task id -> the latest value
        the run reported, see :meth:`record_progress`) is written with the success by the same
        statement; pass every task whose handler reported any, since the first try writes the
        task back as claimed. Reporting a success again is a no-op
        (``DUPLICATE``); a report from a run that is no longer live is refused (``STALE``) and
        changes nothing, without affecting the other claims of the batch.

        Every try trusts the claims first: the tasks and runs as this worker claimed them are
        written back with a compare-and-set on the task's claim-time ``version`` (and the run
        still ``running``), without reading them first: two statements and their read locks
        fewer on the hot path. If any task changed since its claim (reclaimed, cancelled, a
        replayed report), nothing is written and the same transaction goes on with the checked
        path, which reads every task and run and judges each claim on its own.

        Returns:
            One outcome per claim, in order: RECORDED, DUPLICATE or STALE.

        A Redis failure after the commit is not raised (the outcomes stand): a lease left
        behind expires on its own, and the reconciler pushes the promoted dependents.

        Raises:
            BackendUnavailable: the database failed (nothing was recorded).
        """
        if not claims:
            return []
        if results is None:
            results = [None] * len(claims)
        elif len(results) != len(claims):
            raise ValueError(f"{len(results)} results for {len(claims)} claims")

        tries = 0

        async def tx_fn(tx: Transaction) -> tuple[list[ReportOutcome], list[Task]]:
            # Every try, a re-run after a conflict included, first writes from the claims: a
            # failed try committed nothing, and the compare-and-set still sends any claim whose
            # task changed meanwhile to the checked path (issue 17: a re-run that reads every
            # task and run is slower and conflicts more). The claims' job rows are trusted on
            # the first try only: a job changed since its claim fails that try.
            nonlocal tries
            tries += 1
            trust = tries == 1
            recorded = await _complete_as_claimed(tx, claims, results, progress, trust_jobs=trust)
            if recorded is not None:
                return recorded
            return await _complete_tx(tx, claims, results, progress, trust_jobs=trust)

        try:
            outcomes, promoted = await self._store.run(tx_fn)
        except CommitOutcomeUnknown:
            # Recording a success is idempotent: run it again to learn whether it landed, and
            # if it did, redo its Redis side (the dependents it promoted) and count it.
            outcomes, promoted = await self._store.run(
                lambda tx: _complete_replayed(tx, claims, results, progress)
            )
        await self._leases_written([c.run.id for c in claims])
        with contextlib.suppress(BackendUnavailable):  # the commit stands: see the docstring
            await self._queue.delete_leases([(c.task.id, c.run.id) for c in claims])
        if promoted:
            with contextlib.suppress(BackendUnavailable):
                await self._queue.enqueue_many(
                    [(t.id, t.priority) for t in promoted if not t.due_later]
                )
                for task in promoted:
                    if task.due_later:  # a delayed dependent: it also waits for its own time
                        await self._queue.schedule(task.id, task.priority, task.scheduled_at)
        return outcomes

    async def fail(
        self,
        claim: Claim,
        error: str,
        *,
        permanent: bool = False,
        progress: Mapping[UUID, Any] | None = None,
    ) -> FailOutcome:
        """Record the handler's failure (spec §6 Failure, Unknown kind).

        The run becomes ``failed`` with ``error`` (NUL and lone surrogates written as their
        escapes: ``domain.payload.storable_text``; cut to ``MAX_ERROR_CHARS``, 10,000
        characters); the task is retried after
        ``policy.retry_backoff`` seconds, or the delay of its own ``retry_policy``
        (``domain.policy.retry_delay``), through the scheduled set while attempts remain and
        the error is not ``permanent``, else it fails and its pending dependents are failed
        transitively, and the job fails. ``progress`` (as for :meth:`complete_many`) is
        written in the same transaction and stays the task's checkpoint for the retry.

        After a COMMIT whose outcome was unknown the report is replayed; a replay that finds
        the failure recorded takes it as its own: RECORDED, and the retry (if the task still
        waits for it) is put on the scheduled set again.

        A Redis failure after the commit is not raised: the retry is then pushed by the
        reconciler once it is due.

        Returns:
            The outcome (RECORDED, DUPLICATE: this failure was already recorded, or STALE) and
            when the retry is due, if one was scheduled (``domain.policy.decide_retry``).

        Raises:
            BackendUnavailable: the database failed (nothing was recorded).
        """
        error = storable_text(error, max_chars=MAX_ERROR_CHARS)
        default_backoff = timedelta(seconds=self._policy.retry_backoff)
        retry_at: datetime | None = None

        async def tx_fn(tx: Transaction, replay: bool) -> _Followup:
            nonlocal retry_at
            task, run = await _load_run(tx, claim)
            _flush_progress(task, run.id, progress)
            now = await tx.now()
            backoff = retry_delay(
                task.retry_policy, attempt=task.attempt, default=default_backoff, rand=self._rand
            )
            decision = task.fail(run, error=error, permanent=permanent, backoff=backoff, at=now)
            if decision is None:
                if not replay:
                    return _Followup(ReportOutcome.DUPLICATE)
                followup = _failure_replayed(task, run)
                retry_at = followup.schedule_at
                return followup
            retry_at = decision.next_attempt_at if decision.retry else None
            await tx.tasks.save(task)
            await tx.runs.save(run)
            if decision.retry:
                return _Followup(ReportOutcome.RECORDED, schedule_at=decision.next_attempt_at)
            await cascade_failure(tx, task, at=now)
            await mark_job_failed(tx, task.job_id, at=now)
            return _Followup(ReportOutcome.RECORDED)

        outcome = await self._report(claim, tx_fn)
        return FailOutcome(outcome, retry_at if outcome is not ReportOutcome.STALE else None)

    async def hand_back(
        self, claim: Claim, reason: str, *, progress: Mapping[UUID, Any] | None = None
    ) -> ReportOutcome:
        """Give an unfinished task back at once (graceful shutdown, spec §6).

        Like a reclaim — run ``dead`` with ``reason`` (escaped as a failure's error is), task
        ``queued`` due now, attempt rolled back — but the crash budget is not charged. After
        commit the marker is released and the id re-pushed. A replay after a COMMIT whose
        outcome was unknown that finds this hand-back recorded (the run ``dead`` with
        ``reason``) re-pushes the task if it is still ``queued``. ``progress`` (as for
        :meth:`complete_many`) is written in the same transaction: the next attempt reads it as
        its checkpoint.

        A Redis failure after the commit is not raised: the marker expires and the
        reconciler pushes the task.

        Returns:
            RECORDED, or STALE when the run is no longer live.

        Raises:
            BackendUnavailable: the database failed (nothing was recorded).
        """
        reason = storable_text(reason, max_chars=MAX_ERROR_CHARS)

        async def tx_fn(tx: Transaction, replay: bool) -> _Followup:
            task, run = await _load_run(tx, claim)
            _flush_progress(task, run.id, progress)
            now = await tx.now()
            try:
                requeued = task.reclaim(
                    run,
                    reason=reason,
                    max_reclaims=self._policy.max_reclaims,
                    at=now,
                    worker_lost=False,
                )
            except StaleRun:
                if replay and run.status is RunStatus.DEAD and run.error == reason:
                    return _hand_back_replayed(task, run)
                raise
            await tx.tasks.save(task)
            await tx.runs.save(run)
            if requeued:
                return _Followup(ReportOutcome.RECORDED, enqueue=(task,))
            # already past a crash budget lowered since: it fails like a reclaim past budget
            await cascade_failure(tx, task, at=now)
            await mark_job_failed(tx, task.job_id, at=now)
            return _Followup(ReportOutcome.RECORDED)

        return await self._report(claim, tx_fn, release_marker=True)

    async def _report(
        self,
        claim: Claim,
        tx_fn: _TxFn,
        *,
        release_marker: bool = False,
    ) -> ReportOutcome:
        try:
            try:
                followup = await self._store.run(lambda tx: tx_fn(tx, False))
            except CommitOutcomeUnknown:
                # Every report is idempotent: run it again to learn; a replay that finds its
                # own commit landed returns that commit's follow-up (bug: it returned none).
                followup = await self._store.run(lambda tx: tx_fn(tx, True))
        except StaleRun:
            return ReportOutcome.STALE
        await self._leases_written([claim.run.id])
        # The commit stands whatever Redis does now: a lease left behind expires on its own,
        # a marker at its TTL, and the reconciler pushes a queued task that is due (a retry's
        # at its time) and on no ready list. Raising would make the caller report again.
        with contextlib.suppress(BackendUnavailable):
            await self._queue.delete_leases([(claim.task.id, claim.run.id)])
        with contextlib.suppress(BackendUnavailable):
            if followup.schedule_at is not None:
                await self._queue.schedule(claim.task.id, claim.task.priority, followup.schedule_at)
            for task in followup.enqueue:
                if release_marker:
                    await self._queue.release_markers([task.id])
                await self._queue.enqueue_many([(task.id, task.priority)])
        return followup.outcome

    # -- lease ---------------------------------------------------------------------------------

    async def record_progress(self, reports: Sequence[tuple[Claim, Any]]) -> set[UUID]:
        """Store the held claims' latest progress values (issue 13 item 5), in one transaction
        of one statement (``TaskRepository.save_progress``); the lease renewal calls it once
        per tick with the values changed since its last write, so no call costs nothing.

        Each value (already checked by ``domain.payload.check_progress``) is written only
        while its run is the task's live run (``running``, same run id): a stale run's value
        changes nothing (DESIGN §7).

        Returns:
            The ids of the tasks whose progress was written.

        Raises:
            BackendUnavailable: the database failed (nothing was written).
        """
        updates = [(claim.task.id, claim.run.id, value) for claim, value in reports]
        if not updates:
            return set()
        return await self._store.run(lambda tx: tx.tasks.save_progress(updates))

    async def heartbeat(self, claim: Claim) -> LeaseState:
        """Extend one claim's lease: :meth:`heartbeat_many` of ``[claim]``."""
        (state,) = await self.heartbeat_many([claim])
        return state

    async def heartbeat_many(self, claims: Sequence[Claim]) -> list[LeaseState]:
        """Extend the claims' leases (spec §6 Lease / heartbeat, DESIGN §3 lease ownership).

        Each lease hash's ``deadline_ms`` becomes the heartbeat's time (the ``clock``) plus
        ``policy.lease_duration``, and its TTL ``policy.lease_ttl``, all in one
        ``Queue.extend_leases`` call. A heartbeat whose leases are all there costs no statement.
        For the leases the queue lost, one store transaction reads their tasks (and the runs of
        those not live): a claim whose run is still its task's live run gets its lease
        re-created with ``Queue.recreate_lease``, which writes it only if the task still has no
        lease, so a lease another run wrote meanwhile (the task was reclaimed and claimed again)
        is left alone and the answer is LOST (cancel the handler and report nothing). A cancel
        of a running task (issue 14 item 1) closes its run ``cancelled`` and then deletes the
        lease, so the next heartbeat finds none and, reading the run, answers CANCELLED (cancel
        the handler and report nothing: its report would be refused as STALE).

        Returns:
            One state per claim, in order: ``LeaseState.EXTENDED``, ``LeaseState.LOST`` or
            ``LeaseState.CANCELLED`` (never MISSING).

        Raises:
            BackendUnavailable: Redis or the database failed (for the whole call).
        """
        if not claims:
            return []
        now = self._clock.now() if self._clock is not None else datetime.now(UTC)
        deadline = now.timestamp() + self._policy.lease_duration
        leases = [self._lease(claim, deadline=deadline) for claim in claims]
        states = await self._queue.extend_leases(leases, self._policy.lease_ttl)
        missing = [i for i, state in enumerate(states) if state is LeaseState.MISSING]
        if not missing:
            return states

        async def ended(tx: Transaction) -> dict[int, LeaseState]:
            tasks = {t.id: t for t in await tx.tasks.get_many([claims[i].task.id for i in missing])}
            gone = []
            for i in missing:
                task = tasks.get(claims[i].task.id)
                if not (
                    task is not None
                    and task.status is TaskStatus.RUNNING
                    and task.current_run_id == claims[i].run.id
                ):
                    gone.append(i)  # not ours any more: lost, or cancelled
            if not gone:
                return {}
            runs = {r.id: r for r in await tx.runs.get_many([claims[i].run.id for i in gone])}
            answers = {}
            for i in gone:
                run = runs.get(claims[i].run.id)
                cancelled = run is not None and run.status is RunStatus.CANCELLED
                answers[i] = LeaseState.CANCELLED if cancelled else LeaseState.LOST
            return answers

        answers = await self._store.run(ended)
        live = [i for i in missing if i not in answers]  # still ours: re-create the lease
        recreated = await asyncio.gather(
            *(self._queue.recreate_lease(leases[i], self._policy.lease_ttl) for i in live)
        )
        answers.update(zip(live, recreated, strict=True))
        return [answers.get(i, state) for i, state in enumerate(states)]

    def _lease(self, claim: Claim, *, deadline: float | None = None) -> Lease:
        """The claim's lease hash; ``deadline`` in epoch seconds (default: the claim's start
        plus the lease duration, the deadline written at claim time)."""
        if deadline is None:
            deadline = claim.run.started_at.timestamp() + self._policy.lease_duration
        return Lease(
            task_id=claim.task.id,
            worker_id=claim.worker_id,
            run_id=claim.run.id,
            deadline_ms=int(deadline * 1000),
        )


@dataclass(slots=True)
class _ClaimBatch:
    """What one claim transaction produced."""

    claims: list[Claim] = field(default_factory=list)
    not_due: list[tuple[UUID, str, datetime]] = field(default_factory=list)
    misrouted: list[tuple[UUID, str, str]] = field(default_factory=list)  # id, priority, kind
    now: datetime = _EPOCH  # the transaction's time (database clock), when it listed not_due


async def _claim_tx(
    tx: Transaction,
    task_ids: list[UUID],
    run_ids: dict[UUID, UUID],
    worker_id: str,
    kinds: frozenset[str] | None = None,
) -> _ClaimBatch:
    jobs: list[Job] | None = None
    if len(task_ids) == 1:  # an idle worker's claim: task and job in one statement
        found, jobs = await tx.tasks.get_many_with_jobs(task_ids)
    else:  # a batch reads the jobs of the claimed tasks only, after the claim
        found = await tx.tasks.get_many(task_ids)
    tasks = {task.id: task for task in found}
    now = await tx.now()
    batch = _ClaimBatch(now=now)
    roots: set[UUID] = set()
    claimed: list[tuple[Task, TaskRun]] = []
    for task_id in task_ids:
        task = tasks.get(task_id)
        if task is None:
            continue
        if kinds is not None and task.kind not in kinds:
            if task.status is TaskStatus.QUEUED:  # not ours to run: route it (issue 15 item 2)
                batch.misrouted.append((task_id, task.priority, task.kind))
            continue
        if task.version == 0 and task.status is TaskStatus.QUEUED:
            roots.add(task_id)  # read before the claim: see _with_parents
        try:
            run = task.claim(run_id=run_ids[task_id], worker_id=worker_id, at=now)
        except TaskNotClaimable as refused:
            if refused.not_before is not None and refused.priority is not None:
                batch.not_due.append((task_id, refused.priority, refused.not_before))
            continue
        claimed.append((task, run))
    if claimed:
        await tx.tasks.save_many([task for task, _ in claimed])
        await tx.runs.add_many([run for _, run in claimed])
        if jobs is None:
            jobs = await tx.jobs.get_many(list({task.job_id for task, _ in claimed}))
        started = await mark_jobs_started(tx, jobs, at=now)
        batch.claims = await _with_parents(tx, _claims(claimed, started, worker_id), roots=roots)
    return batch


async def _claim_carried(
    tx: Transaction,
    carried: CarriedTask,
    run_ids: dict[UUID, UUID],
    worker_id: str,
    kinds: frozenset[str] | None,
) -> _ClaimBatch | None:
    """A lone claim from the snapshot its pop brought (``Queue.carried``): the store confirms
    the task and job rows in the request that writes the claim and commits (one request in
    all, ``TaskRepository.confirm``), instead of a read before it. None, with nothing sent,
    when the snapshot does not qualify (not a root task never written since its submit, or a
    kind this worker does not serve): the caller reads.

    Raises:
        ConcurrentUpdate: the task is not claimable at the try's time (read it on the re-run),
            or (from the commit's request) a row is not as carried, or the raised estimate
            of the try's time was refused.
    """
    task, job = carried.task, carried.job
    if (
        task.version != 0
        or task.status is not TaskStatus.QUEUED
        or task.job_id != job.id
        or task.id not in run_ids
        or (kinds is not None and task.kind not in kinds)
    ):
        return None
    # the outbox records the transitions of this try only: none came with the snapshot
    task.transitions, job.transitions = (), ()
    # the submit that dated the task committed before this try began: an estimate lagging
    # behind its due time is raised to it rather than refused and re-run
    now = await tx.write_time(not_before=task.scheduled_at)
    tx.tasks.confirm(task)
    tx.jobs.confirm(job)
    try:
        run = task.claim(run_id=run_ids[task.id], worker_id=worker_id, at=now)
    except TaskNotClaimable as refused:
        raise ConcurrentUpdate(f"carried task {task.id} not claimable: {refused}") from refused
    await tx.tasks.save_many([task])
    await tx.runs.add_many([run])
    started = await mark_jobs_started(tx, [job], at=now)
    # a root: no parents
    return _ClaimBatch(now=now, claims=_claims([(task, run)], started, worker_id))


def _claims(
    claimed: Sequence[tuple[Task, TaskRun]], jobs: Sequence[Job], worker_id: str
) -> list[Claim]:
    """A claim per ``(task, run)``, with what it carries of its job (found in ``jobs``, as the
    claim transaction left it): the job itself and its ``trace_context`` (issue 16 item 5);
    None for both when the job is not among ``jobs``."""
    by_id = {job.id: job for job in jobs}
    claims = []
    for task, run in claimed:
        job = by_id.get(task.job_id)
        claims.append(
            Claim(task=task, run=run, worker_id=worker_id)
            if job is None
            else Claim(
                task=task,
                run=run,
                worker_id=worker_id,
                trace_context=job.trace_context,
                job=job,
            )
        )
    return claims


async def _with_parents(
    tx: Transaction, claims: list[Claim], *, roots: set[UUID] | frozenset[UUID] = frozenset()
) -> list[Claim]:
    """The claims with their direct dependencies' results (``Claim.parents``): one statement
    for the whole batch, its cost proportional to the batch's in-degree (issue 13 fan-in).

    ``roots`` are tasks known to have no dependencies: read ``queued`` at version 0, i.e.
    never written since a submit that stored them ``queued``, which it does only for a task
    without ``depends_on`` (a dependent is stored ``pending`` and becomes ``queued`` through a
    write). They are not looked up: a batch of roots alone runs no statement.
    """
    wanted = [claim.task.id for claim in claims if claim.task.id not in roots]
    if not wanted:
        return claims
    parents = await tx.tasks.parent_results(wanted)
    if not parents:
        return claims
    return [
        dataclasses.replace(claim, parents=parents[claim.task.id])
        if claim.task.id in parents
        else claim
        for claim in claims
    ]


async def _claim_recovered(
    tx: Transaction, run_ids: dict[UUID, UUID], worker_id: str
) -> _ClaimBatch:
    """After an ambiguous commit: a claim stuck exactly when its run is the task's live run."""
    tasks = {task.id: task for task in await tx.tasks.get_many(list(run_ids))}
    runs = {run.id: run for run in await tx.runs.get_many(list(run_ids.values()))}
    batch = _ClaimBatch()
    claimed: list[tuple[Task, TaskRun]] = []
    for task_id, run_id in run_ids.items():
        task, run = tasks.get(task_id), runs.get(run_id)
        if task is not None and run is not None and task.current_run_id == run_id:
            claimed.append((task, run))
    if claimed:
        jobs = await tx.jobs.get_many(list({task.job_id for task, _ in claimed}))
        batch.claims = await _with_parents(tx, _claims(claimed, jobs, worker_id))
    return batch


def _flush_progress(task: Task, run_id: UUID, progress: Mapping[UUID, Any] | None) -> None:
    """Set the run's last reported progress on ``task`` before its outcome, if there is one;
    a stale run's value is dropped (its outcome is refused anyway)."""
    if progress and task.id in progress:
        with contextlib.suppress(StaleRun):
            task.record_progress(run_id, progress[task.id])


async def _complete_as_claimed(
    tx: Transaction,
    claims: Sequence[Claim],
    results: Sequence[Any],
    progress: Mapping[UUID, Any] | None,
    *,
    trust_jobs: bool,
) -> tuple[list[ReportOutcome], list[Task]] | None:
    """Record every claim's success from the claim itself, or nothing (returns None).

    Works on copies, so the claims stay as claimed for the checked path. The tasks' CAS is all
    or nothing; when it passes, every run is still ``running`` (a run only ends together with a
    write to its task), so a failing run CAS is a real conflict and re-runs the transaction.
    """
    if len({claim.task.id for claim in claims}) != len(claims):
        return None
    now = await tx.now()
    tasks: list[Task] = []
    runs: list[TaskRun] = []
    for claim, result in zip(claims, results, strict=True):
        task, run = copy.copy(claim.task), copy.copy(claim.run)
        _flush_progress(task, run.id, progress)
        try:
            if not task.succeed(run, at=now, result=result):
                return None
        except StaleRun:
            return None
        tasks.append(task)
        runs.append(run)
    try:
        await tx.tasks.save_many(tasks)
    except ConcurrentUpdate:
        return None
    await tx.runs.save_many(runs)
    promoted = await _after_completion(tx, tasks, claims, at=now, trust_jobs=trust_jobs)
    return [ReportOutcome.RECORDED] * len(claims), promoted


async def _after_completion(
    tx: Transaction,
    done: Sequence[Task],
    claims: Sequence[Claim],
    *,
    at: datetime,
    trust_jobs: bool,
) -> list[Task]:
    """Promote the dependents of ``done`` (just completed; ``claims[i]`` is the claim of
    ``done[i]``) and settle their jobs. A task whose claim says its job has no dependencies
    (``Claim.job_has_dependencies`` False) has no dependents and is not looked up: a batch of
    such tasks sends no statement for the promotion. With ``trust_jobs``, the job of a task
    that is its only task (``Claim.job`` with ``task_count`` 1) is settled from a copy of the
    claim's row, not read (``settle_jobs``'s ``completed_alone``); its write still compares
    the version, so a job changed since the claim fails the try (``ConcurrentUpdate``) and
    the re-run, which passes ``trust_jobs`` False, reads it."""
    searched = [
        task
        for task, claim in zip(done, claims, strict=True)
        if claim.job_has_dependencies is not False
    ]
    promoted = await promote_dependents(tx, searched, at=at)
    alone = []
    if trust_jobs:
        for claim in claims:
            if claim.job is not None and claim.job.task_count == 1:
                job = copy.copy(claim.job)
                job.transitions = ()
                alone.append(job)
    await settle_jobs(tx, (task.job_id for task in done), at=at, completed_alone=alone)
    return promoted


async def _complete_tx(
    tx: Transaction,
    claims: Sequence[Claim],
    results: Sequence[Any],
    progress: Mapping[UUID, Any] | None,
    *,
    trust_jobs: bool,
) -> tuple[list[ReportOutcome], list[Task]]:
    tasks = {t.id: t for t in await tx.tasks.get_many([c.task.id for c in claims])}
    runs = {r.id: r for r in await tx.runs.get_many([c.run.id for c in claims])}
    now = await tx.now()
    outcomes: list[ReportOutcome] = []
    done: list[tuple[Task, TaskRun, Claim]] = []
    for claim, result in zip(claims, results, strict=True):
        task, run = tasks.get(claim.task.id), runs.get(claim.run.id)
        if task is None or run is None:
            outcomes.append(ReportOutcome.STALE)
            continue
        _flush_progress(task, run.id, progress)
        try:
            changed = task.succeed(run, at=now, result=result)
        except StaleRun:
            outcomes.append(ReportOutcome.STALE)
            continue
        outcomes.append(ReportOutcome.RECORDED if changed else ReportOutcome.DUPLICATE)
        if changed:
            done.append((task, run, claim))
    if not done:
        return outcomes, []
    tasks_done = [task for task, _, _ in done]
    await tx.tasks.save_many(tasks_done)
    await tx.runs.save_many([run for _, run, _ in done])
    claims_done = [claim for _, _, claim in done]
    return outcomes, await _after_completion(
        tx, tasks_done, claims_done, at=now, trust_jobs=trust_jobs
    )


async def _complete_replayed(
    tx: Transaction,
    claims: Sequence[Claim],
    results: Sequence[Any],
    progress: Mapping[UUID, Any] | None,
) -> tuple[list[ReportOutcome], list[Task]]:
    """``_complete_tx`` after an ambiguous COMMIT of the same claims.

    A commit is all or nothing: when this re-run records something, the first commit did not
    land and its answers stand. When it records nothing, the first commit landed (or every
    claim was already reported): each DUPLICATE is this call's own success, answered RECORDED,
    and the dependents of those tasks now ``queued`` and due (or promoted but due later) are
    returned to be pushed (or scheduled) again.
    """
    outcomes, promoted = await _complete_tx(tx, claims, results, progress, trust_jobs=False)
    if ReportOutcome.RECORDED in outcomes:
        return outcomes, promoted
    landed = [
        claim.task.id
        for claim, outcome in zip(claims, outcomes, strict=True)
        if outcome is ReportOutcome.DUPLICATE
    ]
    if not landed:
        return outcomes, []
    now = await tx.now()
    edges = await tx.tasks.dependents_many(landed)
    children = await tx.tasks.get_many(list(dict.fromkeys(child for _, child in edges)))
    # due now: pushed again; promoted but due later (a delayed dependent): scheduled again
    queued = [
        c
        for c in children
        if c.status is TaskStatus.QUEUED and (c.scheduled_at <= now or c.due_later)
    ]
    recorded: list[ReportOutcome] = [
        ReportOutcome.RECORDED if outcome is ReportOutcome.DUPLICATE else outcome
        for outcome in outcomes
    ]
    return recorded, queued


def _failure_replayed(task: Task, run: TaskRun) -> _Followup:
    """The follow-up of a failure found recorded by its own replay: the retry, if still due."""
    if task.status is TaskStatus.QUEUED and task.attempt == run.attempt_number:
        return _Followup(ReportOutcome.RECORDED, schedule_at=task.scheduled_at)
    return _Followup(ReportOutcome.RECORDED)


def _hand_back_replayed(task: Task, run: TaskRun) -> _Followup:
    """The follow-up of a hand-back found recorded by its own replay: re-push if still queued."""
    if task.status is TaskStatus.QUEUED and task.attempt == run.attempt_number - 1:
        return _Followup(ReportOutcome.RECORDED, enqueue=(task,))
    return _Followup(ReportOutcome.RECORDED)


async def _load_run(tx: Transaction, claim: Claim) -> tuple[Task, TaskRun]:
    task = await tx.tasks.get(claim.task.id)
    run = await tx.runs.get(claim.run.id)
    if task is None or run is None:
        raise StaleRun(f"run {claim.run.id} of task {claim.task.id} no longer exists")
    return task, run
