"""A store whose transactions wait at a gate: for tests of a caller cancelled mid-read."""

from __future__ import annotations

import asyncio
from typing import Any


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
