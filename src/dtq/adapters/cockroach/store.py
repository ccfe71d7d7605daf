"""``CockroachStore``: the ``Store`` port on CockroachDB / PostgreSQL via psycopg 3 (DESIGN §3-4).

The unit of retry is the whole transaction function. Each try takes a fresh pool connection,
opens a transaction inside the try, runs ``fn`` and commits; then, by what failed and *when*
(CRDB.md "Transactions and retries"):

=============================================  ============================================
failure                                        outcome
=============================================  ============================================
SQLSTATE 40001 / 40P01, before or at COMMIT    re-run ``fn`` (jittered exponential backoff)
``ConcurrentUpdate`` raised by ``fn``          re-run ``fn``
connection lost before COMMIT was sent         re-run ``fn``
connection lost during COMMIT, or 40003        ``CommitOutcomeUnknown`` (never re-run)
retries exhausted                              ``BackendUnavailable``
data the database refuses (SQLSTATE class 22)  ``InvalidPayload``
any other psycopg error                        ``BackendUnavailable``
domain errors raised by ``fn``                 propagate unchanged (rolled back)
=============================================  ============================================

A lost connection also makes the store test the pool's idle connections (``pool.check()``)
before the re-run: after a database restart all of them are dead at once. The pool itself, with
its bounded waits, lives in :mod:`dtq.adapters.cockroach.pool`.

BEGIN and COMMIT cost no round trip of their own: ``BEGIN`` and ``SELECT now()`` (the try's
clock) go with ``fn``'s first statement, and the outbox insert with ``COMMIT``, after any
single-row insert still queued (``txconn.TryConnection``, ``PgTransaction.commit``). A failed
try is rolled back with an explicit ``ROLLBACK``, which keeps the connection's prepared
statements (``pool.StoreConnection``).

"COMMIT phase" is real: a flag is set after ``fn`` returns, just before the last request (the
queued inserts, the outbox insert and COMMIT) is sent; any error seen with the flag set happened
while committing (an error of an insert included: they are one request with the COMMIT, so a
connection lost during it leaves the outcome unknown). A :class:`CommitHook` passed to the
store is called at both edges of that phase, so tests can inject failures there (CRDB.md
"Making PostgreSQL catch CockroachDB bugs").
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from dtq.adapters.cockroach import sql, txconn
from dtq.adapters.cockroach.errors import CONNECTION_LOST, Verdict, classify, connection_lost
from dtq.adapters.cockroach.pool import Pool, open_pool
from dtq.adapters.cockroach.repositories import PgTransaction
from dtq.application.ports import Transaction
from dtq.domain.errors import (
    BackendUnavailable,
    CommitOutcomeUnknown,
    ConcurrentUpdate,
    InvalidPayload,
)

T = TypeVar("T")

__all__ = ["CONCURRENT_UPDATE", "CockroachStore", "CommitHook", "Pool", "open_pool"]

#: Reason passed to ``on_retry`` when ``fn`` raised ``ConcurrentUpdate``.
CONCURRENT_UPDATE = "concurrent_update"
#: Re-run reason: the server no longer had a statement prepared by ``txconn.ClientStatements``.
PREPARED_LOST = "prepared_lost"
#: Re-run reason: the database refused the try's estimated timestamp (``txconn.ClockAnchor``).
ESTIMATE_REFUSED = "estimate_refused"


class CommitHook(Protocol):
    """Called around COMMIT on every try; an exception it raises is handled as the database's.

    For fault injection in tests: production passes none.
    """

    def at_commit(self) -> None:
        """After ``fn`` returned, before COMMIT is sent: raising rolls the try back and is
        handled as an error of COMMIT (a psycopg error here is classified like one at COMMIT)."""
        ...

    def after_commit(self) -> None:
        """After COMMIT succeeded: raising simulates a lost acknowledgement (the write is
        applied; the caller cannot know)."""
        ...


class _RetryableFailure(Exception):
    """Internal: one try failed in a way that allows re-running the function."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CockroachStore:
    """The system of record on a psycopg async pool. Implements ``Store``.

    Args:
        pool: an open pool of autocommit connections (see ``open_pool``).
        max_retries: how many times a function is re-run after its first try before
            ``BackendUnavailable`` is raised (so at most ``max_retries + 1`` tries).
        base_backoff: seconds before the first re-run; doubles each time, capped at
            ``max_backoff``, with full jitter (a uniform draw in ``[0, delay]``).
        max_backoff: upper bound of one backoff delay, in seconds.
        on_retry: metric hook called once per re-run with the reason: the SQLSTATE
            (``"40001"``, ``"40P01"``), ``"concurrent_update"``, ``"prepared_lost"``,
            ``"estimate_refused"`` or ``"connection_lost"``.
        commit_hook: called around each COMMIT (:class:`CommitHook`); None in production.

    Attributes:
        retries: total re-runs since the store was built (all functions, all reasons).
    """

    def __init__(
        self,
        pool: Pool,
        *,
        max_retries: int = 12,
        base_backoff: float = 0.005,
        max_backoff: float = 0.5,
        on_retry: Callable[[str], None] | None = None,
        commit_hook: CommitHook | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self._pool = pool
        self._max_retries = max_retries
        self._base_backoff = base_backoff
        self._max_backoff = max_backoff
        self._on_retry = on_retry
        self.retries = 0
        self._pool_check: asyncio.Task[None] | None = None
        self._commit_hook = commit_hook

    async def run(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        """Run ``fn`` in one transaction and commit; re-run it on retryable conflicts.

        Args:
            fn: the transaction function; it receives a fresh ``Transaction`` on every try
                and must have no side effects outside the database.

        Returns:
            What ``fn`` returned on the try that committed.

        Raises:
            CommitOutcomeUnknown: the connection was lost during COMMIT, or SQLSTATE 40003.
            InvalidPayload: the database refused a value (SQLSTATE class 22).
            BackendUnavailable: any other database failure, or ``max_retries`` re-runs were
                not enough.
            DtqError: whatever ``fn`` raised, other than ``ConcurrentUpdate``.
        """
        tries = 0
        while True:
            tries += 1
            try:
                return await self._try_once(fn)
            except _RetryableFailure as failure:
                if tries > self._max_retries:
                    raise BackendUnavailable(
                        f"transaction not committed after {tries} tries ({failure.reason})"
                    ) from failure.__cause__
                self.retries += 1
                if self._on_retry is not None:
                    self._on_retry(failure.reason)
                if failure.reason == CONNECTION_LOST:
                    self._drop_broken_connections()
                await asyncio.sleep(self._backoff(tries))

    def _backoff(self, tries: int) -> float:
        """Full-jitter exponential backoff in seconds after try number ``tries`` (1-based)."""
        delay = min(self._max_backoff, self._base_backoff * 2 ** (tries - 1))
        return random.uniform(0.0, delay)

    async def _try_once(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        committing = False
        conn: AsyncConnection[TupleRow] | None = None
        tx: PgTransaction | None = None
        pool = self._pool
        try:
            # getconn/putconn rather than pool.connection(), whose ``async with conn`` ends
            # with a COMMIT call that has nothing to do here: the try sends its own BEGIN and
            # COMMIT, rolls back on any error, and putconn resets a connection returned in a
            # transaction (benchmarks/PROFILE.md, eleventh pass).
            conn = await pool.getconn()
            try:
                await txconn.prepare_noted(conn)  # what earlier tries bound as text
                tx = PgTransaction(conn)
                try:
                    tx.begin()  # sent with the first statement
                    result = await fn(tx)
                    committing = True  # the outbox insert and COMMIT go together now
                    if self._commit_hook is not None:
                        self._commit_hook.at_commit()
                    await tx.commit()
                except BaseException:
                    await _roll_back(conn)
                    raise
                if self._commit_hook is not None:
                    self._commit_hook.after_commit()
            finally:
                await pool.putconn(conn)
            return result
        except ConcurrentUpdate as exc:
            raise _RetryableFailure(CONCURRENT_UPDATE) from exc
        except txconn.EstimateRefused as exc:  # re-run on the clock the try reads
            raise _RetryableFailure(ESTIMATE_REFUSED) from exc
        except psycopg.Error as exc:
            if txconn.prepared_failed(exc, tx is not None and tx.conn.by_name):
                # the failing request stopped at that statement, before any COMMIT
                txconn.forget_prepared(conn, exc)
                raise _RetryableFailure(PREPARED_LOST) from exc
            verdict, reason = classify(exc, conn, committing=committing)
            if verdict is Verdict.RETRY:
                raise _RetryableFailure(reason) from exc
            if verdict is Verdict.UNKNOWN:
                if reason == CONNECTION_LOST:
                    self._drop_broken_connections()  # the others may have died with it
                raise CommitOutcomeUnknown(
                    f"COMMIT outcome unknown ({reason}); re-read before acting again"
                ) from exc
            if isinstance(exc, psycopg.DataError):
                raise InvalidPayload(f"the database refused a value: {_described(exc)}") from exc
            raise BackendUnavailable(f"database error ({reason}): {_described(exc)}") from exc

    def _drop_broken_connections(self) -> None:
        """After a lost connection, have the pool test its idle connections in the background.

        After a database restart every pooled connection is dead at once; ``pool.check()`` takes
        them all out of the pool at its start, so the next try waits for a tested or a new one
        (bounded by the acquire timeout) instead of drawing another dead one. It runs as a task,
        one at a time, and is never cancelled: a cancelled check would lose the connections it
        holds.
        """
        if self._pool_check is None or self._pool_check.done():
            self._pool_check = asyncio.create_task(self._check_pool())

    async def _check_pool(self) -> None:
        # The pool logs and replaces what fails the check; nothing to add here.
        with contextlib.suppress(psycopg.Error):
            await self._pool.check()

    async def ping(self) -> None:
        """Round-trip ``SELECT 1`` on a pool connection.

        A connection that turns out dead (the database restarted since it was opened) is
        dropped and the ping tried once more on a fresh one, so a ping after an outage reports
        the database as it is now. A caller that needs an answer sooner than the pool's acquire
        timeout bounds the call itself (``HealthService`` does).

        Raises:
            BackendUnavailable: no connection could be had, or the query failed.
        """
        for last_try in (False, True):
            conn: AsyncConnection[TupleRow] | None = None
            try:
                async with self._pool.connection() as conn:
                    await conn.execute(sql.PING)
                return
            except psycopg.Error as exc:
                if not last_try and conn is not None and connection_lost(exc, conn):
                    self._drop_broken_connections()
                    continue
                raise BackendUnavailable(f"database unreachable: {_one_line(exc)}") from exc


async def _roll_back(conn: AsyncConnection[TupleRow]) -> None:
    """End a failed try's transaction if the connection is still in one.

    A connection that cannot take the ROLLBACK (lost, or busy with a cancelled query) is left
    as it is: the pool checks a returned connection's state and discards a broken one.
    """
    if conn.info.transaction_status not in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        return
    with contextlib.suppress(psycopg.Error):
        await conn.execute(sql.ROLLBACK, prepare=False)


def _described(exc: psycopg.Error) -> str:
    """The server's message of ``exc`` and its hint, on one line: an API answer carries it, so
    the CONTEXT (the SQL statement or function that failed) and the DETAIL are left out."""
    diag = exc.diag
    message = diag.message_primary or _one_line(exc)
    hint = diag.message_hint
    return f"{message} (hint: {' '.join(hint.split())})" if hint else message


def _one_line(exc: BaseException) -> str:
    """The first non-empty line of an error's text (libpq adds hints on further lines)."""
    text = str(exc)
    return next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
