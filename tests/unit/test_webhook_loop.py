"""The orchestrator's webhook loop on the memory adapters (issue 16 item 2): it starts a
delivery task for a webhook created while it runs, ends a deleted webhook's task, carries on
through a database outage, and stops when told to."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from dtq.application.webhooks import WebhookPolicy, WebhookService
from dtq.entrypoints.webhooks import WebhookLoop
from tests.unit.conftest import App
from tests.unit.test_webhooks import SECRET, Receiver, run_job

FAST = WebhookPolicy(timeout=1.0, backoff_first=0.01, backoff_cap=0.02, poll_interval=0.01)


async def until(condition: object, seconds: float = 10.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)


async def test_the_loop_follows_new_and_deleted_webhooks_and_survives_an_outage(app: App) -> None:
    first, second = Receiver(), Receiver()
    senders = {"http://127.0.0.1:9/1": first, "http://127.0.0.1:9/2": second}

    class Routed:
        async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
            return await senders[url].post(url, body, headers)

        async def aclose(self) -> None:
            return None

    hooks = WebhookService(store=app.store, sender=Routed(), policy=FAST)
    one = await hooks.create(url="http://127.0.0.1:9/1", events=["job.completed"], secret=SECRET)
    stop = asyncio.Event()
    loop = asyncio.create_task(WebhookLoop(hooks).run(stop))
    try:
        job_a = await run_job(app)
        await until(lambda: len(first.requests) >= 1)
        app.clock.advance(1.0)  # the fake clock: webhook two starts after job A's events

        two = await hooks.create(
            url="http://127.0.0.1:9/2", events=["job.completed"], secret=SECRET
        )
        await hooks.delete(one.id)
        app.store.available = False
        await asyncio.sleep(0.05)  # steps and list reads fail meanwhile; the loop carries on
        app.store.available = True
        job_b = await run_job(app)
        await until(lambda: len(second.requests) >= 1)
        await asyncio.sleep(0.05)
    finally:
        stop.set()
        async with asyncio.timeout(5):
            await loop

    assert [json.loads(b)["job_id"] for _, b, _ in first.requests] == [str(job_a)]
    assert [json.loads(b)["job_id"] for _, b, _ in second.requests] == [str(job_b)]
    assert (await hooks.get(two.id)).delivered == 1
