"""Bulk cancel and retry of the tasks a filter selects (issue 14 item 6).

A bulk operation walks the listing's order (newest first, keyset ``(created_at, position, id)``;
:mod:`dtq.application.filters`) in pages of ``batch_size`` matching ids, one short read per
page, and hands each page to the batch form of :class:`~dtq.application.control.ControlService`
(one transaction per page, each task fenced on its own). The keyset columns never change after
submit, so a task whose status changes while the walk runs is neither revisited nor skipped
over: a page is cut strictly after the last key of the previous one, whatever the statuses
became (a task retried out of ``failed`` lies behind the cursor and is not retried twice). What
a page's transaction finds changed since the read (completed meanwhile, already cancelled, no
longer failed) is skipped and counted.

A real (not dry) run is a background operation (:meth:`BulkService.start`): measured on
PostgreSQL, 100,000 tasks take tens of seconds to cancel and minutes to retry, longer than a
request should wait. Its progress is an :class:`Operation` held by the service in the
orchestrator process that accepted it (ARCHITECTURE "Bulk operations (issue 14 item 6)").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from uuid import UUID, uuid4

from dtq.application.control import DEFAULT_BATCH_SIZE, BatchOutcome, ControlService
from dtq.application.filters import MAX_LIST_LIMIT, TaskFilter, TaskKeyset
from dtq.application.ports import Clock, Store, Transaction
from dtq.domain.errors import DtqError, OperationNotFound, TooManyOperations, ValidationError

logger = logging.getLogger("dtq.bulk")

#: Bulk operations one process runs at once: each holds one pool connection at a time, so a
#: burst of them cannot starve the API and the workers of connections.
DEFAULT_MAX_RUNNING = 4
#: Finished operations kept for ``GET /v1/operations/{id}``; the oldest are forgotten first.
DEFAULT_KEEP_FINISHED = 1000


class BulkAction(StrEnum):
    """What a bulk operation does to each matching task."""

    CANCEL = "cancel"  # ControlService.cancel_tasks: pending/queued/running -> cancelled
    RETRY = "retry"  # ControlService.retry_tasks: failed/cancelled -> queued (or pending)


@dataclass(frozen=True, slots=True)
class BulkOutcome:
    """What a bulk operation did.

    Attributes:
        matched: tasks the filter selected when their page was read.
        changed: tasks of those the operation changed (0 for a dry run).
        skipped: matched tasks left as they were, judged in their own transaction: in a status
            the action does not apply to (already cancelled, completed, not failed), changed
            meanwhile, or (retry) blocked by a failed or cancelled dependency at their turn.
            ``matched == changed + skipped`` except for a dry run (both 0).
        cascaded: other tasks changed with them: pending dependents cancelled, or failed and
            cancelled dependents reopened (they may also be matched later in the walk, then
            counted as skipped or changed there).
        dry_run: True when nothing was written (only ``matched`` counts).
    """

    matched: int = 0
    changed: int = 0
    skipped: int = 0
    cascaded: int = 0
    dry_run: bool = False


class OperationStatus(StrEnum):
    """Where a background bulk operation is."""

    RUNNING = "running"  # pages are being read and changed
    SUCCEEDED = "succeeded"  # every page was done
    FAILED = "failed"  # stopped at an error (``error``); the pages done before it stay done


@dataclass(frozen=True, slots=True)
class Operation:
    """A background bulk operation and its progress (``GET /v1/operations/{id}``).

    Attributes:
        id: the operation's id.
        kind: the action (``cancel`` or ``retry``).
        status: running, succeeded or failed.
        matched, changed, skipped, cascaded: the counts of :class:`BulkOutcome` so far (after
            each page).
        error: why it failed (a message safe to show a client), else None.
        created_at: when it was accepted (host clock, aware).
        finished_at: when it ended, else None.
    """

    id: UUID
    kind: BulkAction
    status: OperationStatus
    created_at: datetime
    matched: int = 0
    changed: int = 0
    skipped: int = 0
    cascaded: int = 0
    error: str | None = None
    finished_at: datetime | None = None


def require_criterion(where: TaskFilter) -> None:
    """Refuse a filter with no criterion: a bulk operation never selects every task by default.

    Raises:
        ValidationError: field ``body``.
    """
    if not (
        where.statuses
        or where.kind is not None
        or where.job_id is not None
        or where.priority is not None
        or where.since is not None
        or where.until is not None
    ):
        raise ValidationError(
            "give at least one filter: status, kind, job_id, priority, since or until",
            field="body",
        )


class BulkService:
    """Bulk cancel and retry by filter.

    Args:
        store: the system of record (the keyset pages are read from it).
        control: the batch forms that change the tasks.
        clock: stamps the operations' ``created_at``/``finished_at``.
        batch_size: matching ids per page, and so per transaction (``1..MAX_LIST_LIMIT``).
        keep_finished: finished operations remembered (>= 1), the oldest forgotten first.
        max_running: background operations running at once (>= 1); one more is refused.

    One instance per process: it holds the background operations it started (a singleton of
    the container); :meth:`aclose` stops them at shutdown.
    """

    def __init__(
        self,
        *,
        store: Store,
        control: ControlService,
        clock: Clock,
        batch_size: int = DEFAULT_BATCH_SIZE,
        keep_finished: int = DEFAULT_KEEP_FINISHED,
        max_running: int = DEFAULT_MAX_RUNNING,
    ) -> None:
        if not 1 <= batch_size <= MAX_LIST_LIMIT:
            raise ValueError(f"batch_size must be in 1..{MAX_LIST_LIMIT}")
        if keep_finished < 1 or max_running < 1:
            raise ValueError("keep_finished and max_running must be at least 1")
        self._store = store
        self._control = control
        self._clock = clock
        self._batch_size = batch_size
        self._keep_finished = keep_finished
        self._max_running = max_running
        self._operations: OrderedDict[UUID, Operation] = OrderedDict()
        self._running: dict[UUID, asyncio.Task[None]] = {}

    async def start(self, action: BulkAction, where: TaskFilter) -> Operation:
        """Accept a bulk operation and run it in the background (``POST /v1/tasks/cancel|retry``
        without ``dry_run``): the returned :class:`Operation` is ``running`` with zero counts;
        :meth:`get` follows it.

        Raises:
            ValidationError: ``where`` has no criterion (field ``body``), checked before
                anything starts.
            TooManyOperations: ``max_running`` operations are running already.
        """
        require_criterion(where)
        if len(self._running) >= self._max_running:
            raise TooManyOperations(
                f"{len(self._running)} bulk operations are running; wait for one to end"
            )
        op = Operation(
            id=uuid4(), kind=action, status=OperationStatus.RUNNING, created_at=self._clock.now()
        )
        self._operations[op.id] = op
        self._running[op.id] = asyncio.create_task(
            self._background(op.id, action, where), name=f"dtq-bulk-{op.id}"
        )
        return op

    async def get(self, operation_id: UUID) -> Operation:
        """The operation's progress now (``GET /v1/operations/{id}``).

        Raises:
            OperationNotFound: not started by this process, or forgotten (field ``id``).
        """
        op = self._operations.get(operation_id)
        if op is None:
            raise OperationNotFound(f"operation {operation_id} not found", field="id")
        return op

    async def wait(self, operation_id: UUID) -> Operation:
        """Wait until the operation has ended and return it (tests, shutdown).

        Raises:
            OperationNotFound: as :meth:`get`.
        """
        task = self._running.get(operation_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        return await self.get(operation_id)

    async def aclose(self) -> None:
        """Stop the running operations (process shutdown); each ends ``failed`` with the error
        "stopped at shutdown", the pages done before it staying done."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _background(self, op_id: UUID, action: BulkAction, where: TaskFilter) -> None:
        def progress(done: BulkOutcome) -> None:
            self._operations[op_id] = replace(
                self._operations[op_id],
                matched=done.matched,
                changed=done.changed,
                skipped=done.skipped,
                cascaded=done.cascaded,
            )

        status, error = OperationStatus.SUCCEEDED, None
        try:
            await self.run(action, where, on_page=progress)
        except DtqError as exc:
            status, error = OperationStatus.FAILED, exc.detail
        except asyncio.CancelledError:
            status, error = OperationStatus.FAILED, "stopped at shutdown"
            raise
        except Exception:  # a bug: keep the process, record the operation as failed
            logger.exception("bulk operation %s failed", op_id)
            status, error = OperationStatus.FAILED, "internal error (see the orchestrator log)"
        finally:
            self._operations[op_id] = replace(
                self._operations[op_id],
                status=status,
                error=error,
                finished_at=self._clock.now(),
            )
            self._running.pop(op_id, None)
            self._forget_old()

    def _forget_old(self) -> None:
        finished = [k for k, op in self._operations.items() if k not in self._running]
        for key in finished[: max(0, len(finished) - self._keep_finished)]:
            del self._operations[key]

    async def run(
        self,
        action: BulkAction,
        where: TaskFilter,
        *,
        dry_run: bool = False,
        on_page: Callable[[BulkOutcome], None] | None = None,
    ) -> BulkOutcome:
        """Apply ``action`` to every task matching ``where`` (``POST /v1/tasks/cancel|retry``).

        Pages of ``batch_size`` ids are read and changed one after the other: no transaction
        spans more than one page, and the Redis side of each page follows its commit. A dry run
        reads the pages and changes nothing. ``on_page`` is called with the counts so far after
        each page.

        Returns:
            The counts of :class:`BulkOutcome`.

        Raises:
            ValidationError: ``where`` has no criterion (field ``body``).
            BackendUnavailable: the database failed; the pages already done stay done (the
                operation can be repeated: what it changed no longer matches, or is skipped).
        """
        require_criterion(where)
        matched = changed = skipped = cascaded = 0
        after: TaskKeyset | None = None
        while True:
            keys = await self._store.run(functools.partial(self._page, where=where, after=after))
            if not keys:
                break
            after = keys[-1]
            matched += len(keys)
            if not dry_run:
                outcome = await self._apply(action, keys)
                changed += len(outcome.changed)
                skipped += len(outcome.skipped)
                cascaded += outcome.cascaded
            if on_page is not None:
                on_page(BulkOutcome(matched, changed, skipped, cascaded, dry_run))
            if len(keys) < self._batch_size:
                break
        return BulkOutcome(matched, changed, skipped, cascaded, dry_run)

    async def _page(
        self, tx: Transaction, *, where: TaskFilter, after: TaskKeyset | None
    ) -> list[TaskKeyset]:
        return await tx.tasks.matching_task_ids(where, after=after, limit=self._batch_size)

    async def _apply(self, action: BulkAction, keys: list[TaskKeyset]) -> BatchOutcome:
        # Oldest first inside a page: when a job lists dependencies before their dependents
        # (the usual order), a retried dependency reopens its dependents before their turn.
        ids = [key[2] for key in reversed(keys)]
        if action is BulkAction.CANCEL:
            return await self._control.cancel_tasks(ids)
        return await self._control.retry_tasks(ids)
