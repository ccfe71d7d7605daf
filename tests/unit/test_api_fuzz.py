"""Schema-driven fuzzing of the HTTP API with schemathesis: no generated request, valid or
not, may produce a 5xx (DESIGN §5: bad input is a 4xx, never a 500).

The app runs on the memory adapters in process; examples are capped so the module stays well
under a minute. Skipped when schemathesis is not installed. For a longer run against a live
orchestrator::

    schemathesis run http://127.0.0.1:8080/schema/openapi.json --checks not_a_server_error
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any
from uuid import uuid4

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
from dtq.application.control import ControlService  # noqa: E402
from dtq.application.health import HealthService  # noqa: E402
from dtq.application.queries import QueryService  # noqa: E402
from dtq.application.submit import SubmitService  # noqa: E402
from dtq.entrypoints.api import create_app  # noqa: E402
from dtq.entrypoints.bundles import ApiServices  # noqa: E402
from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry  # noqa: E402
from tests.unit.api_harness import SETTINGS  # noqa: E402


def memory_services() -> ApiServices:
    """The API's services on fresh memory adapters, built without an event loop."""
    clock = SystemClock()
    store = InMemoryStore(clock)
    queue = InMemoryQueue(clock)
    return ApiServices(
        submit=SubmitService(store=store, queue=queue),
        queries=QueryService(store=store),
        health=HealthService(store=store, queue=queue),
        control=ControlService(store=store, queue=queue),
        artifacts=ArtifactService(
            store=FsArtifactStore(Path(tempfile.gettempdir()) / "dtq-fuzz-artifacts" / uuid4().hex)
        ),
    )


def fuzz_app() -> Litestar:
    registry = new_registry()
    return create_app(memory_services(), SETTINGS, OrchestratorMetrics(registry), registry)


# Built at collection: schemathesis needs the schema to parametrize the test
# (``schemathesis.pytest.from_fixture`` fails on pytest 9: "'Function' object has no attribute
# '_nodeid'"). It only touches in-memory fakes.
schema = schemathesis.openapi.from_asgi("/schema/openapi.json", fuzz_app())


@schema.parametrize()  # type: ignore[untyped-decorator]
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
def test_no_generated_request_gets_a_server_error(case: Any) -> None:
    response = case.call()

    case.validate_response(response, checks=[not_a_server_error])
    assert response.status_code < 500
