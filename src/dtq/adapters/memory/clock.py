"""A fake ``Clock`` tests move by hand (the host clock is ``dtq.adapters.clock.SystemClock``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class FakeClock:
    """A clock that only moves when told to. Implements ``Clock``.

    ``sleep`` advances the clock by the requested seconds and yields once to the event loop, so
    code that paces itself with the clock runs instantly in tests.

    Args:
        start: initial time (aware UTC); defaults to 2026-01-01T00:00:00Z.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        """The fake current time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (may be fractional; must be >= 0)."""
        if seconds < 0:
            raise ValueError("a clock does not run backwards")
        self._now += timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        """Advance by ``seconds`` and yield to the event loop once."""
        self.advance(max(seconds, 0.0))
        await asyncio.sleep(0)
