"""Webhooks on PostgreSQL (SERIALIZABLE) with receivers on loopback (issue 16 item 2, "Done
when"): a receiver that fails its first three deliveries still gets every event of a job, in
order, each signature verifying; a second webhook whose endpoint never answers does not delay
the first. The real store, the real httpx sender and the orchestrator's webhook loop; short
timeouts and backoff keep it to a few seconds."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from dtq.adapters.cockroach import CockroachStore
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.events import EventService, EventStreamPolicy
from dtq.domain.events import EVENT_TYPES
from dtq.domain.webhooks import verify
from dtq.entrypoints.config import Settings
from dtq.entrypoints.webhooks import WebhookLoop
from tests.integration.wiring import api_client, claim_ready, services_on

pytestmark = pytest.mark.integration

SECRET = "loopback-secret-0123456789"
SETTINGS = Settings(
    api_auth="none",
    events_settle=0.2,
    webhook_timeout=1.0,
    webhook_backoff_min=0.05,
    webhook_backoff_max=0.2,
    webhook_poll_interval=0.05,
)


@dataclass
class Receiver:
    """A tiny HTTP/1.1 server on 127.0.0.1: answers 500 to the first ``failures`` requests and
    204 after; with ``hang`` set it never answers at all (until the test stops it)."""

    failures: int = 0
    hang: bool = False
    requests: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)
    port: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if self.hang:
                    self.requests.append((headers, body, 0))
                    await self.release.wait()
                    return
                status = 500 if len(self.requests) < self.failures else 204
                self.requests.append((headers, body, status))
                reason = "Internal Server Error" if status == 500 else "No Content"
                writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\n\r\n".encode())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def delivered(self) -> list[dict[str, Any]]:
        """The bodies answered with a 2xx, in arrival order."""
        return [json.loads(body) for _, body, status in self.requests if 200 <= status < 300]


@contextlib.asynccontextmanager
async def listening(receiver: Receiver) -> AsyncIterator[str]:
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    receiver.port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{receiver.port}/hook"
    finally:
        receiver.release.set()
        await asyncio.sleep(0)
        server.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await server.wait_closed()


async def test_a_receiver_failing_three_times_gets_every_event_in_order_signed_while_a_hung_one_waits(  # noqa: E501
    pg_store: CockroachStore,
) -> None:
    services = services_on(pg_store, settings=SETTINGS)
    flaky, hung = Receiver(failures=3), Receiver(hang=True)
    stop = asyncio.Event()
    async with (
        listening(flaky) as flaky_url,
        listening(hung) as hung_url,
        api_client(services) as http,
    ):
        ids = {}
        for name, url in (("flaky", flaky_url), ("hung", hung_url)):
            created = await http.post(
                "/v1/webhooks", json={"url": url, "events": list(EVENT_TYPES), "secret": SECRET}
            )
            assert created.status_code == 201, created.text
            ids[name] = created.json()["id"]
        loop = asyncio.create_task(
            WebhookLoop(services.reconciler.webhooks, refresh=0.05).run(stop)
        )
        try:
            submitted = await services.api.submit.submit_job(
                SubmitJob(tasks=(TaskSpec("a", "echo"), TaskSpec("b", "echo", depends_on=("a",))))
            )
            for _ in range(2):
                claims = await claim_ready(services)
                assert len(claims) == 1
                await services.worker.execution.complete_many(claims)

            async with asyncio.timeout(30):
                while not any(e["type"] == "job.completed" for e in flaky.delivered()):
                    await asyncio.sleep(0.05)
                # The receiver records a request before it answers it, and the sender records
                # the delivery after the answer: wait for that record of the last event too.
                last = flaky.delivered()[-1]["id"]
                while True:
                    log = (await http.get(f"/v1/webhooks/{ids['flaky']}/deliveries")).json()
                    if log["cursor"] == last:
                        break
                    await asyncio.sleep(0.05)
            hung_answered = [status for _, _, status in hung.requests if status]
            hung_log = (await http.get(f"/v1/webhooks/{ids['hung']}/deliveries")).json()
        finally:
            stop.set()
            await loop

    settled = EventService(store=pg_store, policy=EventStreamPolicy(settle=0.0))
    outbox = await settled.page(after=None, job_id=submitted.job_id)
    delivered = flaky.delivered()
    assert [e["type"] for e in delivered] == [e.type for e in outbox]
    assert [e["data"] for e in delivered] == [e.data for e in outbox]
    assert len(outbox) == 10 and outbox[-1].type == "job.completed"
    # The first three tries failed and were retried: the same event each time.
    assert [status for _, _, status in flaky.requests[:4]] == [500, 500, 500, 204]
    assert len({json.loads(body)["id"] for _, body, _ in flaky.requests[:4]}) == 1
    for headers, body, _ in flaky.requests:
        assert verify(SECRET, headers["x-dtq-timestamp"], body, headers["x-dtq-signature"])
        assert headers["x-dtq-webhook-id"] == ids["flaky"]
    assert log["delivered"] == 10 and log["attempts"] == 0 and log["last_status"] == 204
    assert log["cursor"] == delivered[-1]["id"]
    # The hung endpoint got its first request and never answered; it delayed nothing above.
    assert hung.requests and hung_answered == []
    assert hung_log["delivered"] == 0 and hung_log["cursor"] is None


async def test_two_orchestrators_deliver_each_event_once_in_the_normal_case(
    pg_store: CockroachStore,
) -> None:
    services = services_on(pg_store, settings=SETTINGS)
    receiver = Receiver()
    stop = asyncio.Event()
    async with listening(receiver) as url:
        hook = await services.api.webhooks.create(url=url, events=list(EVENT_TYPES), secret=SECRET)
        # A second orchestrator: its own service and sender on the same database.
        other = services_on(pg_store, settings=SETTINGS).reconciler.webhooks
        assert other is not services.reconciler.webhooks
        loops = [
            asyncio.create_task(WebhookLoop(w, refresh=0.05).run(stop))
            for w in (services.reconciler.webhooks, other)
        ]
        try:
            submitted = await services.api.submit.submit_job(
                SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo") for i in range(5)))
            )
            claims = await claim_ready(services)
            assert len(claims) == 5
            await services.worker.execution.complete_many(claims)
            async with asyncio.timeout(30):
                while not any(e["type"] == "job.completed" for e in receiver.delivered()):
                    await asyncio.sleep(0.05)
                # recorded by the sender after the receiver's answer (see the test above)
                answered = len({e["id"] for e in receiver.delivered()})
                while (await services.api.webhooks.get(hook.id)).delivered < answered:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # room for a duplicate to show up
        finally:
            stop.set()
            await asyncio.gather(*loops)

    settled = EventService(store=pg_store, policy=EventStreamPolicy(settle=0.0))
    outbox = await settled.page(after=None, job_id=submitted.job_id)
    ids = [e["id"] for e in receiver.delivered()]
    # job.submitted, 5 x (task.queued, task.running, task.completed), job.running, job.completed
    assert len(ids) == len(set(ids)) == len(outbox) == 1 + 5 * 3 + 2
    assert [e["type"] for e in receiver.delivered()] == [e.type for e in outbox]
    assert (await services.api.webhooks.get(hook.id)).delivered == len(outbox)
