"""asyncio helpers shared by the layers above (the Redis adapter's writes, the API's request
bodies): a deadline that costs a timer only when the awaited call has to wait."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_by(deadline: float, awaitable: Awaitable[T]) -> T:
    """``await awaitable``, cut at ``deadline`` (seconds on the running loop's clock) if it has
    to wait.

    A coroutine is stepped once first: one that finishes without suspending (a buffered
    request body, a socket write that does not fill the buffer) costs no timer, which
    ``asyncio.timeout_at`` would (benchmarks/PROFILE.md, twenty-first pass). One that
    suspends goes on under ``asyncio.timeout_at(deadline)``, which cancels it at the deadline
    exactly as if it had been awaited there from the start. Any other awaitable is awaited
    under the timer.

    Raises:
        TimeoutError: ``deadline`` passed while waiting.
    """
    if not isinstance(awaitable, Coroutine):
        async with asyncio.timeout_at(deadline):
            return await awaitable
    try:
        waiting_on = awaitable.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    async with asyncio.timeout_at(deadline):
        return await _resumed(awaitable, waiting_on)


async def wait_within(seconds: float, awaitable: Awaitable[T]) -> T:
    """:func:`wait_by` with a deadline ``seconds`` from now.

    Raises:
        TimeoutError: the time passed while waiting.
    """
    return await wait_by(asyncio.get_running_loop().time() + seconds, awaitable)


@types.coroutine
def _resumed(coroutine: Coroutine[Any, Any, T], waiting_on: Any) -> Generator[Any, Any, T]:
    """Go on with ``coroutine``, stepped once and now waiting on ``waiting_on``: what the task
    sends or throws in (a cancellation included) goes to it, what it yields goes to the task."""
    while True:
        try:
            sent = yield waiting_on
        except GeneratorExit:
            coroutine.close()
            raise
        except BaseException as exc:  # a cancellation (the deadline's) is the coroutine's to see
            try:
                waiting_on = coroutine.throw(exc)
            except StopIteration as done:
                result: T = done.value
                return result
        else:
            try:
                waiting_on = coroutine.send(sent)
            except StopIteration as done:
                result = done.value
                return result
