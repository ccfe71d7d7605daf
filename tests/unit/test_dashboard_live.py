"""The job page's live stream, ``GET /ui/jobs/{id}/events`` (issue 16 item 3), over a real
server on the memory backend: its gate (a session with ``API_AUTH=tokens``, open without),
the ``update`` messages as the job runs, resumption with ``Last-Event-ID``, the bound on task
statuses per update, and bad ids as 4xx before the stream starts."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest

from dtq.application.commands import TaskSpec
from dtq.application.queries import QueryService
from dtq.domain.tokens import Scope
from dtq.entrypoints.dashboard import pages, stream
from tests.sse import Message, messages
from tests.unit.api_harness import SETTINGS
from tests.unit.conftest import App
from tests.unit.held_reads import HeldReads, cancel_mid_read
from tests.unit.http_server import Server, serving

FAST = replace(SETTINGS, events_poll_interval=0.02)
TOKENS = replace(FAST, api_auth="tokens")
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
AFTER = re.compile(r'data-stream="[^"?]+\?after=([^"]+)"')


@pytest.fixture(autouse=True)
def quick_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "UPDATE_EVERY", 0.05)


async def submit_pair(client: httpx.AsyncClient, headers: dict[str, str] | None = None) -> Any:
    body = {
        "tasks": [{"name": "a", "kind": "echo"}, {"name": "b", "kind": "echo", "depends_on": ["a"]}]
    }
    response = await client.post("/v1/jobs", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


async def log_in(server: Server, client: httpx.AsyncClient, *scopes: Scope) -> str:
    """Create a token with ``scopes``, log the client in through the form; the secret."""
    created = await server.services.api.tokens.create("viewer", frozenset(scopes))
    form = await client.get("/ui/login")
    found = CSRF.search(form.text)
    assert found is not None
    response = await client.post(
        "/ui/login", data={"csrf": found[1], "token": created.secret, "next": "/ui"}
    )
    assert response.status_code == 303, response.text
    return created.secret


@asynccontextmanager
async def updates(
    client: httpx.AsyncClient, job_id: str, **kwargs: Any
) -> AsyncIterator[AsyncIterator[Message]]:
    """The stream's ``update`` messages (comments skipped), as they come."""
    async with client.stream("GET", f"/ui/jobs/{job_id}/events", **kwargs) as response:
        assert response.status_code == 200, response.status_code
        assert response.headers["content-type"].startswith("text/event-stream")

        async def only_updates() -> AsyncIterator[Message]:
            async for message in messages(response):
                if message.event is not None:
                    assert message.event == "update"
                    yield message

        yield only_updates()


async def until(
    stream_: AsyncIterator[Message], check: Callable[[Message], bool], timeout: float = 5.0
) -> list[Message]:
    """Read updates until one passes ``check``; all read, that one last."""
    seen: list[Message] = []
    async with asyncio.timeout(timeout):
        async for message in stream_:
            seen.append(message)
            if check(message):
                return seen
    raise AssertionError(f"the stream ended after {seen}")


# -- the gate ----------------------------------------------------------------------------------


async def test_without_a_session_the_stream_is_401_and_with_one_an_event_stream() -> None:
    async with serving(TOKENS) as server, httpx.AsyncClient(base_url=server.url) as client:
        secret = await server.services.api.tokens.create("submitter", frozenset({Scope.SUBMIT}))
        job = await submit_pair(client, {"Authorization": f"Bearer {secret.secret}"})
        url = f"/ui/jobs/{job['job_id']}/events"

        anonymous = await client.get(url)
        client.cookies.set("dtq_session", "forged")
        forged = await client.get(url)
        client.cookies.clear()
        bearer = await client.get(url, headers={"Authorization": f"Bearer {secret.secret}"})
        await log_in(server, client, Scope.READ)
        async with updates(client, job["job_id"]) as got:
            [first] = await until(got, lambda m: True)

    for refused in (anonymous, forged, bearer):  # a bearer token is not a dashboard session
        assert refused.status_code == 401
        assert "location" not in refused.headers  # EventSource cannot follow a redirect
        assert refused.headers["content-type"].startswith("text/plain")
    assert first.data["job_status"] == "pending"
    assert first.data["counts"]["queued"] == 1 and first.data["counts"]["pending"] == 1


async def test_without_tokens_the_stream_is_open_like_every_page() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        job = await submit_pair(client)
        async with updates(client, job["job_id"]) as got:
            [first] = await until(got, lambda m: True)
    assert first.data["total"] == 2 and first.data["finished"] is False


# -- updates -----------------------------------------------------------------------------------


async def test_the_page_turns_live_updates_from_where_its_render_left_off() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        job = await submit_pair(client)
        page = await client.get(f"/ui/jobs/{job['job_id']}")
        after = AFTER.search(page.text)
        assert after is not None
        async with updates(client, job["job_id"], params={"after": after[1]}) as got:
            await until(got, lambda m: True)  # the first: the counts as read now
            await server.complete(UUID(job["tasks"]["a"]), None)
            promoted = await until(
                got, lambda m: m.data["tasks"].get(job["tasks"]["b"]) == "queued"
            )
            await server.complete(UUID(job["tasks"]["b"]), None)
            done = await until(got, lambda m: m.data["finished"])

    # a drawn job: every update names every task's status, read with the counts
    assert promoted[-1].data["tasks"] == {
        job["tasks"]["a"]: "completed",
        job["tasks"]["b"]: "queued",
    }
    assert promoted[-1].data["counts"]["completed"] == 1
    final = done[-1].data
    assert final["job_status"] == "completed"
    assert final["counts"]["completed"] == 2 and final["total"] == 2
    assert set(final["tasks"].values()) == {"completed"}
    assert all(m.id for m in promoted + done)


async def test_the_server_ends_the_stream_of_a_finished_job_once_its_events_are_served() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        job = await submit_pair(client)
        async with updates(client, job["job_id"]) as got:
            await until(got, lambda m: True)
            await server.complete(UUID(job["tasks"]["a"]), None)
            await server.complete(UUID(job["tasks"]["b"]), None)
            seen: list[Message] = []
            async with asyncio.timeout(10):
                seen.extend([message async for message in got])  # ends when the server closes

    assert seen, "no update after the job finished"
    assert seen[-1].data["finished"] is True
    assert seen[-1].data["job_status"] == "completed"


async def test_a_resumed_stream_sends_only_what_changed_after_its_last_event_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pages, "MAX_DRAWN_TASKS", 1)  # a "large" job: statuses from events
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        job = await submit_pair(client)
        async with updates(client, job["job_id"]) as got:
            await server.complete(UUID(job["tasks"]["a"]), None)
            seen = await until(got, lambda m: m.data["counts"]["queued"] == 1 and m.data["tasks"])
        last = seen[-1].id
        assert last is not None
        await server.complete(UUID(job["tasks"]["b"]), None)
        headers = {"Last-Event-ID": last}
        async with updates(client, job["job_id"], headers=headers) as got:
            resumed = await until(got, lambda m: job["tasks"]["b"] in m.data["tasks"])

    changed = {k: v for m in resumed for k, v in m.data["tasks"].items()}
    assert changed == {job["tasks"]["b"]: "completed"}  # a's events were before the id
    assert resumed[0].id == last  # the first update of a resumed stream keeps its position
    assert resumed[0].data["finished"] is True  # its counts are read, not summed


async def test_an_update_names_at_most_its_cap_of_tasks_and_says_there_were_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream, "MAX_TASKS_PER_UPDATE", 2)
    monkeypatch.setattr(pages, "MAX_DRAWN_TASKS", 4)
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        body = {"tasks": [{"name": f"t{i}", "kind": "echo"} for i in range(5)]}
        job = (await client.post("/v1/jobs", json=body)).json()
        # no ?after=: the stream starts at the horizon of its first read, a few seconds back,
        # so the five submissions come again
        async with updates(client, job["job_id"]) as got:
            seen = await until(got, lambda m: bool(m.data["tasks"]))

    assert len(seen[-1].data["tasks"]) == 2
    assert seen[-1].data["more"] is True
    assert seen[-1].data["counts"]["queued"] == 5


@pytest.mark.parametrize(
    ("path", "headers", "field"),
    [
        ("/ui/jobs/not-a-uuid/events", {}, "id"),
        ("/ui/jobs/{job}/events?after=12", {}, "after"),
        ("/ui/jobs/{job}/events", {"Last-Event-ID": "nope"}, "Last-Event-ID"),
    ],
)
async def test_bad_ids_are_400_naming_the_field(
    path: str, headers: dict[str, str], field: str
) -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        job = await submit_pair(client)
        response = await client.get(path.format(job=job["job_id"]), headers=headers)
    assert response.status_code == 400
    assert f"field {field}" in response.text


async def test_an_unknown_job_is_404_before_the_stream_starts() -> None:
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        response = await client.get(f"/ui/jobs/{uuid4()}/events")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("text/html")


async def test_a_quiet_stream_sends_keep_alives_and_an_outage_ends_it_with_a_comment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream, "KEEPALIVE", 0.1)
    async with serving(FAST) as server, httpx.AsyncClient(base_url=server.url) as client:
        job = await submit_pair(client)
        comments: list[str] = []
        async with (
            asyncio.timeout(5),
            client.stream("GET", f"/ui/jobs/{job['job_id']}/events") as response,
        ):
            async for message in messages(response):
                comments.extend(message.comments)
                if comments[-1:] == ["keep-alive"]:
                    server.services.store.available = False  # type: ignore[attr-defined]
        server.services.store.available = True  # type: ignore[attr-defined]

    assert comments[0] == "dtq job updates"
    assert "keep-alive" in comments
    assert comments[-1] == "database unavailable: reconnect"


async def test_a_job_update_read_outlasts_a_client_that_goes_away(app: App) -> None:
    # The job's counts are read while the client may close its stream: as for the event
    # stream (tests/unit/test_events.py), the read finishes and the pool keeps its connection.
    submitted = await app.submit_tasks(TaskSpec("a", "echo"))
    store = HeldReads(app.store)
    queries = QueryService(store=store)  # type: ignore[arg-type]
    await cancel_mid_read(store, stream.read(queries, submitted.job_id))

    assert store.ended == ["finished"]
