"""A worker ``Runtime`` run over HTTP against an ASGI app in the test's own event loop (no
socket), for the tests of the HTTP worker runtime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from dtq.entrypoints.config import Settings
from dtq.entrypoints.worker.http import open_http_worker_services
from dtq.worker import Runtime


@contextlib.asynccontextmanager
async def runtime_over_http(
    app: Any, runtime: Runtime, settings: Settings, *, token: str | None = None
) -> AsyncIterator[None]:
    """Run ``runtime`` against ``app`` (the orchestrator's API) with ``settings``' worker id,
    lease and result limit, and ``token`` as its bearer token, for the block; then stop it
    gracefully (at most 10 s)."""
    stop = asyncio.Event()
    config = runtime.configure(settings)
    async with open_http_worker_services(
        "http://dtq",
        worker_id=settings.worker_id,
        kinds=runtime.kinds,
        lease_duration=settings.lease_duration,
        max_result_bytes=settings.api_max_result_bytes,
        token=token,
        transport=httpx.ASGITransport(app=app),
    ) as services:
        worker = asyncio.create_task(runtime.run(services, config, stop=stop))
        try:
            yield
        finally:
            stop.set()
            await asyncio.wait_for(worker, timeout=10)
