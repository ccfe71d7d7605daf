"""The Python client of the orchestrator API (spec §7; issue 15 item 4).

:class:`Client` (blocking) and :class:`AsyncClient` (asyncio), both on httpx, submit tasks and
jobs (:class:`JobBuilder` for DAGs by name), read tasks, jobs and results, wait for a job, and
map every API error code to an exception of :mod:`dtq.client.errors` carrying its code, message
and field. Responses are the API's own msgspec Structs (:mod:`dtq.entrypoints.api.schemas`).
``DTQ_URL`` and ``DTQ_TOKEN`` configure both when no argument does.

Like :mod:`dtq.worker`, this package sits outside the layers: it imports only the API's schema
module (which needs msgspec and :mod:`dtq.domain`), ``httpx`` and ``msgspec``, never the
services, the adapters or the server (an import-linter contract in ``pyproject.toml`` enforces
it), so a program that only submits work loads no database or Redis driver.
"""

from dtq.client.aio import AsyncClient
from dtq.client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    NotCancellable,
    NotFound,
    NotRetryable,
    RateLimited,
    TransportError,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
)
from dtq.client.jobs import JobBuilder, TaskRef
from dtq.client.sync import Client

__all__ = [
    "ApiError",
    "AsyncClient",
    "BadRequest",
    "Client",
    "Conflict",
    "Forbidden",
    "IdempotencyConflict",
    "InvalidRequest",
    "JobBuilder",
    "NotCancellable",
    "NotFound",
    "NotRetryable",
    "RateLimited",
    "TaskRef",
    "TransportError",
    "Unauthenticated",
    "Unavailable",
    "WaitTimeout",
]
