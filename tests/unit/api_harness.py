"""The HTTP API on the memory adapters, for tests: a FakeClock, its own metrics registry, and an
``AsyncTestClient`` talking to the app in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from dependency_injector import providers
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client import CollectorRegistry

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.entrypoints.api import create_app
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import build_container, open_services
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry

#: Small limits so the limit tests stay cheap; no API authentication (``API_AUTH=none``, given
#: explicitly: the production default is ``tokens``; the token tests build their own settings).
SETTINGS = Settings(
    api_auth="none",
    api_max_body_bytes=64 * 1024,
    api_max_tasks_per_job=20,
    api_max_payload_bytes=1024,
)

JSON = {"Content-Type": "application/json"}


@dataclass
class Api:
    """A running app and what it was built from."""

    client: AsyncTestClient[Litestar]
    app: Litestar
    services: Services
    clock: FakeClock
    metrics: OrchestratorMetrics
    registry: CollectorRegistry

    @property
    def store(self) -> InMemoryStore:
        assert isinstance(self.services.store, InMemoryStore)
        return self.services.store

    @property
    def queue(self) -> InMemoryQueue:
        assert isinstance(self.services.queue, InMemoryQueue)
        return self.services.queue

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A metric's current value (0.0 when it has no such series yet)."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0


@asynccontextmanager
async def running_api(settings: Settings = SETTINGS, **overrides: Any) -> AsyncIterator[Api]:
    """Build the services on the memory backend with a FakeClock, the app, and a test client.

    Args:
        settings: the limits the app enforces.
        overrides: ``ApiServices`` fields to replace (e.g. ``health=...``, ``queries=...``).
    """
    clock = FakeClock()
    container = build_container(settings, backend="memory")
    container.clock.override(providers.Object(clock))
    async with open_services(settings, backend="memory", container=container) as opened:
        services = replace(opened, api=replace(opened.api, **overrides)) if overrides else opened
        registry = new_registry()
        metrics = OrchestratorMetrics(registry)
        app = create_app(services.api, settings, metrics, registry)
        async with AsyncTestClient(app) as client:
            yield Api(client, app, services, clock, metrics, registry)


def http_scope(
    path: str, headers: list[tuple[bytes, bytes]], method: str = "POST"
) -> dict[str, Any]:
    """An ASGI HTTP scope for ``method path`` with exactly ``headers`` (for tests that call the
    app directly: the test client merges a repeated header and serves one request at a time)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
        "state": {},
    }


async def asgi_post(
    api: Api,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    *,
    content_length: bool = True,
) -> tuple[int, bytes]:
    """POST ``body`` to ``path`` with exactly ``headers`` (the test client would merge a
    repeated header into one) and a ``Content-Length`` unless told not to, straight into the
    app: the response status and body."""
    length = [(b"content-length", str(len(body)).encode())] if content_length else []
    scope = http_scope(path, [*headers, *length])
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    statuses: list[int] = []
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await api.app(scope, receive, send)  # type: ignore[arg-type]
    return statuses[0], b"".join(chunks)
