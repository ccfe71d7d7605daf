"""Results and fan-in on PostgreSQL through the services and the HTTP API (issue 13 items 1-3).

The store contract pins each repository method; this file runs the use cases over the real SQL:
results written by the batched completion, parents read by the batched claim, the results
route paging with its cursor, and a stale run's result refused.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from dtq.application.commands import SubmitJob, TaskSpec
from dtq.entrypoints.bundles import Services
from tests.integration.wiring import claim_ready

pytestmark = pytest.mark.integration


async def test_results_flow_from_parents_to_the_fan_in_and_out_through_the_api(
    services: Services, client: httpx.AsyncClient
) -> None:
    names = ["p3", "p2", "p1", "p0"]
    specs = [TaskSpec(n, "count", payload={"n": i}) for i, n in enumerate(names)]
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=(*specs, TaskSpec("sum", "total", depends_on=tuple(names))))
    )

    roots = await claim_ready(services)
    assert sorted(c.task.name for c in roots) == sorted(names)
    assert all(c.parents == {} for c in roots)
    await services.worker.execution.complete_many(
        roots, [{"n": c.task.payload["n"]} for c in roots]
    )
    [child] = await claim_ready(services)
    parents: dict[str, Any] = dict(child.parents)
    await services.worker.execution.complete_many([child], [sum(p["n"] for p in parents.values())])

    assert parents == {"p3": {"n": 0}, "p2": {"n": 1}, "p1": {"n": 2}, "p0": {"n": 3}}
    task = (await client.get(f"/v1/tasks/{result.task_ids['sum']}")).json()
    assert (task["status"], task["result"]) == ("completed", 6)
    pages: list[dict[str, Any]] = []
    params = {"limit": "2"}
    while True:
        body = (await client.get(f"/v1/jobs/{result.job_id}/results", params=params)).json()
        pages.append(body)
        if body["next_cursor"] is None:
            break
        params = {"limit": "2", "cursor": body["next_cursor"]}
    listed = [(r["name"], r["result"]) for page in pages for r in page["results"]]
    assert listed == [*((n, {"n": i}) for i, n in enumerate(names)), ("sum", 6)]
    assert len(pages) == 3
    assert pages[-1]["status"] == "completed"


async def test_a_stale_runs_result_changes_nothing_on_postgres(services: Services) -> None:
    result = await services.api.submit.submit_job(SubmitJob(tasks=(TaskSpec("a", "echo"),)))
    [first] = await claim_ready(services)
    await services.worker.execution.hand_back(first, "shutting down")
    [second] = await claim_ready(services, "w2")
    await services.worker.execution.complete_many([second], [["fresh"]])

    outcomes = await services.worker.execution.complete_many([first], [["stale"]])
    replay = await services.worker.execution.complete_many([second], [["fresh"]])

    task = (await services.api.queries.get_task(result.task_ids["a"])).task
    assert [o.value for o in outcomes + replay] == ["stale", "duplicate"]
    assert task.result == ["fresh"]
