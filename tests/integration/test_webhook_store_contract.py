"""The ``WebhookRepository`` contract (``tx.webhooks``, issue 16 item 2), run against the
in-memory fake and against PostgreSQL, like ``test_store_contract.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar
from uuid import uuid4

from dtq.application.ports import Store, Transaction
from dtq.domain.webhooks import Webhook

T = TypeVar("T")


async def run(store: Store, fn: Callable[[Transaction], Awaitable[T]]) -> T:
    return await store.run(fn)


async def new_webhook(store: Store, url: str = "http://127.0.0.1:9/h") -> Webhook:
    now = await run(store, lambda tx: tx.now())
    hook = Webhook.create(
        id=uuid4(), url=url, events=["job.failed", "task.failed"], secret="x" * 20, at=now
    )
    await run(store, lambda tx: tx.webhooks.add(hook))
    return hook


async def test_a_webhook_reads_back_as_written_and_lists_oldest_first(store: Store) -> None:
    first = await new_webhook(store, "http://127.0.0.1:9/a")
    second = await new_webhook(store, "https://example.com/b")

    got = await run(store, lambda tx: tx.webhooks.get(first.id))
    listed = await run(store, lambda tx: tx.webhooks.list_all())

    assert got == first
    assert sorted(listed, key=lambda w: (w.created_at, w.id)) == listed
    assert {w.id for w in listed} == {first.id, second.id}
    assert await run(store, lambda tx: tx.webhooks.get(uuid4())) is None


async def test_replace_writes_the_delivery_state_only_from_the_expected_one(store: Store) -> None:
    hook = await new_webhook(store)
    now = await run(store, lambda tx: tx.now())
    held = hook.held(now + timedelta(seconds=11))
    failed = held.failed(status=503, error="HTTP 503", at=now, delay=2.5)
    event_id = uuid4()
    delivered = failed.delivered_to(now, event_id, status=204, at=now + timedelta(seconds=3))

    assert await run(store, lambda tx: tx.webhooks.replace(hook, held))
    assert not await run(store, lambda tx: tx.webhooks.replace(hook, failed))  # stale
    assert await run(store, lambda tx: tx.webhooks.replace(held, failed))
    assert await run(store, lambda tx: tx.webhooks.get(hook.id)) == failed
    assert await run(store, lambda tx: tx.webhooks.replace(failed, delivered))
    assert not await run(store, lambda tx: tx.webhooks.replace(failed, delivered))

    got = await run(store, lambda tx: tx.webhooks.get(hook.id))
    assert got == delivered
    assert got is not None and got.cursor_id == event_id and got.delivered == 1
    assert got.last_error is None and got.attempts == 0


async def test_two_concurrent_compare_and_sets_from_one_state_let_exactly_one_win(
    store: Store,
) -> None:
    hook = await new_webhook(store)
    now = await run(store, lambda tx: tx.now())
    a = hook.held(now + timedelta(seconds=10))
    b = hook.held(now + timedelta(seconds=20))

    won = await asyncio.gather(
        run(store, lambda tx: tx.webhooks.replace(hook, a)),
        run(store, lambda tx: tx.webhooks.replace(hook, b)),
    )

    assert sorted(won) == [False, True]
    stored = await run(store, lambda tx: tx.webhooks.get(hook.id))
    assert stored == (a if won[0] else b)


async def test_delete_removes_it_once(store: Store) -> None:
    hook = await new_webhook(store)

    assert await run(store, lambda tx: tx.webhooks.delete(hook.id))
    assert not await run(store, lambda tx: tx.webhooks.delete(hook.id))
    assert await run(store, lambda tx: tx.webhooks.get(hook.id)) is None
    assert not await run(store, lambda tx: tx.webhooks.replace(hook, hook.held(hook.created_at)))
