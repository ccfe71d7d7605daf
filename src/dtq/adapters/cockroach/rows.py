"""Rows to entities and JSON to text: the adapter-local mapping (one function per table).

Positions follow the SELECT column lists in ``sql.py``. JSONB travels as text both ways: encoded
with msgspec for ``%s::jsonb`` parameters, read back as ``column::text`` and decoded with msgspec.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import msgspec
from psycopg.rows import TupleRow

from dtq.domain.entities import Job, Task, TaskRun, Worker
from dtq.domain.errors import InvalidPayload
from dtq.domain.policy import RetryPolicy
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from dtq.domain.tokens import ApiToken, Scope

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def encode_json(value: Any) -> str | None:
    """Encode a JSON value as text for a ``%s::jsonb`` parameter; None stays SQL NULL.

    Raises:
        InvalidPayload: the value is not JSON-encodable (e.g. an int beyond 64 bits).
    """
    if value is None:
        return None
    try:
        return _ENCODER.encode(value).decode()
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise InvalidPayload(f"value cannot be stored as JSON: {exc}") from exc


def encode_rows(rows: list[tuple[Any, ...]]) -> str:
    """Encode a batch of rows as one JSON array of arrays: the single ``%s::jsonb`` parameter
    of ``sql.INSERT_EVENTS``, which unpacks it with ``jsonb_array_elements`` and ``->>`` casts.

    One msgspec call for the whole batch instead of one binary array per column. UUIDs become
    their text, None JSON null (SQL NULL after ``->>``). Only for rows whose values are mostly
    JSON already: the server parses the whole array, which costs more than binary arrays of
    scalars (see benchmarks/PROFILE.md, fourth pass).

    Raises:
        InvalidPayload: some value is not JSON-encodable (e.g. an int beyond 64 bits).
    """
    try:
        return _ENCODER.encode(rows).decode()
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        raise InvalidPayload(f"value cannot be stored as JSON: {exc}") from exc


def decode_json(text: str | None) -> Any:
    """Decode JSONB read back as text (``column::text``); SQL NULL gives None.

    JSONB keeps a number's value, not its spelling, so a float such as ``1.5e300`` comes back
    as a 301-digit integer literal. The API never stores an integer outside the signed 64-bit
    range, so any such integer is turned back into a float. Only text with a run of 19 or
    more digits is walked for them.
    """
    if text is None:
        return None
    value = _DECODER.decode(text)
    return _floats_back(value) if _LONG_DIGITS.search(text) else value


#: A run of digits long enough to hold an integer outside int64 (2**63 has 19 digits).
_LONG_DIGITS = re.compile(r"[0-9]{19}")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def _floats_back(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _floats_back(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats_back(v) for v in value]
    if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
        try:
            return float(value)
        except OverflowError:  # past a double: cannot have been a float the API accepted
            return value
    return value


def job_from_row(row: TupleRow) -> Job:
    """Map a ``sql.GET_JOB`` row to a ``Job``."""
    return Job(
        id=row[0],
        name=row[1],
        status=JobStatus(row[2]),
        metadata=decode_json(row[3]),
        idempotency_key=row[4],
        request_hash=row[5],
        version=row[6],
        created_at=row[7],
        updated_at=row[8],
        trace_context=row[9],
        has_dependencies=row[10],
        task_count=row[11],
    )


def task_from_row(row: TupleRow) -> Task:
    """Map a ``sql.GET_TASK`` row to a ``Task``."""
    return Task(
        id=row[0],
        job_id=row[1],
        name=row[2],
        kind=row[3],
        payload=decode_json(row[4]),
        status=TaskStatus(row[5]),
        scheduled_at=row[6],
        created_at=row[7],
        updated_at=row[8],
        priority=row[9],
        max_attempts=row[10],
        attempt=row[11],
        reclaims=row[12],
        started_at=row[13],
        finished_at=row[14],
        last_error=row[15],
        current_run_id=row[16],
        version=row[17],
        result=decode_json(row[18]),
        position=row[19],
        progress=decode_json(row[20]),
        retry_policy=RetryPolicy.from_json(decode_json(row[21])),
        timeout=None if row[22] is None else timedelta(milliseconds=row[22]),
    )


def run_from_row(row: TupleRow) -> TaskRun:
    """Map a ``sql.GET_RUN`` row to a ``TaskRun``."""
    return TaskRun(
        id=row[0],
        task_id=row[1],
        attempt_number=row[2],
        worker_id=row[3],
        status=RunStatus(row[4]),
        started_at=row[5],
        error=row[6],
        finished_at=row[7],
    )


def worker_from_row(row: TupleRow) -> Worker:
    """Map a ``sql.LIST_ACTIVE_WORKERS`` row to a ``Worker`` (NULL metadata becomes ``{}``)."""
    metadata = decode_json(row[3])
    return Worker(
        id=row[0],
        hostname=row[1],
        last_heartbeat_at=row[2],
        metadata=metadata or {},
        redis_key_prefix=row[4],
    )


def token_from_row(row: TupleRow) -> ApiToken:
    """Map a row of the ``sql.API_TOKENS_*`` reads to an ``ApiToken`` (``scopes``: ``TEXT[]``)."""
    return ApiToken(
        id=row[0],
        name=row[1],
        secret_hash=row[2],
        scopes=frozenset(Scope(name) for name in row[3]),
        created_at=row[4],
        expires_at=row[5],
        revoked_at=row[6],
    )
