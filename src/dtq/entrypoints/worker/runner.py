"""One handler call: the ``Task`` it receives, its deadline, its thread, its log context (§6)."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import structlog

from dtq.application.commands import Claim
from dtq.worker import Handler, Task


class HandlerTimeout(Exception):
    """The handler outlived ``Options.default_timeout`` (a failure, retried by policy)."""


class HandlerRunner:
    """Calls handlers: ``async def`` ones on the event loop, plain ``def`` ones in a bounded
    thread pool (a thread cannot be killed: past its deadline it is abandoned, not stopped).

    Args:
        handlers: kind -> handler, fixed for the run.
        default_timeout: seconds one call may take, or None for no deadline.
        sync_threads: size of the thread pool for plain handlers.
    """

    def __init__(
        self, handlers: Mapping[str, Handler], *, default_timeout: float | None, sync_threads: int
    ) -> None:
        self._async = {kind: _is_async(h) for kind, h in handlers.items()}
        self._timeout = default_timeout
        self._pool = ThreadPoolExecutor(sync_threads, thread_name_prefix="dtq-handler")

    async def invoke(self, handler: Handler, claim: Claim) -> None:
        """Call ``handler`` for ``claim`` under the task's log context and deadline.

        The context variables are bound in the calling asyncio task (whose context is a copy
        made for this claim), so they need no reset and never leak into another loop.

        Raises:
            HandlerTimeout: the deadline passed (the handler was cancelled or abandoned).
            Exception: whatever the handler raised.
        """
        task = Task(
            id=claim.task.id,
            job_id=claim.task.job_id,
            kind=claim.task.kind,
            payload=claim.task.payload,
            attempt=claim.run.attempt_number,
        )
        structlog.contextvars.bind_contextvars(
            task_id=str(task.id), job_id=str(task.job_id), kind=task.kind, attempt=task.attempt
        )
        timeout = self._timeout
        if timeout is None:
            await self._call(handler, task)
            return
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                await self._call(handler, task)
        except TimeoutError:
            if deadline.expired():
                raise HandlerTimeout(f"timed out after {timeout:g} s") from None
            raise

    async def _call(self, handler: Handler, task: Task) -> None:
        if self._async[task.kind]:
            result: object = handler(task)
        else:
            ctx = contextvars.copy_context()
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._pool, partial(ctx.run, handler, task))
        if inspect.isawaitable(result):
            await result

    def close(self) -> None:
        """Release the thread pool without waiting for plain handlers still running."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _is_async(handler: Handler) -> bool:
    """True for ``async def`` functions (also behind ``functools.partial`` or ``__call__``)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - we look for an async __call__
    )
