"""The dashboard's pure parts and its one new read (issue 16 item 3): DAG layers and drawing,
the CSRF comparison, and ``QueryService.job_graph`` on the memory store."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.ports import Transaction
from dtq.application.queries import QueryService
from dtq.domain.entities import Job, Task
from dtq.domain.errors import JobNotFound, ValidationError
from dtq.domain.status import JobStatus, TaskStatus
from dtq.entrypoints.dashboard.graph import COL_GAP, NODE_W, draw, layers
from dtq.entrypoints.dashboard.sessions import csrf_matches

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def task(name: str, position: int, job_id: UUID | None = None) -> Task:
    return Task(
        id=uuid4(),
        job_id=job_id or uuid4(),
        name=name,
        kind="echo",
        payload={},
        status=TaskStatus.PENDING,
        scheduled_at=NOW,
        created_at=NOW,
        updated_at=NOW,
        position=position,
    )


def test_a_tasks_layer_is_its_longest_dependency_path() -> None:
    a, b, c, d, e = (task(n, i) for i, n in enumerate("abcde"))
    # a -> b -> d, a -> c -> d, a -> d (a shortcut), e alone
    edges = [(a.id, b.id), (a.id, c.id), (b.id, d.id), (c.id, d.id), (a.id, d.id)]

    found = layers([a, b, c, d, e], edges)

    assert found == {a.id: 0, b.id: 1, c.id: 1, d.id: 2, e.id: 0}


def test_the_drawing_puts_layers_in_columns_and_routes_every_edge() -> None:
    a, b, c = task("a", 0), task("b", 1), task("c", 2)
    drawing = draw([a, b, c], [(a.id, b.id), (a.id, c.id), (uuid4(), c.id)])

    x = {n.task.name: n.x for n in drawing.nodes}
    y = {n.task.name: n.y for n in drawing.nodes}
    assert x["b"] == x["c"] == x["a"] + NODE_W + COL_GAP
    assert y["b"] < y["c"]  # submission order inside a column
    assert len(drawing.edges) == 2  # the edge from outside the job is left out
    assert drawing.layers == 2
    assert drawing.width >= x["c"] + NODE_W


def test_a_long_name_is_cut_in_its_box() -> None:
    (node,) = draw([task("a" * 40, 0)], []).nodes
    assert len(node.label) == 18 and node.label.endswith("…")


def test_the_csrf_check_wants_the_exact_token() -> None:
    assert csrf_matches("abc", "abc")
    assert not csrf_matches("abc", "abd")
    assert not csrf_matches("abc", None)
    assert not csrf_matches("abc", ["abc"])


async def add_job(store: InMemoryStore, names: list[str]) -> tuple[Job, list[Task]]:
    job = Job(id=uuid4(), name="j", status=JobStatus.PENDING, created_at=NOW, updated_at=NOW)
    tasks = [task(n, i, job.id) for i, n in enumerate(names)]
    # a chain: (task_id, depends_on_task_id), the store's insert order
    edges = [(tasks[i + 1].id, tasks[i].id) for i in range(len(tasks) - 1)]

    async def add(tx: Transaction) -> None:
        await tx.jobs.add(job, tasks, edges)

    await store.run(add)
    return job, tasks


async def test_job_graph_reads_tasks_and_edges_of_a_job_within_the_bound() -> None:
    store = InMemoryStore(FakeClock())
    job, tasks = await add_job(store, ["a", "b", "c"])
    queries = QueryService(store=store)

    graph = await queries.job_graph(job.id, max_tasks=3)
    too_big = await queries.job_graph(job.id, max_tasks=2)

    assert graph.tasks is not None
    assert [t.name for t in graph.tasks] == ["a", "b", "c"]
    assert sorted(graph.edges) == sorted([(tasks[0].id, tasks[1].id), (tasks[1].id, tasks[2].id)])
    assert graph.counts[TaskStatus.PENDING] == 3 and graph.counts[TaskStatus.FAILED] == 0
    assert too_big.tasks is None and too_big.edges == []
    assert too_big.counts == graph.counts


async def test_job_graph_refuses_an_unknown_job_and_a_bound_below_one() -> None:
    queries = QueryService(store=InMemoryStore(FakeClock()))
    with pytest.raises(JobNotFound):
        await queries.job_graph(uuid4(), max_tasks=10)
    with pytest.raises(ValidationError) as refused:
        await queries.job_graph(uuid4(), max_tasks=0)
    assert refused.value.field == "max_tasks"
