"""A real ``dtq orchestrator`` with ``API_AUTH=tokens`` (its default) and tokens made by
``dtq token create`` (issue 15 item 3): 401 without a token, 403 with the wrong scope, the request
served with the right one, and no secret in the orchestrator's log."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e


def create_token(cluster: Cluster, name: str, scopes: str) -> str:
    return cluster.run("token", "create", "--name", name, "--scopes", scopes).splitlines()[-1]


def test_the_orchestrator_refuses_without_or_with_a_wrong_token_and_serves_the_right_one(
    cluster: Cluster,
) -> None:
    submitter = create_token(cluster, "submitter", "submit")
    reader = create_token(cluster, "reader", "read")
    cluster.env.pop("API_AUTH")  # the orchestrator's own default: tokens
    cluster.start_orchestrator()  # /healthz stays open
    url = cluster.url

    anonymous = httpx.post(f"{url}/v1/tasks", json={"kind": "echo"}, timeout=10)
    wrong = httpx.post(
        f"{url}/v1/tasks",
        json={"kind": "echo"},
        headers={"Authorization": f"Bearer {reader}"},
        timeout=10,
    )
    right = httpx.post(
        f"{url}/v1/tasks",
        json={"kind": "echo"},
        headers={"Authorization": f"Bearer {submitter}"},
        timeout=10,
    )

    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert anonymous.json()["error"]["code"] == "unauthenticated"
    assert wrong.status_code == 403
    assert wrong.json()["error"]["code"] == "forbidden"
    assert right.status_code == 201, right.text
    task_id = right.json()["task_id"]
    read = httpx.get(
        f"{url}/v1/tasks/{task_id}", headers={"Authorization": f"Bearer {reader}"}, timeout=10
    )
    assert read.status_code == 200
    assert read.json()["kind"] == "echo"
    cluster.stop_all()
    log = (cluster.logs / "orchestrator.log").read_text(errors="replace")
    assert "request rejected" in log  # the refusals were logged ...
    assert submitter not in log and reader not in log  # ... without the secrets
