"""Classifying psycopg errors for the retry loop (CRDB.md "Transactions and retries").

Only this package sees psycopg exceptions; ``CockroachStore.run`` turns each into one of:

* ``RETRY``: the transaction did not commit and may simply be run again (SQLSTATE 40001
  serialization failure, 40P01 deadlock, or the connection lost before COMMIT was sent);
* ``UNKNOWN``: COMMIT may or may not have been applied (40003, or the connection lost while
  COMMIT was in flight) -> ``CommitOutcomeUnknown``;
* ``FATAL``: anything else, including no pool connection within the pool timeout ->
  ``BackendUnavailable``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors

#: SQLSTATEs after which the whole transaction can be re-run on a fresh connection.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})

#: SQLSTATE 40003 statement_completion_unknown (CockroachDB: ambiguous commit).
AMBIGUOUS_SQLSTATE = "40003"

#: SQLSTATE classes meaning the session is gone: 08 connection exception, 57P0x shutdown.
_CONNECTION_LOST_PREFIXES = ("08", "57P")

#: Reason reported for a try whose connection was lost (see :func:`classify`).
CONNECTION_LOST = "connection_lost"

#: The pool had no connection to give (timeout, queue full, closed).
_POOL_ERRORS = (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed, psycopg_pool.TooManyRequests)


class Verdict(Enum):
    """What ``run`` does with a failed try."""

    RETRY = "retry"
    UNKNOWN = "unknown"
    FATAL = "fatal"


def connection_lost(exc: psycopg.Error, conn: psycopg.AsyncConnection[Any] | None) -> bool:
    """True when ``exc`` means the database session is gone (not a refusal by the server).

    Args:
        exc: the error raised by a statement, COMMIT, or pool checkout.
        conn: the connection the statement ran on, if any.
    """
    if conn is not None and (conn.broken or conn.closed):
        return True
    sqlstate = exc.sqlstate
    if sqlstate is None:
        return isinstance(exc, psycopg.OperationalError)
    return sqlstate.startswith(_CONNECTION_LOST_PREFIXES)


def classify(
    exc: psycopg.Error, conn: psycopg.AsyncConnection[Any] | None, *, committing: bool
) -> tuple[Verdict, str]:
    """Decide whether a failed try is retried, ambiguous, or fatal.

    Args:
        exc: the psycopg error.
        conn: the connection the try ran on (to see whether it broke).
        committing: True when ``fn`` had returned and COMMIT was being sent.

    Returns:
        The verdict and a short reason for metrics (the SQLSTATE or ``connection_lost``).
    """
    if isinstance(exc, _POOL_ERRORS):
        # No connection could be had: waiting again would only multiply the pool timeout.
        return Verdict.FATAL, "pool_unavailable"
    sqlstate = exc.sqlstate
    if sqlstate == AMBIGUOUS_SQLSTATE or isinstance(exc, pg_errors.StatementCompletionUnknown):
        return Verdict.UNKNOWN, AMBIGUOUS_SQLSTATE
    if sqlstate in RETRYABLE_SQLSTATES:
        # A 40001 at COMMIT is a definite "not committed": safe to re-run.
        return Verdict.RETRY, sqlstate
    if connection_lost(exc, conn):
        return (Verdict.UNKNOWN if committing else Verdict.RETRY), CONNECTION_LOST
    return Verdict.FATAL, sqlstate or type(exc).__name__
