"""``CockroachStore``: the ``Store`` port on CockroachDB / PostgreSQL via psycopg 3 (DESIGN §3-4).

The unit of retry is the whole transaction function. Each try takes a fresh pool connection,
opens ``conn.transaction()`` inside the try, runs ``fn`` and commits; then, by what failed and
*when* (CRDB.md "Transactions and retries"):

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

"COMMIT phase" is real: a flag is set after ``fn`` returns and before the transaction context
exits, and that exit is where psycopg sends COMMIT; any error seen with the flag set happened
while committing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from psycopg import AsyncConnection, IsolationLevel
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from dtq.adapters.cockroach import sql
from dtq.adapters.cockroach.errors import Verdict, classify
from dtq.adapters.cockroach.repositories import PgTransaction
from dtq.application.ports import Transaction
from dtq.domain.errors import (
    BackendUnavailable,
    CommitOutcomeUnknown,
    ConcurrentUpdate,
    InvalidPayload,
)

T = TypeVar("T")

Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]

#: Reason passed to ``on_retry`` when ``fn`` raised ``ConcurrentUpdate``.
CONCURRENT_UPDATE = "concurrent_update"


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
            (``"40001"``, ``"40P01"``), ``"concurrent_update"`` or ``"connection_lost"``.

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
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self._pool = pool
        self._max_retries = max_retries
        self._base_backoff = base_backoff
        self._max_backoff = max_backoff
        self._on_retry = on_retry
        self.retries = 0
        # Test-only fault hooks. ``_fault_on_commit`` runs after ``fn`` returned, in the COMMIT
        # phase but before COMMIT is sent: raising rolls the try back and is handled as an error
        # of COMMIT. ``_fault_after_commit`` runs after COMMIT succeeded: raising simulates a
        # lost acknowledgement (the write is applied, the client cannot know).
        self._fault_on_commit: Callable[[], None] | None = None
        self._fault_after_commit: Callable[[], None] | None = None

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
                await asyncio.sleep(self._backoff(tries))

    def _backoff(self, tries: int) -> float:
        """Full-jitter exponential backoff in seconds after try number ``tries`` (1-based)."""
        delay = min(self._max_backoff, self._base_backoff * 2 ** (tries - 1))
        return random.uniform(0.0, delay)

    async def _try_once(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        committing = False
        conn: AsyncConnection[TupleRow] | None = None
        try:
            async with self._pool.connection() as conn:
                async with conn.transaction():
                    result = await fn(PgTransaction(conn))
                    committing = True  # leaving this block sends COMMIT
                    if self._fault_on_commit is not None:
                        self._fault_on_commit()
                if self._fault_after_commit is not None:
                    self._fault_after_commit()
                return result
        except ConcurrentUpdate as exc:
            raise _RetryableFailure(CONCURRENT_UPDATE) from exc
        except psycopg.Error as exc:
            verdict, reason = classify(exc, conn, committing=committing)
            if verdict is Verdict.RETRY:
                raise _RetryableFailure(reason) from exc
            if verdict is Verdict.UNKNOWN:
                raise CommitOutcomeUnknown(
                    f"COMMIT outcome unknown ({reason}); re-read before acting again"
                ) from exc
            if isinstance(exc, psycopg.DataError):
                raise InvalidPayload(f"the database refused a value: {exc}") from exc
            raise BackendUnavailable(f"database error ({reason}): {exc}") from exc

    async def ping(self) -> None:
        """Round-trip ``SELECT 1`` on a pool connection.

        Raises:
            BackendUnavailable: no connection could be had, or the query failed.
        """
        try:
            async with self._pool.connection() as conn:
                await conn.execute(sql.PING)
        except psycopg.Error as exc:
            raise BackendUnavailable(f"database unreachable: {exc}") from exc


async def _configure(conn: AsyncConnection[TupleRow]) -> None:
    """Per-connection session setup: UTC timestamps and SERIALIZABLE transactions.

    On PostgreSQL (not CockroachDB) sequential scans are also discouraged for the session:
    SERIALIZABLE's predicate locks follow the plan, and a sequential scan of a small table
    (which the planner prefers for ``id = ANY(...)`` on a few pages) locks the whole table, so
    every pair of concurrent claims of different tasks would conflict and retry. Index scans
    lock only the rows read. CockroachDB always reads the primary index by key here.
    """
    await conn.execute("SET TIME ZONE 'UTC'")
    if conn.info.parameter_status("crdb_version") is None:
        await conn.execute("SET enable_seqscan = off")
    await conn.set_isolation_level(IsolationLevel.SERIALIZABLE)


async def open_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 8,
    max_lifetime: float = 600.0,
    timeout: float = 30.0,
) -> Pool:
    """Open a pool of autocommit connections for ``CockroachStore`` and wait until it is ready.

    Every connection runs with ``TimeZone=UTC`` and ``BEGIN ISOLATION LEVEL SERIALIZABLE``
    (CockroachDB's default; on PostgreSQL it makes the version guards and the retry loop
    behave as on CockroachDB). Connections are recycled after ``max_lifetime`` seconds so
    load spreads over CockroachDB nodes that joined later.

    Args:
        dsn: libpq DSN (URL or ``key=value``); list several hosts for a multi-node cluster.
        min_size: connections kept open.
        max_size: upper bound (CRDB.md: about 4 x the cluster's vCPUs in total).
        max_lifetime: seconds before a connection is replaced.
        timeout: seconds to wait for the first ``min_size`` connections, and the default
            wait for a connection afterwards.

    Returns:
        The open pool; close it with ``await pool.close()``.

    Raises:
        BackendUnavailable: the connections could not be opened within ``timeout``.
    """
    pool: Pool = AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True},
        configure=_configure,
        max_lifetime=max_lifetime,
        timeout=timeout,
        open=False,
        name="dtq-store",
    )
    try:
        await pool.open(wait=True, timeout=timeout)
    except psycopg.Error as exc:
        await pool.close()
        raise BackendUnavailable(f"cannot open database pool: {exc}") from exc
    return pool
