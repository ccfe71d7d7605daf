"""The psycopg pool behind ``CockroachStore``: session setup, bounded waits, fast reconnect.

Four bounds keep a database outage visible within seconds instead of half a minute (issue 12):

* **acquire**: a caller waits at most ``acquire_timeout`` seconds for a pool connection, then gets
  ``psycopg_pool.PoolTimeout`` (the store turns it into ``BackendUnavailable``, the API into 503);
* **connect**: one connection attempt takes at most ``connect_timeout`` seconds (libpq's
  ``connect_timeout``; psycopg's own default is 130 s when a host drops packets);
* **in flight**: libpq's TCP user timeout and keepalives (``TCP_BOUNDS``) fail a query or an
  idle connection to a host that stopped answering within seconds;
* **reconnect**: the pool gives up a background reconnection after ``reconnect_timeout`` seconds
  instead of backing off (1 s, 2 s, 4 s...) for psycopg_pool's default 5 minutes; the next caller
  that finds the pool empty starts a fresh attempt at once, so the pool is whole again within about
  a second of the database coming back.

:func:`open_pool` first makes one plain connection, so a database that is down at start is
reported in one line ("connection refused at 127.0.0.1:26257") rather than as "pool
initialization incomplete after 30 sec".

Pool connections are :class:`StoreConnection`: their prepared statements survive a rolled-back
transaction (psycopg's own connection forgets them all on every ROLLBACK).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection, IsolationLevel
from psycopg._preparing import PrepareManager
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq.abc import PGresult
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from dtq.adapters.cockroach.txconn import ClientStatements, ClockAnchor
from dtq.domain.errors import BackendUnavailable


class _KeptOnRollback(PrepareManager):
    """psycopg's prepared-statement cache, except that a transaction's rollback keeps it.

    psycopg clears the cache and sends ``DEALLOCATE ALL`` whenever a transaction rolls back, by
    its transaction block or by a ``ROLLBACK`` statement (a rolled-back DDL could have changed
    what a statement refers to). The store's connections run no DDL, and a prepared statement
    outlives a ROLLBACK on the server (PostgreSQL and CockroachDB keep prepared statements per
    session), so the cache stays valid.
    Without this, the store's re-runs after 40001 (a third of the drain's tries) kept the hot
    statements from ever reaching the prepare threshold: parsed and planned on every execution.
    Statements that really drop the server's state (``DISCARD ALL``, ``DEALLOCATE ALL``, DDL)
    still clear it (psycopg's check of each statement's result).
    """

    def __init__(self) -> None:
        super().__init__()
        self._checking = False

    def clear(self) -> bool:
        """Clear the cache only when psycopg's check of a statement's result asks for it; a
        transaction's rollback (the other caller) keeps it (see the class)."""
        return super().clear() if self._checking else False

    def validate(self, key: Any, prep: Any, name: bytes, results: Sequence[PGresult]) -> None:
        # psycopg's check of an executed statement's results: clears what DDL, DISCARD ALL or
        # DEALLOCATE ALL made stale; the store's explicit ROLLBACK of a failed try keeps it
        self._checking = not any(r.command_status == b"ROLLBACK" for r in results)
        try:
            super().validate(key, prep, name, results)
        finally:
            self._checking = False


class StoreConnection(AsyncConnection[TupleRow]):
    """The store pool's connection: prepared statements are kept across rollbacks
    (:class:`_KeptOnRollback`), and the statements bound on the client are prepared by name
    once sent (``statements``, :class:`txconn.ClientStatements`); its last reading of the
    database clock (``clock``, :class:`txconn.ClockAnchor`) lets a try estimate its timestamp;
    otherwise psycopg's ``AsyncConnection``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prepared = _KeptOnRollback()
        self.statements = ClientStatements()
        self.clock = ClockAnchor()


Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]

#: libpq refuses a ``connect_timeout`` below 2 s (it rounds it up).
_MIN_CONNECT_TIMEOUT = 2
#: libpq's TCP bounds on an open connection (each unless the DSN sets it): a query sent to a
#: host that stopped answering (powered off, partitioned: its packets dropped, no reset) fails
#: once the kernel has waited ``tcp_user_timeout`` ms for an acknowledgement, instead of the
#: kernel's ~15 minutes of retransmissions; an idle one is probed after ``keepalives_idle`` s.
TCP_BOUNDS: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}

#: libpq's per-host failure line: ``connection to server at "h" (addr), port 5432 failed: why``.
_HOST_FAILURE = re.compile(
    r'connection to server at "(?P<host>[^"]+)"(?: \([^)]*\))?, port (?P<port>\d+) failed: '
    r"(?P<why>[^\n]+)"
)


def describe_connect_error(exc: BaseException) -> str:
    """One line saying why a connection could not be made, e.g. ``connection refused at h:5432``.

    Args:
        exc: what ``psycopg.AsyncConnection.connect`` raised.

    Returns:
        For each host libpq tried, ``<reason, lower case> at host:port`` (joined by ``; ``);
        otherwise the first line of the error text.
    """
    text = str(exc)
    failures = [
        f"{m['why'].strip().rstrip('.').lower()} at {m['host']}:{m['port']}"
        for m in _HOST_FAILURE.finditer(text)
    ]
    if failures:
        return "; ".join(dict.fromkeys(failures))
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first.removeprefix("connection failed: ") or type(exc).__name__


async def _configure(conn: AsyncConnection[TupleRow]) -> None:
    """Per-connection session setup: UTC timestamps and SERIALIZABLE transactions.

    On PostgreSQL (not CockroachDB) sequential scans are also discouraged for the session:
    SERIALIZABLE's predicate locks follow the plan, and a sequential scan of a small table
    (which the planner prefers for ``id = ANY(...)`` on a few pages) locks the whole table, so
    every pair of concurrent claims of different tasks would conflict and retry. Index scans
    lock only the rows read. CockroachDB always reads the primary index by key here.

    Bitmap scans are discouraged too (issue 17 item 5): on a table without statistics yet (a
    fresh deployment's first backlog) the planner guesses a few rows for a keyset's row
    comparison and reads every row past the cursor through a bitmap, then sorts them to keep a
    page: the reconciler's page of 500 cost 0.9-1.4 s at 1,000,000 queued tasks instead of
    ~5 ms in index order. A bitmap heap scan also takes page-level predicate locks.
    """
    await conn.execute("SET TIME ZONE 'UTC'")
    if conn.info.parameter_status("crdb_version") is None:
        await conn.execute("SET enable_seqscan = off")
        await conn.execute("SET enable_bitmapscan = off")
    await conn.set_isolation_level(IsolationLevel.SERIALIZABLE)


def pool_dsn(dsn: str, acquire_timeout: float) -> str:
    """``dsn`` with the pool's bounds added where it sets none: ``connect_timeout`` (the
    acquire timeout rounded up, at least 2 s) and :data:`TCP_BOUNDS`.

    Raises:
        psycopg.ProgrammingError: ``dsn`` cannot be parsed.
    """
    given = conninfo_to_dict(dsn)
    bounds = {
        "connect_timeout": max(_MIN_CONNECT_TIMEOUT, math.ceil(acquire_timeout)),
        **TCP_BOUNDS,
    }
    missing = {name: value for name, value in bounds.items() if name not in given}
    return make_conninfo(dsn, **missing) if missing else dsn


async def open_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 8,
    max_lifetime: float = 600.0,
    acquire_timeout: float = 3.0,
    reconnect_timeout: float | None = None,
) -> Pool:
    """Open a pool of autocommit connections for ``CockroachStore`` and wait until it is ready.

    Every connection runs with ``TimeZone=UTC`` and ``BEGIN ISOLATION LEVEL SERIALIZABLE``
    (CockroachDB's default; on PostgreSQL it makes the version guards and the retry loop
    behave as on CockroachDB). Connections are recycled after ``max_lifetime`` seconds so
    load spreads over CockroachDB nodes that joined later.

    Args:
        dsn: libpq DSN (URL or ``key=value``); list several hosts for a multi-node cluster. A
            ``connect_timeout`` in it wins over the one derived from ``acquire_timeout``, and
            each of :data:`TCP_BOUNDS` it sets over ours (:func:`pool_dsn`).
        min_size: connections kept open.
        max_size: upper bound (CRDB.md: about 4 x the cluster's vCPUs in total).
        max_lifetime: seconds before a connection is replaced.
        acquire_timeout: seconds a caller waits for a connection (``DB_ACQUIRE_TIMEOUT``); also
            the connect timeout of one attempt (at least 2 s, libpq's minimum) and the wait for
            the first ``min_size`` connections.
        reconnect_timeout: seconds the pool keeps retrying one lost connection in the background
            before leaving it to the next caller; ``max(2, acquire_timeout)`` when None.

    Returns:
        The open pool; close it with ``await pool.close()``.

    Raises:
        BackendUnavailable: the database cannot be reached (one line naming host and port and
            why), or the pool did not fill within ``acquire_timeout`` after that.
    """
    connect_timeout = max(_MIN_CONNECT_TIMEOUT, math.ceil(acquire_timeout))
    dsn = pool_dsn(dsn, acquire_timeout)
    try:
        probe = await AsyncConnection.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        raise BackendUnavailable(f"cannot connect: {describe_connect_error(exc)}") from exc
    await probe.close()
    pool: Pool = AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True},
        connection_class=StoreConnection,
        configure=_configure,
        max_lifetime=max_lifetime,
        timeout=acquire_timeout,
        reconnect_timeout=(
            max(float(_MIN_CONNECT_TIMEOUT), acquire_timeout)
            if reconnect_timeout is None
            else reconnect_timeout
        ),
        open=False,
        name="dtq-store",
    )
    try:
        await pool.open(wait=True, timeout=max(acquire_timeout, float(connect_timeout)))
    except psycopg.Error as exc:
        await pool.close()
        raise BackendUnavailable(f"cannot open database pool: {exc}") from exc
    return pool
