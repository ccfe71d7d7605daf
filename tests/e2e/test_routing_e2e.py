"""Kind-aware routing on real processes (issue 15 item 2): a mixed fleet runs a job of both kinds.

Two ``dtq-worker`` processes register different kinds (``tests/e2e/routing_app.py``); one job
holds tasks of both, each ``route.b`` task depending on a ``route.a`` task. Every task must
complete in one run on the worker of its kind: none is failed as an unknown kind.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.e2e.conftest import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_two_workers_with_different_kinds_run_a_job_of_both_kinds(cluster: Cluster) -> None:
    cluster.start_orchestrator()
    cluster.start("wa", "--app", "tests.e2e.routing_app:runtime_a", command="dtq-worker")
    cluster.start("wb", "--app", "tests.e2e.routing_app:runtime_b", command="dtq-worker")
    tasks = []
    for i in range(10):
        tasks.append({"name": f"a{i}", "kind": "route.a", "payload": {"name": f"a{i}"}})
        tasks.append(
            {
                "name": f"b{i}",
                "kind": "route.b",
                "payload": {"name": f"b{i}"},
                "depends_on": [f"a{i}"],
            }
        )
    tasks += [
        {"name": f"b-root{i}", "kind": "route.b", "payload": {"name": f"b-root{i}"}}
        for i in range(10)
    ]
    submitted = cluster.post("/v1/jobs", {"name": "mixed-fleet", "tasks": tasks})

    job = cluster.wait_job(submitted["job_id"], timeout=60)

    assert job["status"] == "completed", job
    assert {t["status"] for t in job["tasks"]} == {"completed"}
    pids: dict[str, set[int]] = defaultdict(set)
    ran: dict[str, int] = defaultdict(int)
    for record in cluster.read_records():
        pids[record["kind"]].add(record["pid"])
        ran[record["name"]] += 1
    assert pids["route.a"] == {cluster.procs["wa"].pid}
    assert pids["route.b"] == {cluster.procs["wb"].pid}
    assert set(ran) == {t["name"] for t in tasks} and set(ran.values()) == {1}
    for name in ("a0", "b0", "b-root0"):
        view = cluster.get(f"/v1/tasks/{submitted['tasks'][name]}")
        assert [r["status"] for r in view["runs"]] == ["succeeded"], view
