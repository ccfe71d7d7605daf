"""Progress and checkpoints on PostgreSQL through the services and the HTTP API (issue 13 item 5).

The store contract pins ``save_progress``; this file runs the use cases over the real SQL: the
renewal's batched write fenced to the live run, the claim-time copy written back by the trusted
success, the hand-back's flush read by the next claim as the checkpoint.
"""

from __future__ import annotations

import httpx
import pytest

from dtq.application.commands import ReportOutcome, SubmitJob, TaskSpec
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import claim_ready

pytestmark = pytest.mark.integration


async def test_progress_is_fenced_shown_while_running_and_kept_by_the_success(
    services: Services, client: httpx.AsyncClient
) -> None:
    execution = services.worker.execution
    await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"), TaskSpec("b", "k"))))
    a, b = await claim_ready(services)

    written = await execution.record_progress([(a, {"done": 1}), (b, "b at 1")])
    await execution.record_progress([(a, {"done": 2, "of": 3})])
    shown = (await client.get(f"/v1/tasks/{a.task.id}")).json()
    outcomes = await execution.complete_many(
        [a, b], [None, None], progress={a.task.id: {"done": 3, "of": 3}, b.task.id: "b at 1"}
    )

    assert written == {a.task.id, b.task.id}
    assert (shown["status"], shown["progress"]) == ("running", {"done": 2, "of": 3})
    assert outcomes == [ReportOutcome.RECORDED, ReportOutcome.RECORDED]
    done = (await client.get(f"/v1/tasks/{a.task.id}")).json()
    assert (done["status"], done["progress"]) == ("completed", {"done": 3, "of": 3})
    assert (await client.get(f"/v1/tasks/{b.task.id}")).json()["progress"] == "b at 1"


async def test_a_handed_back_task_is_claimed_again_with_its_checkpoint_and_the_old_run_is_fenced(
    services: Services,
) -> None:
    execution = services.worker.execution
    await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "k"),)))
    [first] = await claim_ready(services)
    await execution.record_progress([(first, {"chunk": 4})])

    assert await execution.hand_back(first, "shutdown", progress={first.task.id: {"chunk": 5}}) == (
        ReportOutcome.RECORDED
    )
    [second] = await claim_ready(services, "w2")
    stale = await execution.record_progress([(first, {"chunk": 99})])

    assert second.task.progress == {"chunk": 5}
    assert stale == set()
    view = await services.api.queries.get_task(first.task.id)
    assert view.task.progress == {"chunk": 5}
