"""The lease renewal loop: keep every held claim's lease alive, or stop its handler (spec §6);
each tick also stores the handlers' changed progress values (issue 13 item 5)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dtq.application.ports import LeaseState
from dtq.entrypoints.worker.claims import (
    LEASE_LOST,
    LEASE_UNCONFIRMED,
    TASK_CANCELLED,
    Held,
    Phase,
    Shared,
)

_RENEWALS_PER_CALL = 256  # leases extended by one heartbeat_many call (one Redis script)


class Leases:
    """Renews the leases of the claims it holds, every ``every`` seconds.

    A claim is held from :meth:`hold` to :meth:`release`. A renewal answering LOST (another run
    owns the task), and a claim with no successful renewal within ``window`` seconds (its lease
    can no longer be shown to be ours, e.g. Redis unreachable), are released and passed to
    ``on_lost(held, reason)`` with ``LEASE_LOST`` or ``LEASE_UNCONFIRMED``; a renewal answering
    CANCELLED (the task was cancelled, issue 14 item 1) likewise, with ``TASK_CANCELLED``, and
    is not counted as a lease loss. Build it inside the running event loop (it reads that
    loop's clock).

    Each tick also writes the progress of the running claims whose latest ``task.progress``
    value differs from the one last written, all in one ``execution.record_progress`` call (one
    statement), alongside the lease extensions; a tick with nothing new writes nothing. A
    failed write is logged and tried again on the next tick with the then-latest values.

    Args:
        shared: ``every`` is ``config.lease_renew_every``, ``window`` is
            ``config.lease_duration``; ``execution.heartbeat_many`` extends the leases.
        on_lost: told about each claim whose lease is no longer ours.
    """

    def __init__(self, shared: Shared, *, on_lost: Callable[[Held, str], None]) -> None:
        self._execution = shared.execution
        self._every = shared.config.lease_renew_every
        self._window = shared.config.lease_duration
        self._on_lost = on_lost
        self._meters = shared.meters
        self._log = shared.log
        self._confirmed: dict[Held, float] = {}  # held claim -> loop time its lease was ours
        self._time = asyncio.get_running_loop().time

    def hold(self, held: Held) -> None:
        """Renew ``held``'s lease from now on (its claim just wrote it)."""
        self._confirmed[held] = self._time()

    def release(self, held: Held) -> None:
        """Stop renewing ``held``'s lease; no-op when not held."""
        self._confirmed.pop(held, None)

    def holds(self, held: Held) -> bool:
        """True while ``held``'s lease is renewed."""
        return held in self._confirmed

    @property
    def held(self) -> list[Held]:
        """The claims held now."""
        return list(self._confirmed)

    async def loop(self) -> None:
        """Renew every ``every`` seconds; a pass that overran a period does not burst."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self._every
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            if loop.time() - next_at > self._every:
                next_at = loop.time()
            await self._renew_all()

    async def _renew_all(self) -> None:
        held = list(self._confirmed)
        await asyncio.gather(self._write_progress(held), self._extend_all(held))

    async def _write_progress(self, held: list[Held]) -> None:
        """Store the changed progress of the running claims among ``held`` (one statement)."""
        sent = [
            (h, reported)
            for h in held
            if h.phase is Phase.RUNNING and (reported := h.unwritten_progress) is not None
        ]
        if not sent:
            return
        try:
            await self._execution.record_progress([(h.claim, r.value) for h, r in sent])
        except Exception as exc:  # logged and retried next tick; never ends the renewal loop
            self._log.warning(
                "progress write failed", tasks=len(sent), error=f"{type(exc).__name__}: {exc}"
            )
            return
        for h, reported in sent:  # a stale run's value is dropped too: its lease says LOST
            h.progress_written = reported

    async def _extend_all(self, held: list[Held]) -> None:
        """One ``heartbeat_many`` per ``_RENEWALS_PER_CALL`` held claims, each call sent only
        for the claims still held when it is sent (a success committed since the tick began
        has no lease left to renew, and looking it up would cost a store read)."""
        loop = asyncio.get_running_loop()
        failed = 0
        last: BaseException | None = None
        for i in range(0, len(held), _RENEWALS_PER_CALL):
            chunk = [h for h in held[i : i + _RENEWALS_PER_CALL] if h in self._confirmed]
            if not chunk:
                continue
            try:
                states = await self._execution.heartbeat_many([h.claim for h in chunk])
            except Exception as exc:  # BackendUnavailable, or a bug: never ends the loop
                now = loop.time()
                failed += len(chunk)
                last = exc
                for h in chunk:
                    self._unconfirmed(h, now)
                continue
            now = loop.time()
            for h, state in zip(chunk, states, strict=True):
                self._renewed(h, state, now)
        if failed:
            self._log.warning(
                "lease heartbeat failed",
                failed=failed,
                held=len(held),
                error=f"{type(last).__name__}: {last}",
            )

    def _renewed(self, held: Held, state: LeaseState, now: float) -> None:
        if held not in self._confirmed:
            return  # settled while the renewal was in flight
        if state is LeaseState.EXTENDED:
            self._confirmed[held] = now
            self._meters.kind(held.claim.task.kind).extensions.inc()
        elif state is LeaseState.LOST:
            self._lost(held, LEASE_LOST)
        elif state is LeaseState.CANCELLED:
            self._lost(held, TASK_CANCELLED)
        else:
            self._log.warning("lease heartbeat found no lease", state=str(state), **held.fields)

    def _unconfirmed(self, held: Held, now: float) -> None:
        confirmed = self._confirmed.get(held)
        if confirmed is not None and now - confirmed >= self._window:
            self._lost(held, LEASE_UNCONFIRMED)

    def _lost(self, held: Held, reason: str) -> None:
        if held.phase is Phase.COMMITTING:
            # Its complete_many is in flight: the fence there decides (STALE); the mark ends
            # that report's retries once its bounded tries are spent.
            held.interrupted = held.interrupted or reason
            return
        if reason != TASK_CANCELLED:
            self._meters.metrics.lease_losses.labels(kind=held.claim.task.kind).inc()
        self._confirmed.pop(held, None)
        self._on_lost(held, reason)
