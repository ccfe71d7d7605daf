"""``GET /v1/events`` over a real server on the memory backend (issue 16 item 1): the SSE
framing, resumption with ``Last-Event-ID`` or ``?after=``, the filters, keep-alive comments and
the 400/404 answers for bad parameters."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest

from tests.sse import collect, messages
from tests.unit.api_harness import SETTINGS
from tests.unit.http_server import Server, serving

FAST = replace(SETTINGS, events_poll_interval=0.02)


async def submit_pair(client: httpx.AsyncClient) -> dict[str, Any]:
    body = {
        "tasks": [{"name": "a", "kind": "echo"}, {"name": "b", "kind": "echo", "depends_on": ["a"]}]
    }
    response = await client.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def test_the_stream_sends_each_event_with_its_id_type_and_data() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        job = await submit_pair(client)
        got = await collect(client, count=3)

    assert [m.event for m in got] == ["job.submitted", "task.queued", "task.pending"]
    first = got[0].data
    assert first["id"] == got[0].id and first["type"] == "job.submitted"
    assert first["job_id"] == job["job_id"] and first["task_id"] is None
    assert got[1].data["task_id"] == job["tasks"]["a"]
    assert got[1].data["data"]["cause"] == "submitted"


async def test_a_resumed_stream_starts_after_the_last_event_id_and_sees_later_events() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        job = await submit_pair(client)
        seen = await collect(client, count=2)
        resumed = asyncio.create_task(
            collect(client, count=4, headers={"Last-Event-ID": str(seen[-1].id)})
        )
        await asyncio.sleep(0.1)
        await complete(server, job["tasks"]["a"])
        rest = await resumed
        again = await collect(client, {"after": str(seen[0].id)}, count=1)
        header_wins = await collect(
            client, {"after": str(seen[0].id)}, count=1, headers={"Last-Event-ID": str(seen[1].id)}
        )

    assert [m.event for m in rest] == [
        "task.pending",
        "task.running",
        "job.running",
        "task.completed",
    ]
    assert again[0].id == seen[1].id
    assert header_wins[0].id == rest[0].id  # after seen[1], not after seen[0]


async def complete(server: Server, task_id: str) -> None:
    await server.complete(UUID(task_id), None)


async def test_the_filters_narrow_the_stream_to_one_job_and_some_types() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        await submit_pair(client)
        job = await submit_pair(client)
        got = await collect(
            client, {"job_id": job["job_id"], "kinds": "task.pending,job.submitted"}, count=2
        )

    assert [(m.event, m.data["job_id"]) for m in got] == [
        ("job.submitted", job["job_id"]),
        ("task.pending", job["job_id"]),
    ]


async def test_a_quiet_stream_sends_keep_alive_comments() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        server.services.api.events.policy = replace(
            server.services.api.events.policy, heartbeat=0.05
        )
        comments: list[str] = []
        async with asyncio.timeout(5), client.stream("GET", "/v1/events") as response:
            async for message in messages(response):
                comments.extend(message.comments)
                if "keep-alive" in comments:
                    break
    assert comments[0] == "dtq events" and "keep-alive" in comments


EVENT_ID = "1764595200123456-6f1c0d2e9a4b4c37b1de0f4d2c8a9e11"


@pytest.mark.parametrize(
    ("params", "headers", "field"),
    [
        ({"job_id": "nope"}, {}, "job_id"),
        ({"kinds": "task.exploded"}, {}, "kinds"),
        ({"after": "12"}, {}, "after"),
        ({}, {"Last-Event-ID": "not-an-id"}, "Last-Event-ID"),
        # A misspelt filter would otherwise stream every event unfiltered.
        ({"types": "task.failed"}, {}, "types"),
        ({"kinds": ""}, {}, "kinds"),
        ({"kinds": " , "}, {}, "kinds"),
        ([("job_id", str(uuid4())), ("job_id", str(uuid4()))], {}, "job_id"),
        ({}, [("Last-Event-ID", EVENT_ID), ("Last-Event-ID", EVENT_ID)], "Last-Event-ID"),
    ],
)
async def test_bad_parameters_are_400_naming_the_field(
    params: Any, headers: Any, field: str
) -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        response = await client.get("/v1/events", params=params, headers=headers, timeout=5)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


async def test_an_unknown_job_is_404() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        response = await client.get("/v1/events", params={"job_id": str(uuid4())})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "job_not_found"


async def test_a_database_outage_ends_the_stream_with_a_comment_not_a_traceback() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        await submit_pair(client)
        seen: list[str] = []
        async with asyncio.timeout(5), client.stream("GET", "/v1/events") as response:
            async for message in messages(response):
                if message.event is not None:
                    seen.append(message.event)
                    if len(seen) == 3:
                        server.services.store.available = False  # type: ignore[attr-defined]
                seen.extend(message.comments)
        server.services.store.available = True  # type: ignore[attr-defined]

    assert seen == [
        "dtq events",
        "job.submitted",
        "task.queued",
        "task.pending",
        "database unavailable: reconnect",
    ]
