"""The host clock: the production ``Clock`` (application/ports.py), wired by the container.

It lives outside ``adapters/memory/`` because it is not a fake; ``FakeClock`` stays there.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime


class SystemClock:
    """The host's clock (aware UTC) and real ``asyncio.sleep``. Implements ``Clock``."""

    def now(self) -> datetime:
        """Current time, aware UTC."""
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of real time."""
        await asyncio.sleep(seconds)
