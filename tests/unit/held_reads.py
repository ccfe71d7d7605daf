"""A store whose transactions wait at a gate: for tests of a caller cancelled mid-read."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest


class HeldReads:
    """The app's store; each ``run`` waits at ``gate`` first and records how it ended."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.ended: list[str] = []

    async def run(self, fn: Any) -> Any:
        self.started.set()
        try:
            await self.gate.wait()
            result = await self.inner.run(fn)
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise
        self.ended.append("finished")
        return result


async def cancel_mid_read(store: HeldReads, call: Awaitable[Any]) -> None:
    """Start ``call``, cancel it while its read waits at the gate (it raises CancelledError at
    once), then open the gate and let the loop run: ``store.ended`` says how the read ended."""
    reading = asyncio.ensure_future(call)
    await store.started.wait()
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    store.gate.set()
    for _ in range(20):
        await asyncio.sleep(0)
