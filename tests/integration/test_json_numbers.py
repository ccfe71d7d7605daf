"""JSON numbers through PostgreSQL's JSONB (README "Payloads and results").

JSONB stores a number's value as a decimal, not its spelling: ``1.5e300`` is read back as a
301-digit integer literal. The API never accepts an integer outside int64, so the adapter turns
such an integer back into a float; integers within int64 stay integers.
"""

from __future__ import annotations

from typing import Any

import pytest

from dtq.adapters.cockroach import CockroachStore
from dtq.application.commands import ExecutionPolicy, SubmitJob, TaskSpec
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import services_on

pytestmark = pytest.mark.integration

PAYLOAD: dict[str, Any] = {
    "f": 1.5e300,
    "neg": -2.5e200,
    "list": [1e19, {"deep": 1.7976931348623157e308}],
    "text": "12345678901234567890123",
    "max": 2**63 - 1,
    "min": -(2**63),
    "small": 42,
}


@pytest.fixture
def services(pg_store: CockroachStore) -> Services:
    return services_on(pg_store, policy=ExecutionPolicy(lease_duration=2.0))


def assert_same_numbers(value: dict[str, Any]) -> None:
    assert value == PAYLOAD
    assert [type(value[k]) for k in ("f", "neg", "max", "min", "small")] == [
        float,
        float,
        int,
        int,
        int,
    ]
    assert type(value["list"][0]) is float and type(value["list"][1]["deep"]) is float


async def test_large_floats_come_back_as_floats_and_a_handler_can_return_them(
    services: Services,
) -> None:
    submitted = await services.api.submit.submit_job(
        SubmitJob(tasks=(TaskSpec("a", "echo", payload=PAYLOAD),))
    )
    ids = await services.queue.pop_many(["default"], timeout=0.05, max_count=1)
    [claim] = await services.worker.execution.claim_many(ids, "w1")

    assert_same_numbers(claim.task.payload)
    [outcome] = await services.worker.execution.complete_many([claim], [claim.task.payload])

    task = (await services.api.queries.get_task(submitted.task_ids["a"])).task
    assert outcome.value == "recorded", outcome
    assert task.result is not None
    assert_same_numbers(task.result)
