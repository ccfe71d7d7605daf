"""Webhooks from the Python client and the command line (issue 16 item 2): ``Client`` and
``AsyncClient``'s ``create_webhook``, ``list_webhooks``, ``webhook_deliveries`` and
``delete_webhook``, and ``dtq webhook create|list|delete|deliveries``, against the app under a
real uvicorn server on the memory backend; bad input is one line and exit 2."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dtq.client import AsyncClient, BadRequest, Client, Forbidden, NotFound, TransportError
from dtq.domain.tokens import Scope
from dtq.entrypoints import cli
from tests.unit.api_harness import SETTINGS
from tests.unit.http_server import Server, serving

SECRET = "s" * 32
RECEIVER = "https://ci.example.com/dtq"


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    async with serving() as running:
        monkeypatch.setenv("DTQ_URL", running.url)
        monkeypatch.delenv("DTQ_TOKEN", raising=False)
        yield running


async def dtq(*argv: str) -> int:
    return await asyncio.to_thread(cli.main, list(argv))


# -- the client --------------------------------------------------------------------------------


async def test_the_client_creates_lists_reads_and_deletes_a_webhook(server: Server) -> None:
    def run() -> tuple[Any, ...]:
        with Client(server.url) as client:
            hook = client.create_webhook(RECEIVER, ["job.completed", "task.failed"], SECRET)
            listed = client.list_webhooks()
            log = client.webhook_deliveries(hook.id)
            client.delete_webhook(hook.id)
            with pytest.raises(NotFound) as gone:
                client.webhook_deliveries(hook.id)
            return hook, listed, log, gone.value, client.list_webhooks()

    hook, listed, log, gone, after = await asyncio.to_thread(run)

    assert hook.url == RECEIVER and hook.events == ["job.completed", "task.failed"]
    assert [h.id for h in listed] == [hook.id]
    assert not hasattr(hook, "secret")
    assert (log.webhook_id, log.delivered, log.attempts, log.cursor) == (hook.id, 0, 0, None)
    assert gone.status == 404
    assert after == []


async def test_the_async_client_has_the_same_webhook_calls(server: Server) -> None:
    async with AsyncClient(server.url) as client:
        hook = await client.create_webhook(RECEIVER, ["job.failed"], SECRET)
        listed = await client.list_webhooks()
        log = await client.webhook_deliveries(hook.id)
        await client.delete_webhook(hook.id)
        with pytest.raises(NotFound):
            await client.delete_webhook(hook.id)
        with pytest.raises(BadRequest) as bad:
            await client.create_webhook("ftp://x", ["job.failed"], SECRET)

    assert [h.id for h in listed] == [hook.id]
    assert log.last_status is None
    assert bad.value.field == "url"


async def test_creating_needs_admin_and_listing_needs_read() -> None:
    async with serving(dataclasses.replace(SETTINGS, api_auth="tokens")) as server:
        tokens = server.services.api.tokens
        reader = await tokens.create("reader", frozenset({Scope.READ}))
        admin = await tokens.create("admin", frozenset({Scope.ADMIN, Scope.READ}))

        def run() -> tuple[Any, ...]:
            with Client(server.url, token=reader.secret) as c, pytest.raises(Forbidden) as no:
                c.create_webhook(RECEIVER, ["job.failed"], SECRET)
            with Client(server.url, token=admin.secret) as client:
                hook = client.create_webhook(RECEIVER, ["job.failed"], SECRET)
            with Client(server.url, token=reader.secret) as client:
                return no.value, hook, client.list_webhooks()

        refused, hook, listed = await asyncio.to_thread(run)

    assert refused.status == 403
    assert [h.id for h in listed] == [hook.id]


def test_a_create_is_not_re_sent_after_a_lost_answer() -> None:
    tries = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal tries
        tries += 1
        raise httpx.ReadTimeout("no answer", request=request)

    client = Client("http://dtq.test", transport=httpx.MockTransport(handler), sleep=lambda s: None)
    with client, pytest.raises(TransportError):
        client.create_webhook(RECEIVER, ["job.failed"], SECRET)

    assert tries == 1  # a second try could make a second webhook


# -- the command line --------------------------------------------------------------------------


async def test_webhook_create_list_deliveries_delete(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    created = await dtq(
        "webhook", "create", "--url", RECEIVER, "--event", "job.completed,job.failed",
        "--event", "task.failed", "--secret", SECRET, "--json",
    )  # fmt: skip
    hook = json.loads(capsys.readouterr().out)
    listed = await dtq("webhook", "list")
    table = capsys.readouterr().out
    log = await dtq("webhook", "deliveries", hook["id"], "--json")
    delivery = json.loads(capsys.readouterr().out)
    deleted = await dtq("webhook", "delete", hook["id"])
    said = capsys.readouterr().out

    assert created == listed == log == deleted == 0
    assert hook["events"] == ["job.completed", "job.failed", "task.failed"]
    assert hook["id"] in table and RECEIVER in table
    assert SECRET not in table
    assert delivery["webhook_id"] == hook["id"] and delivery["delivered"] == 0
    assert said.strip() == f"webhook: deleted {hook['id']}"
    assert await server.services.api.webhooks.list() == []


async def test_webhook_create_without_a_secret_prints_a_new_one_last(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    status = await dtq("webhook", "create", "--url", RECEIVER, "--event", "job.failed")
    out = capsys.readouterr().out.splitlines()

    assert status == 0
    [hook] = await server.services.api.webhooks.list()
    assert out[0].startswith(f"webhook: created {hook.id}")
    assert hook.secret == out[-1] and len(out[-1]) >= 32


async def test_webhook_create_reads_the_secret_from_stdin(
    server: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(SECRET + "\n"))
    argv = ("webhook", "create", "--url", RECEIVER, "--event", "job.failed", "--secret", "-")

    status = await dtq(*argv)
    out = capsys.readouterr().out
    spent = await dtq(*argv)  # stdin is at its end now: an empty secret
    err = capsys.readouterr().err

    assert status == 0 and SECRET not in out
    [hook] = await server.services.api.webhooks.list()
    assert hook.secret == SECRET
    assert spent == 2 and err.strip() == "dtq: --secret: stdin gave an empty line"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["create", "--url", "ftp://x", "--event", "job.failed", "--secret", SECRET], "url"),
        (["create", "--url", RECEIVER, "--event", "job.exploded", "--secret", SECRET], "events"),
        (["create", "--url", RECEIVER, "--event", "job.failed", "--secret", "short"], "secret"),
        (["create", "--url", RECEIVER, "--event", " , ", "--secret", SECRET], "--event"),
        (["delete", "not-a-uuid"], "id"),
        (["deliveries", "00000000-0000-4000-8000-000000000000"], "not found"),
    ],
)
async def test_bad_input_is_one_line_and_exit_2(
    server: Server, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    status = await dtq("webhook", *argv)
    err = capsys.readouterr().err

    assert status == 2
    assert err.count("\n") == 1 and err.startswith("dtq: ")
    assert says in err
    assert "Traceback" not in err
    assert await server.services.api.webhooks.list() == []
