"""Per-task retry policy (issue 14 item 3): the pure delay rule and the failure path."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dtq.application.commands import TaskSpec
from dtq.application.execution import ExecutionService
from dtq.domain.policy import RetryPolicy, retry_delay
from tests.single import claim_one, pop_one
from tests.unit.conftest import App

S = timedelta(seconds=1)
DEFAULT = 5 * S


def never(_: object = None) -> float:
    raise AssertionError("no jitter asked, no random number drawn")


@pytest.mark.parametrize(
    ("policy", "attempt", "expected"),
    [
        (None, 3, DEFAULT),
        (RetryPolicy(), 4, DEFAULT),
        (RetryPolicy(delay=2 * S), 4, 2 * S),
        (RetryPolicy(backoff="exponential", delay=2 * S), 1, 2 * S),
        (RetryPolicy(backoff="exponential", delay=2 * S), 2, 4 * S),
        (RetryPolicy(backoff="exponential", delay=2 * S), 4, 16 * S),
        (RetryPolicy(backoff="exponential", delay=2 * S, max_delay=10 * S), 4, 10 * S),
        (RetryPolicy(backoff="exponential"), 3, 4 * DEFAULT),
        (RetryPolicy(backoff="exponential", delay=S), 100, timedelta(days=366)),
    ],
)
def test_retry_delay(policy: RetryPolicy | None, attempt: int, expected: timedelta) -> None:
    assert retry_delay(policy, attempt=attempt, default=DEFAULT, rand=never) == expected


def test_jitter_keeps_the_delay_within_half_and_whole() -> None:
    policy = RetryPolicy(backoff="exponential", delay=4 * S, jitter=True)
    assert retry_delay(policy, attempt=2, default=DEFAULT, rand=lambda: 0.0) == 4 * S
    assert retry_delay(policy, attempt=2, default=DEFAULT, rand=lambda: 0.5) == 6 * S
    assert retry_delay(policy, attempt=2, default=DEFAULT, rand=lambda: 0.999) < 8 * S


def test_policy_json_round_trip() -> None:
    policy = RetryPolicy(backoff="exponential", delay=S / 2, max_delay=600 * S, jitter=True)
    assert RetryPolicy.from_json(policy.to_json()) == policy
    assert RetryPolicy.from_json(None) is None


async def test_exponential_retries_are_scheduled_at_growing_gaps(app: App) -> None:
    app.execution = ExecutionService(
        store=app.store, queue=app.queue, policy=app.execution.policy, rand=lambda: 0.5
    )
    policy = RetryPolicy(backoff="exponential", delay=2 * S, max_delay=5 * S, jitter=True)
    result = await app.submit_tasks(TaskSpec("a", "echo", max_attempts=4, retry_policy=policy))
    task_id = result.task_ids["a"]
    gaps = []
    for _ in range(3):
        assert await pop_one(app.queue, ["default"], timeout=0) == task_id
        claim = await claim_one(app.execution, task_id, "w1")
        assert claim is not None
        outcome = await app.execution.fail(claim, "boom")
        assert outcome.retry_at is not None
        gaps.append(outcome.retry_at - app.clock.now())
        app.clock.advance(gaps[-1].total_seconds())
        assert await app.reconcile.promote_scheduled() == 1
    # 2 s, 4 s, then 8 s capped at 5 s; each times 0.75 (jitter with rand() = 0.5)
    assert gaps == [1.5 * S, 3 * S, 3.75 * S]
