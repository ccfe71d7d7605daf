"""A deadline that costs a timer only when the call waits (``application.aio.wait_by``, used by
the API's body guard and the Redis adapter's writes): a result already there costs no timer,
a call that has to wait is cut at the deadline, and a cancellation from outside reaches the
waiting coroutine."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dtq.application import aio

MESSAGE: Any = {"type": "http.request", "body": b"{}", "more_body": False}


async def test_a_message_already_there_is_returned_without_a_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_timer(when: float) -> Any:
        raise AssertionError("a timer was made")

    monkeypatch.setattr(asyncio, "timeout_at", no_timer)

    async def ready() -> Any:
        return MESSAGE

    deadline = asyncio.get_running_loop().time() + 5
    assert await aio.wait_by(deadline, ready()) is MESSAGE


async def test_a_message_that_arrives_in_time_is_returned() -> None:
    loop = asyncio.get_running_loop()
    arrived: asyncio.Future[Any] = loop.create_future()

    async def later() -> Any:
        await asyncio.sleep(0)  # a bare yield to the loop first
        return await arrived

    loop.call_later(0.05, arrived.set_result, MESSAGE)
    assert await aio.wait_by(loop.time() + 5, later()) is MESSAGE


async def test_a_message_that_does_not_arrive_by_the_deadline_is_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def never() -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    started = loop.time()
    with pytest.raises(TimeoutError):
        await aio.wait_by(started + 0.1, never())
    assert seen == ["cancelled"]
    assert 0.09 <= loop.time() - started < 2


async def test_a_cancellation_from_outside_reaches_the_receiving_coroutine() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    waiting = asyncio.Event()

    async def blocked() -> Any:
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = asyncio.create_task(aio.wait_by(loop.time() + 5, blocked()))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]


async def test_wait_within_counts_from_now_and_takes_any_awaitable() -> None:
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[Any] = loop.create_future()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await aio.wait_within(0.05, pending)  # a future, not a coroutine: under the timer
    assert loop.time() - started >= 0.04
    done: asyncio.Future[Any] = loop.create_future()
    done.set_result(MESSAGE)
    assert await aio.wait_within(5, done) is MESSAGE


async def test_an_error_of_the_receive_is_raised_as_is() -> None:
    async def broken() -> Any:
        raise OSError("gone")

    async def broken_later() -> Any:
        await asyncio.sleep(0)
        raise OSError("gone later")

    deadline = asyncio.get_running_loop().time() + 5
    with pytest.raises(OSError, match="gone"):
        await aio.wait_by(deadline, broken())
    with pytest.raises(OSError, match="gone later"):
        await aio.wait_by(deadline, broken_later())
