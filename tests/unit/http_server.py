"""The app on the memory backend under a real uvicorn server, for tests of the HTTP client and
the CLI commands built on it (``tests/unit/test_client.py``, ``test_cli_remote.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import uvicorn

from dtq.entrypoints.api import create_app
from dtq.entrypoints.bundles import Services
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
from tests.unit.api_harness import SETTINGS


@dataclass
class Server:
    url: str
    services: Services

    async def complete(self, task_id: UUID, result: Any) -> None:
        execution = self.services.worker.execution
        claims = await execution.claim_many([task_id], "w-client")
        assert len(claims) == 1
        await execution.complete_many(claims, [result])

    async def fail(self, task_id: UUID, error: str) -> None:
        """Claim the task and fail it permanently with ``error``."""
        execution = self.services.worker.execution
        claims = await execution.claim_many([task_id], "w-client")
        assert len(claims) == 1
        await execution.fail(claims[0], error, permanent=True)


@asynccontextmanager
async def serving(settings: Settings = SETTINGS) -> AsyncIterator[Server]:
    """The app on the memory backend under uvicorn on 127.0.0.1 (port chosen by the kernel)."""
    async with open_services(settings, backend="memory") as services:
        metrics = OrchestratorMetrics(new_registry())
        app = create_app(services.api, settings, metrics, metrics.registry)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="on")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        try:
            async with asyncio.timeout(5):
                while not server.started:
                    await asyncio.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            yield Server(f"http://127.0.0.1:{port}", services)
        finally:
            server.should_exit = True
            await task
