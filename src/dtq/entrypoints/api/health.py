"""Operational routes: ``GET``/``HEAD /healthz`` and ``GET /metrics`` (spec §7).

``/healthz`` answers within about 2 s whatever the backends do (each ping is bounded by
``HealthService``) and names what is down; a 503 carries ``Retry-After``.
"""

from __future__ import annotations

import msgspec
from litestar import Controller, Response, get, head
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from dtq.application.health import HealthService
from dtq.entrypoints.api import bodies, responses
from dtq.entrypoints.api.errors import RETRY_AFTER_HEADERS
from dtq.entrypoints.api.schemas import HealthBody

#: Prometheus text format 0.0.4; Litestar appends ``; charset=utf-8`` to ``text/*`` types.
EXPOSITION_MEDIA_TYPE = "text/plain; version=0.0.4"

UNHEALTHY = ResponseSpec(
    data_container=HealthBody,
    description="A backend failed its ping; `checks` carries the error per backend",
    generate_examples=False,
)


class HealthController(Controller):
    """Liveness of the backends: ``GET /healthz``."""

    path = "/healthz"
    tags = ["operations"]

    @get(
        "/",
        summary="Ping the database and Redis",
        responses={503: UNHEALTHY, 500: responses.INTERNAL},
    )
    async def healthz(self, health: NamedDependency[HealthService]) -> Response[HealthBody]:
        """200 ``{"status": "ok", "checks": {"store": "ok", "queue": "ok"}}`` when both pings
        succeed, else 503 (with ``Retry-After``) with ``status`` ``unavailable`` and the failing
        check's error. ``HEAD /healthz`` answers the same status without a body."""
        body, status = bodies.health_body(await health.check())
        return Response(body, status_code=status, headers=_headers(status))

    # Left out of the OpenAPI document: HEAD is GET without the body (RFC 9110), described there.
    @head("/", include_in_schema=False)
    async def healthz_head(self, health: NamedDependency[HealthService]) -> Response[None]:
        """The status of ``GET /healthz`` (200 or 503) without a body, for load balancers.

        ``Content-Length`` is the length the GET body would have (RFC 9110 §9.3.2), never the
        4 bytes of an encoded ``null``: a client that trusts it must not wait for body bytes.
        """
        body, status = bodies.health_body(await health.check())
        headers = _headers(status) or {}
        headers["content-length"] = str(len(msgspec.json.encode(body)))
        return Response(None, status_code=status, headers=headers)


def _headers(status: int) -> dict[str, str] | None:
    return dict(RETRY_AFTER_HEADERS) if status == 503 else None


class MetricsController(Controller):
    """Prometheus exposition: ``GET /metrics``."""

    path = "/metrics"
    tags = ["operations"]

    @get(
        "/",
        summary="Prometheus metrics",
        media_type=EXPOSITION_MEDIA_TYPE,
        responses={500: responses.INTERNAL},
    )
    async def metrics(self, registry: NamedDependency[CollectorRegistry]) -> bytes:
        """Text exposition format 0.0.4 of this process's registry (process, Python GC and
        platform collectors, ``orchestrator_*`` metrics; in ``dtq dev`` also ``worker_*``), with
        no ``*_created`` series."""
        return generate_latest(registry)
