"""Progress over HTTP (issue 13 item 5): ``GET /v1/tasks/{id}`` and the job's task list."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID

import pytest

from tests.unit.api_harness import Api, running_api


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


async def test_get_task_shows_progress_null_until_reported_then_the_latest(api: Api) -> None:
    created = (await api.client.post("/v1/tasks", json={"kind": "echo"})).json()
    url = f"/v1/tasks/{created['task_id']}"
    execution = api.services.worker.execution
    [claim] = await execution.claim_many([UUID(created["task_id"])], "w1")
    before = (await api.client.get(url)).json()

    await execution.record_progress([(claim, {"rows": 10})])
    await execution.record_progress([(claim, {"rows": 20})])
    running = (await api.client.get(url)).json()
    job = (await api.client.get(f"/v1/jobs/{created['job_id']}")).json()

    assert before["progress"] is None
    assert (running["status"], running["progress"]) == ("running", {"rows": 20})
    assert job["tasks"][0]["progress"] == {"rows": 20}
