"""Webhooks on the memory adapters (issue 16 item 2): validation, the signature, the backoff
schedule, the type filter, the cursor that moves only after a 2xx, the compare-and-set that
keeps two orchestrators from sending the same event, and the ``/v1/webhooks`` routes."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from uuid import UUID, uuid4

import pytest

from dtq.application.commands import TaskSpec
from dtq.application.ports import DeliveryFailed, Transaction
from dtq.application.webhooks import WebhookPolicy, WebhookService
from dtq.domain.webhooks import (
    InvalidWebhook,
    Webhook,
    backoff_delay,
    check_events,
    check_secret,
    check_url,
    shown_url,
    signature,
    verify,
)
from tests.single import claim_one, complete_one, pop_one
from tests.unit.api_harness import running_api
from tests.unit.conftest import App

SECRET = "s3cret-s3cret-s3cret"
POLICY = WebhookPolicy(timeout=1.0, backoff_first=1.0, backoff_cap=8.0, poll_interval=0.5)


@dataclass
class Receiver:
    """A ``WebhookSender`` fake: records each request; answers ``statuses`` in turn (then 200);
    ``None`` in ``statuses`` means no response (``DeliveryFailed``)."""

    statuses: list[int | None] = field(default_factory=list)
    requests: list[tuple[str, bytes, dict[str, str]]] = field(default_factory=list)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        self.requests.append((url, body, dict(headers)))
        status = self.statuses.pop(0) if self.statuses else 200
        if status is None:
            raise DeliveryFailed("connection refused")
        return status

    async def aclose(self) -> None:
        return None

    def types(self) -> list[str]:
        return [json.loads(body)["type"] for _, body, _ in self.requests]


def service(app: App, receiver: Receiver, jitter: float = 0.0) -> WebhookService:
    return WebhookService(
        store=app.store,
        sender=receiver,
        policy=POLICY,
        jitter=lambda: jitter,
        now_seconds=lambda: 1e9,
    )


async def run_job(app: App) -> UUID:
    """Submit a one-task job and complete it: job.submitted, task.queued, task.running,
    job.running, task.completed, job.completed."""
    result = await app.submit_tasks(TaskSpec("a", "echo"))
    task_id = await pop_one(app.queue, ["default"], timeout=0)
    assert task_id is not None
    claim = await claim_one(app.execution, task_id, "w1")
    assert claim is not None
    await complete_one(app.execution, claim)
    return result.job_id


async def drain(hooks: WebhookService, webhook_id: UUID, steps: int = 50) -> None:
    """Run delivery steps until one says to wait (caught up, or backing off)."""
    for _ in range(steps):
        if await hooks.deliver_next(webhook_id) != 0.0:
            return
    raise AssertionError("never caught up")


# --- domain -------------------------------------------------------------------------------------


def test_the_signature_is_the_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"type":"job.completed"}'
    expected = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()

    assert signature(SECRET, 1700000000, body) == f"sha256={expected}"
    assert verify(SECRET, "1700000000", body, f"sha256={expected}")
    assert not verify(SECRET, "1700000001", body, f"sha256={expected}")
    assert not verify(SECRET, "1700000000", body + b" ", f"sha256={expected}")
    assert not verify("another-secret-value", "1700000000", body, f"sha256={expected}")
    assert not verify(SECRET, "17e8", body, f"sha256={expected}")


def test_backoff_doubles_from_the_first_delay_up_to_the_cap_within_its_jitter_band() -> None:
    low = [backoff_delay(n, first=1.0, cap=300.0, jitter=0.0) for n in range(1, 12)]
    high = [backoff_delay(n, first=1.0, cap=300.0, jitter=0.999999) for n in range(1, 12)]

    assert low[:5] == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert low[-1] == 150.0 and max(high) <= 300.0
    assert all(lo < hi <= 2 * lo for lo, hi in zip(low, high, strict=True))
    assert backoff_delay(10_000, first=1.0, cap=300.0, jitter=0.5) == 225.0


@pytest.mark.parametrize(
    ("check", "value", "field_name"),
    [
        (check_url, "ftp://example.com/hook", "url"),
        (check_url, "http:///no-host", "url"),
        (check_url, "example.com/hook", "url"),
        (check_url, "http://example.com:99999/", "url"),
        (check_url, "http://exa mple.com/", "url"),
        (check_url, "http://x/\u0000", "url"),
        (check_url, "http://x/\u009b", "url"),
        (check_events, ["job.done"], "events"),
        (check_events, [], "events"),
        (check_secret, "x" * 15, "secret"),
        (check_secret, "x" * 257, "secret"),
        (check_secret, "s" * 16 + "\u0000", "secret"),
    ],
)
def test_bad_webhooks_are_refused_naming_the_field(check, value, field_name) -> None:
    with pytest.raises(InvalidWebhook) as caught:
        check(value)

    assert caught.value.field == field_name


def test_a_refusal_says_why() -> None:
    long = "http://example.com/" + "a" * 2100
    with pytest.raises(InvalidWebhook) as too_long:
        check_url(long)
    with pytest.raises(InvalidWebhook) as control:
        check_url("http://x/\u0000")

    assert str(too_long.value) == f"the url has {len(long)} characters; at most 2048"
    assert "control character" in str(control.value)
    assert check_url("http://example.com/" + "a" * 2029)  # 2048 in all


def test_reads_show_a_password_in_the_url_as_stars() -> None:
    assert shown_url("https://ci:s3cret@hooks.example.com:8443/dtq?x=1") == (
        "https://ci:***@hooks.example.com:8443/dtq?x=1"
    )
    assert shown_url("https://ci@hooks.example.com/") == "https://ci@hooks.example.com/"
    assert shown_url("https://a:b:c@h/") == "https://a:***@h/"  # the password holds a colon
    assert shown_url("http://h/p?u=a:b@c") == "http://h/p?u=a:b@c"  # not a password


def test_good_values_pass_and_event_types_are_deduplicated() -> None:
    assert (
        check_url("https://hooks.example.com:8443/dtq?x=1")
        == "https://hooks.example.com:8443/dtq?x=1"
    )
    assert check_events(["job.failed", "task.failed", "job.failed"]) == (
        "job.failed",
        "task.failed",
    )
    assert check_secret("x" * 16) == "x" * 16 and check_secret("x" * 256) == "x" * 256


# --- delivery -----------------------------------------------------------------------------------


async def test_only_subscribed_events_are_sent_in_order_signed_and_to_the_url(app: App) -> None:
    receiver = Receiver()
    hooks = service(app, receiver)
    hook = await hooks.create(
        url="http://127.0.0.1:9/hook", events=["task.completed", "job.completed"], secret=SECRET
    )
    job_id = await run_job(app)

    await drain(hooks, hook.id)

    assert receiver.types() == ["task.completed", "job.completed"]
    for url, body, headers in receiver.requests:
        assert url == "http://127.0.0.1:9/hook"
        assert headers["X-Dtq-Timestamp"] == "1000000000"
        assert verify(SECRET, headers["X-Dtq-Timestamp"], body, headers["X-Dtq-Signature"])
        document = json.loads(body)
        assert document["job_id"] == str(job_id) and headers["X-Dtq-Event-Id"] == document["id"]
        assert headers["X-Dtq-Event"] == document["type"]
    state = await hooks.get(hook.id)
    assert state.delivered == 2 and state.attempts == 0 and state.last_status == 200
    # The cursor moved past every event read (the unsubscribed trailing ones too).
    assert await hooks.deliver_next(hook.id) == POLICY.poll_interval
    assert len(receiver.requests) == 2


async def test_a_failing_receiver_is_retried_with_backoff_and_gets_every_event_in_order(
    app: App,
) -> None:
    receiver = Receiver(statuses=[500, None, 503])
    hooks = service(app, receiver)
    hook = await hooks.create(
        url="http://127.0.0.1:9/", events=["job.submitted", "job.completed"], secret=SECRET
    )
    await run_job(app)

    delays: list[float] = []
    for expected_attempts in (1, 2, 3):
        delay = await hooks.deliver_next(hook.id)
        assert delay is not None
        delays.append(delay)
        state = await hooks.get(hook.id)
        assert state.attempts == expected_attempts and state.delivered == 0
        # Not due yet: nothing is sent until the backoff has passed.
        assert await hooks.deliver_next(hook.id) == pytest.approx(
            min(delays[-1], POLICY.poll_interval)
        )
        assert len(receiver.requests) == expected_attempts
        app.clock.advance(delays[-1])

    assert delays == [0.5, 1.0, 2.0]  # jitter 0: half of 1, 2, 4 s
    failed = await hooks.get(hook.id)
    assert failed.last_status == 503 and failed.last_error == "HTTP 503"
    await drain(hooks, hook.id)

    bodies = [json.loads(body) for _, body, _ in receiver.requests]
    assert [b["type"] for b in bodies] == ["job.submitted"] * 4 + ["job.completed"]
    assert len({b["id"] for b in bodies[:4]}) == 1  # the same event until it got its 2xx
    done = await hooks.get(hook.id)
    assert done.attempts == 0 and done.last_error is None and done.delivered == 2


async def test_no_response_is_recorded_without_a_status(app: App) -> None:
    receiver = Receiver(statuses=[None])
    hooks = service(app, receiver)
    hook = await hooks.create(url="http://127.0.0.1:9/", events=["job.submitted"], secret=SECRET)
    await run_job(app)

    await hooks.deliver_next(hook.id)

    state = await hooks.get(hook.id)
    assert state.last_status is None and state.last_error == "connection refused"
    assert state.next_attempt_at is not None and state.last_attempt_at is not None
    assert state.next_attempt_at > state.last_attempt_at


async def test_a_second_orchestrator_does_not_send_the_event_the_first_holds(app: App) -> None:
    first, second = Receiver(), Receiver()
    one, two = service(app, first), service(app, second)
    hook = await one.create(url="http://127.0.0.1:9/", events=["job.submitted"], secret=SECRET)
    await run_job(app)
    taken = await app.store.run(lambda tx: one._take(tx, hook.id))
    assert not isinstance(taken, float | None)

    assert await two.deliver_next(hook.id) == pytest.approx(POLICY.poll_interval)
    assert second.requests == []


async def test_the_state_write_is_a_compare_and_set_on_the_cursor_and_next_attempt(
    app: App,
) -> None:
    hooks = service(app, Receiver())
    hook = await hooks.create(url="http://127.0.0.1:9/", events=["job.submitted"], secret=SECRET)
    later = hook.held(hook.created_at.replace(year=hook.created_at.year + 1))

    async def cas(tx: Transaction, expected: Webhook, new: Webhook) -> bool:
        return await tx.webhooks.replace(expected, new)

    assert await app.store.run(lambda tx: cas(tx, hook, later))
    assert not await app.store.run(lambda tx: cas(tx, hook, hook))  # stale expected: refused
    assert (await hooks.get(hook.id)).next_attempt_at == later.next_attempt_at
    moved = later.skipped_to(later.cursor_at, uuid4())
    assert await app.store.run(lambda tx: cas(tx, later, moved))
    assert not await app.store.run(lambda tx: cas(tx, later, later))
    await hooks.delete(hook.id)
    assert not await app.store.run(lambda tx: cas(tx, moved, moved))


async def test_a_deleted_webhook_ends_its_delivery(app: App) -> None:
    hooks = service(app, Receiver())
    hook = await hooks.create(url="http://127.0.0.1:9/", events=["job.submitted"], secret=SECRET)
    await hooks.delete(hook.id)

    assert await hooks.deliver_next(hook.id) is None


async def test_a_rolled_back_try_writes_no_webhook(app: App) -> None:
    hooks = service(app, Receiver())
    app.store.inject_conflicts(1)
    hook = await hooks.create(url="http://127.0.0.1:9/", events=["job.submitted"], secret=SECRET)

    assert [h.id for h in await hooks.list()] == [hook.id]


# --- API ----------------------------------------------------------------------------------------


async def test_the_routes_create_list_read_the_log_and_delete_never_showing_the_secret() -> None:
    async with running_api() as api:
        created = await api.client.post(
            "/v1/webhooks",
            json={"url": "https://example.com/h", "events": ["job.failed"], "secret": SECRET},
        )
        assert created.status_code == 201, created.text
        body = created.json()
        assert set(body) == {"id", "url", "events", "created_at"}
        assert created.headers["Location"] == f"/v1/webhooks/{body['id']}"
        listed = (await api.client.get("/v1/webhooks")).json()
        log = await api.client.get(f"/v1/webhooks/{body['id']}/deliveries")
        gone = await api.client.delete(f"/v1/webhooks/{body['id']}")
        again = await api.client.delete(f"/v1/webhooks/{body['id']}")
        missing_log = await api.client.get(f"/v1/webhooks/{uuid4()}/deliveries")
        bad_id = await api.client.get("/v1/webhooks/nope/deliveries")

    assert listed == {"webhooks": [body]}
    assert SECRET not in created.text + log.text + json.dumps(listed)
    assert log.status_code == 200 and log.json() == {
        "webhook_id": body["id"],
        "cursor": None,
        "delivered": 0,
        "attempts": 0,
        "last_status": None,
        "last_error": None,
        "last_attempt_at": None,
        "next_attempt_at": log.json()["next_attempt_at"],
    }
    assert gone.status_code == 204 and again.status_code == 404
    assert missing_log.status_code == 404 and bad_id.status_code == 400
    assert bad_id.json()["error"]["field"] == "id"


async def test_the_routes_never_show_a_password_in_the_url_and_deliver_with_it(app: App) -> None:
    url = "https://ci:s3cret@example.com/h"
    async with running_api() as api:
        created = await api.client.post(
            "/v1/webhooks", json={"url": url, "events": ["job.failed"], "secret": SECRET}
        )
        listed = (await api.client.get("/v1/webhooks")).json()
    receiver = Receiver()
    hooks = service(app, receiver)
    hook = await hooks.create(url=url, events=["job.completed"], secret=SECRET)
    await run_job(app)
    await drain(hooks, hook.id)

    assert created.json()["url"] == "https://ci:***@example.com/h"
    assert listed["webhooks"][0]["url"] == "https://ci:***@example.com/h"
    assert "s3cret" not in created.text + json.dumps(listed)
    assert [sent for sent, _, _ in receiver.requests] == [url]


@pytest.mark.parametrize(
    ("change", "field_name"),
    [
        ({"url": "file:///etc/passwd"}, "url"),
        ({"events": ["job.exploded"]}, "events"),
        ({"events": []}, "events"),
        ({"secret": "short"}, "secret"),
        ({"url": 5}, "url"),
        ({"extra": 1}, "extra"),
    ],
)
async def test_bad_bodies_are_400_naming_the_field(
    change: dict[str, object], field_name: str
) -> None:
    body = {"url": "http://127.0.0.1:9/", "events": ["job.failed"], "secret": SECRET, **change}
    async with running_api() as api:
        response = await api.client.post("/v1/webhooks", json=body)
        listed = (await api.client.get("/v1/webhooks")).json()

    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field_name, response.text
    assert listed == {"webhooks": []}
