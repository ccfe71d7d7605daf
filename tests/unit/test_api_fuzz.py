"""Schema-driven fuzzing of the HTTP API with schemathesis: no generated request, valid or
not, may produce a 5xx (DESIGN §5: bad input is a 4xx, never a 500).

Token authentication is on (``API_AUTH=tokens``, the production default) and every request
carries a token holding all four scopes, so the fuzzer reaches the handlers behind the guard.

The app runs on the memory adapters in process; examples are capped so the module stays well
under a minute. Skipped when schemathesis is not installed. For a longer run against a live
orchestrator::

    schemathesis run http://127.0.0.1:8080/schema/openapi.json --checks not_a_server_error
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from litestar import Litestar  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from dtq.adapters.artifacts.fs import FsArtifactStore  # noqa: E402
from dtq.adapters.clock import SystemClock  # noqa: E402
from dtq.adapters.memory.queue import InMemoryQueue  # noqa: E402
from dtq.adapters.memory.store import InMemoryStore  # noqa: E402
from dtq.application.artifacts import ArtifactService  # noqa: E402
from dtq.application.bulk import BulkService  # noqa: E402
from dtq.application.commands import Claim, ExecutionPolicy  # noqa: E402
from dtq.application.control import ControlService  # noqa: E402
from dtq.application.events import EventService  # noqa: E402
from dtq.application.execution import ExecutionService  # noqa: E402
from dtq.application.explain import ExplainService  # noqa: E402
from dtq.application.fleet import FleetService  # noqa: E402
from dtq.application.health import HealthService  # noqa: E402
from dtq.application.ports import DeliveryFailed  # noqa: E402
from dtq.application.queries import QueryService  # noqa: E402
from dtq.application.registry import WorkerRegistryService  # noqa: E402
from dtq.application.remote import RemoteWorkerService  # noqa: E402
from dtq.application.sessions import SessionService  # noqa: E402
from dtq.application.submit import SubmitService  # noqa: E402
from dtq.application.tokens import TokenService  # noqa: E402
from dtq.application.webhooks import WebhookService  # noqa: E402
from dtq.domain.tokens import Scope  # noqa: E402
from dtq.entrypoints.api import create_app  # noqa: E402
from dtq.entrypoints.bundles import ApiServices  # noqa: E402
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry  # noqa: E402
from tests.unit.api_harness import SETTINGS  # noqa: E402


class UnheldRemote(RemoteWorkerService):
    """The HTTP worker protocol with every claim's ``wait`` cut to 0: the fuzz checks what the
    routes answer, not how long a claim holds (up to 30 s)."""

    async def claim(self, worker_id: str, **options: Any) -> list[Claim]:
        return await super().claim(worker_id, **{**options, "wait": 0.0})


class RefusingSender:
    """A ``WebhookSender`` that never connects (the fuzzer creates webhooks, nothing delivers)."""

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        raise DeliveryFailed("the fuzz run sends nothing")

    async def aclose(self) -> None:
        return None


#: Where the fuzzed uploads go: a directory of this process's own, removed when it exits.
_ARTIFACTS = Path(tempfile.mkdtemp(prefix="dtq-fuzz-artifacts-"))
atexit.register(shutil.rmtree, _ARTIFACTS, ignore_errors=True)


def memory_services() -> tuple[ApiServices, str]:
    """The API's services on fresh memory adapters, and the secret of a token with every scope
    (created on a loop of its own: the memory store's lock is not bound to a loop until
    contended)."""
    clock = SystemClock()
    store = InMemoryStore(clock)
    queue = InMemoryQueue(clock)
    fleet = FleetService(store=store, clock=clock, alive_within=120.0)
    tokens = TokenService(store=store, clock=clock)
    created = asyncio.run(tokens.create("fuzz", frozenset(Scope)))
    control = ControlService(store=store, queue=queue)
    services = ApiServices(
        submit=SubmitService(store=store, queue=queue),
        queries=QueryService(store=store),
        health=HealthService(store=store, queue=queue),
        control=control,
        bulk=BulkService(store=store, control=control, clock=clock),
        artifacts=ArtifactService(store=FsArtifactStore(_ARTIFACTS)),
        explain=ExplainService(
            store=store,
            inspector=queue.inspector(),
            fleet=fleet,
            stale_running_after=60.0,
            reconcile_interval=30.0,
        ),
        fleet=fleet,
        tokens=tokens,
        remote=UnheldRemote(
            execution=ExecutionService(store=store, queue=queue, policy=ExecutionPolicy()),
            store=store,
            queue=queue,
            registry=WorkerRegistryService(store=store),
        ),
        events=EventService(store=store),
        inspector=queue.inspector(),
        webhooks=WebhookService(store=store, sender=RefusingSender()),
        sessions=SessionService(store=store, clock=clock),
    )
    return services, created.secret


def fuzz_app() -> tuple[Litestar, str]:
    registry = new_registry()
    services, secret = memory_services()
    settings = dataclasses.replace(SETTINGS, api_auth="tokens")
    return create_app(services, settings, OrchestratorMetrics(registry), registry), secret


# Built at collection: schemathesis needs the schema to parametrize the test
# (``schemathesis.pytest.from_fixture`` fails on pytest 9: "'Function' object has no attribute
# '_nodeid'"). It only touches in-memory fakes.
APP, SECRET = fuzz_app()
schema = schemathesis.openapi.from_asgi("/schema/openapi.json", APP)


@schema.parametrize()  # type: ignore[untyped-decorator]
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
def test_no_generated_request_gets_a_server_error(case: Any) -> None:
    response = case.call(headers={"Authorization": f"Bearer {SECRET}"})

    case.validate_response(response, checks=[not_a_server_error])
    assert response.status_code < 500
