"""examples/topk through the worker runtime on the memory adapters and the fs artifact store:
the stitched CSV equals the single-process computation; bad payloads and a stitch that does not
see every chunk fail at once, naming the problem (issue 13 item 6)."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest
from examples.topk import compute
from examples.topk.app import runtime
from examples.topk.run import job_spec, main, run_pipeline

from dtq.application.commands import TaskSpec
from dtq.domain.status import JobStatus, TaskStatus
from tests.unit.runtime_harness import Harness, build_harness

pytestmark = pytest.mark.timeout(60)


def _specs(body: dict[str, Any]) -> list[TaskSpec]:
    return [
        TaskSpec(
            t["name"], t["kind"], payload=t["payload"], depends_on=tuple(t.get("depends_on", ()))
        )
        for t in body["tasks"]
    ]


async def _artifact(h: Harness, ref: dict[str, Any]) -> bytes:
    return b"".join([chunk async for chunk in await h.artifacts.open(ref["artifact_id"])])


@pytest.mark.parametrize(("chunks", "k", "queries"), [(1, 3, 4), (7, 5, 6), (13, 12, 3)])
async def test_the_stitched_csv_equals_the_single_process_computation(
    chunks: int, k: int, queries: int
) -> None:
    h = build_harness()
    submitted = await h.submit_tasks(*_specs(job_spec(chunks, k, queries)))
    async with h.running(runtime):
        job = await h.wait_job(submitted.job_id, timeout=45)

    assert job.job.status is JobStatus.COMPLETED
    stitch = {t.name: t for t in job.tasks}["stitch"].result
    assert stitch["chunks"] == chunks
    assert stitch["rows"] == k * queries
    csv = await _artifact(h, stitch["artifact"])
    assert csv == compute.single_process_csv(k, queries)
    assert len(csv.splitlines()) == 1 + k * queries


def test_merge_breaks_distance_ties_by_row_index() -> None:
    rows = [(0, 0), (1, 0), (0, 1), (1, 1), (-1, 0)]  # rows 1, 2 and 4 are all at distance 1
    chunks = [compute.chunk_topk(rows, a, b, [0], 2) for a, b in ((3, 5), (0, 3))]
    assert compute.merge(chunks, 2) == [[(1, 1), (1, 2)]]
    assert compute.chunk_topk(rows, 0, 5, [0], 2) == [[(1, 1), (1, 2)]]


def test_chunks_tile_the_rows_without_gaps() -> None:
    bounds = [compute.chunk_bounds(i, 7, 100) for i in range(7)]
    assert bounds[0][0] == 0
    assert bounds[-1][1] == 100
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    with pytest.raises(ValueError, match="chunks must be"):
        compute.chunk_bounds(0, 101, 100)


async def _failed_task(h: Harness, *specs: TaskSpec, name: str) -> str:
    submitted = await h.submit_tasks(*specs)
    async with h.running(runtime):
        job = await h.wait_job(submitted.job_id, timeout=30)
    assert job.job.status is JobStatus.FAILED
    view = await h.task(submitted.task_ids[name])
    assert view.task.status is TaskStatus.FAILED
    assert len(view.runs) == 1  # permanent: no retry
    assert view.task.last_error is not None
    return view.task.last_error


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"chunk": 0, "chunks": 2, "k": 0, "queries": 3}, "payload.k must be 1..100"),
        ({"chunk": 2, "chunks": 2, "k": 3, "queries": 3}, "payload.chunk must be 0..1"),
        ({"chunk": 0, "chunks": 2, "k": "3", "queries": 3}, "payload.k must be an integer"),
        ({"chunk": 0, "chunks": 2, "k": 3, "queries": 3, "sleep": -1}, "payload.sleep"),
        ([1, 2], "payload must be a JSON object"),
    ],
)
async def test_a_bad_chunk_payload_fails_at_once_naming_the_field(
    payload: Any, message: str
) -> None:
    error = await _failed_task(build_harness(), TaskSpec("c", "topk.chunk", payload), name="c")
    assert message in error


async def test_a_stitch_that_misses_a_chunk_fails_instead_of_writing_a_partial_csv() -> None:
    specs = _specs(job_spec(3, 2, 2))
    stitch = specs[-1]
    partial = TaskSpec(stitch.name, stitch.kind, stitch.payload, depends_on=("chunk-0", "chunk-2"))
    error = await _failed_task(build_harness(), *specs[:-1], partial, name="stitch")
    assert "do not tile the rows" in error


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--k", "0"], "--k: expected a positive integer"),
        (["--k", "101"], "--k must be 1..100"),
        (["--chunks", "5000"], "--chunks must be 1..1797"),
        (["--sleep", "99"], "--sleep must be 0..60"),
    ],
)
def test_the_submit_script_refuses_bad_options_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_the_submit_script_sends_dtq_token_as_a_bearer_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Against an orchestrator with its default ``API_AUTH=tokens`` every request needs the
    token (the script was refused with a 401 before it sent ``DTQ_TOKEN``)."""
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer dtq_secret":
            return httpx.Response(401, json={"error": {"code": "unauthenticated"}})
        if request.method == "POST":
            return httpx.Response(201, json={"job_id": "J", "tasks": {}})
        return httpx.Response(200, json={"status": "failed", "tasks": []})

    real_client = httpx.Client
    monkeypatch.setattr(
        httpx,
        "Client",
        lambda **kw: real_client(transport=httpx.MockTransport(answer), **kw),
    )
    monkeypatch.setenv("DTQ_TOKEN", "dtq_secret")

    with pytest.raises(RuntimeError, match="job J failed"):
        run_pipeline("http://orchestrator", 2, 1, 1, None)
    assert seen == ["Bearer dtq_secret", "Bearer dtq_secret"]
