"""One handler call: the ``Task`` it receives, its deadline, its thread, its log context (§6)."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any
from uuid import UUID

import structlog

from dtq.application.commands import Claim
from dtq.domain.errors import InvalidPayload
from dtq.domain.payload import check_result
from dtq.worker import Artifacts, Handler, PermanentError, Task


class HandlerTimeout(Exception):
    """The handler outlived its timeout (the task's, its kind's or ``Options.default_timeout``;
    a failure, retried by policy)."""


class UnstorableResult(PermanentError):
    """The handler returned a value that cannot be stored as its result (not JSON, NUL,
    non-finite number, too deep, or over ``API_MAX_RESULT_BYTES``): the run fails for good."""


class HandlerRunner:
    """Calls handlers: ``async def`` ones on the event loop, plain ``def`` ones in a bounded
    thread pool (a thread cannot be killed: past its deadline it is abandoned, not stopped).

    Args:
        handlers: kind -> handler, fixed for the run.
        default_timeout: seconds one call may take, or None for no deadline.
        kind_timeouts: kind -> seconds, winning over ``default_timeout`` for that kind (from
            ``Runtime.register(kind, fn, timeout=...)``); a task's own ``timeout`` (submit,
            issue 14 item 3) wins over both.
        sync_threads: size of the thread pool for plain handlers.
        max_result_bytes: largest JSON-encoded return value accepted as the task's result.
        artifacts: what every task gets as ``task.artifacts``; None leaves Task's default.
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        default_timeout: float | None,
        sync_threads: int,
        kind_timeouts: Mapping[str, float] | None = None,
        max_result_bytes: int = 1024 * 1024,
        artifacts: Artifacts | None = None,
    ) -> None:
        self._artifacts = artifacts
        self._async = {kind: _is_async(h) for kind, h in handlers.items()}
        self._timeout = default_timeout
        self._kind_timeouts = dict(kind_timeouts or {})
        self._max_result_bytes = max_result_bytes
        self._pool = ThreadPoolExecutor(sync_threads, thread_name_prefix="dtq-handler")
        # the log context's job_id text of the last job seen: a batch's tasks mostly share a job
        self._job_text: tuple[UUID | None, str] = (None, "")

    async def invoke(
        self,
        handler: Handler,
        claim: Claim,
        report_progress: Callable[[Any], None] | None = None,
    ) -> Any:
        """Call ``handler`` for ``claim`` under the task's log context and deadline.

        The context variables are bound in the calling asyncio task (whose context is a copy
        made for this claim), so they need no reset and never leak into another loop. The task
        carries ``claim.parents`` (its dependencies' results) as ``Task.parents``, the task's
        stored progress as ``Task.checkpoint``, and hands ``task.progress(value)`` calls (values
        already checked) to ``report_progress``.

        Returns:
            The handler's return value, checked storable (``domain.payload.check_result``).

        Raises:
            HandlerTimeout: the deadline passed (the handler was cancelled or abandoned).
            UnstorableResult: the return value cannot be stored as the task's result.
            Exception: whatever the handler raised.
        """
        task = Task(
            id=claim.task.id,
            job_id=claim.task.job_id,
            kind=claim.task.kind,
            payload=claim.task.payload,
            attempt=claim.run.attempt_number,
            parents=claim.parents,
            checkpoint=claim.task.progress,
            _report=report_progress,
            **({} if self._artifacts is None else {"artifacts": self._artifacts}),
        )
        job_id, job_text = self._job_text
        if job_id != task.job_id:
            job_text = str(task.job_id)
            self._job_text = (task.job_id, job_text)
        structlog.contextvars.bind_contextvars(
            task_id=str(task.id), job_id=job_text, kind=task.kind, attempt=task.attempt
        )
        timeout = self.timeout_for(claim)
        if timeout is None:
            return self._checked(await self._call(handler, task))
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                result = await self._call(handler, task)
        except TimeoutError:
            if deadline.expired():
                raise HandlerTimeout(f"timed out after {timeout:g} s") from None
            raise
        return self._checked(result)

    def timeout_for(self, claim: Claim) -> float | None:
        """Seconds the handler call for ``claim`` may take: the task's own ``timeout``, else
        its kind's, else ``default_timeout``; None for no deadline."""
        if claim.task.timeout is not None:
            return claim.task.timeout.total_seconds()
        return self._kind_timeouts.get(claim.task.kind, self._timeout)

    def _checked(self, result: Any) -> Any:
        if result is None:
            return None
        try:
            check_result(result, max_bytes=self._max_result_bytes)
        except InvalidPayload as exc:
            raise UnstorableResult(exc.detail) from None
        return result

    async def _call(self, handler: Handler, task: Task) -> Any:
        if self._async[task.kind]:
            result: Any = handler(task)
        else:
            ctx = contextvars.copy_context()
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._pool, partial(ctx.run, handler, task))
        if inspect.isawaitable(result):
            result = await result
        return result

    def close(self) -> None:
        """Release the thread pool without waiting for plain handlers still running."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _is_async(handler: Handler) -> bool:
    """True for ``async def`` functions (also behind ``functools.partial`` or ``__call__``)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - we look for an async __call__
    )
