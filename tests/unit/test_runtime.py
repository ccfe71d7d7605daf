"""The worker runtime against the memory adapters with a real event loop (spec §5, §6)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from uuid import uuid4

import pytest
import structlog
from structlog.testing import capture_logs

from dtq.application.commands import TaskSpec
from dtq.application.ports import Lease
from dtq.domain.errors import DuplicateKind
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from dtq.entrypoints.worker.runtime import demo_runtime
from dtq.worker import Options, PermanentError, Runtime, Task
from tests.unit.runtime_harness import SETTINGS, build_harness

pytestmark = pytest.mark.timeout(20)

#: Short timings: a quick lease heartbeat and pops that return fast so the test stops fast.
FAST = Options(lease_renew_every=0.1, shutdown_grace=1.0, poll_timeout=0.05)


# -- registration -----------------------------------------------------------------------------


def test_registering_a_kind_twice_raises_duplicate_kind() -> None:
    runtime = Runtime()
    runtime.register("email.send", lambda task: None)

    with pytest.raises(DuplicateKind):
        runtime.register("email.send", lambda task: None)


def test_decorator_registers_and_returns_the_function() -> None:
    runtime = Runtime()

    @runtime.handler("a")
    async def handle(task: Task) -> None:
        return None

    assert runtime.kinds == ("a",)
    assert handle.__name__ == "handle"
    with pytest.raises(DuplicateKind):
        runtime.handler("a")(handle)


@pytest.mark.parametrize("bad", [None, 42, "not a function"])
def test_non_callable_handler_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="not callable"):
        Runtime().register("k", bad)  # type: ignore[arg-type]


def test_empty_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="kind"):
        Runtime().register("", lambda task: None)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"default_timeout": 0},
        {"lease_renew_every": 0},
        {"concurrency": 0},
        {"shutdown_grace": -1},
        {"sync_threads": 0},
        {"priorities": ()},
        {"claim_batch": 0},
        {"complete_batch": 0},
    ],
)
def test_options_reject_out_of_range_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must"):
        Options(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"default_timeout": float("nan")},
            ValueError,
            "Options.default_timeout must be a positive finite number of seconds or None, not nan",
        ),
        ({"default_timeout": float("inf")}, ValueError, "Options.default_timeout must be"),
        (
            {"default_timeout": "60"},
            TypeError,
            "Options.default_timeout must be a number of seconds or None, not '60'",
        ),
        ({"default_timeout": True}, TypeError, "Options.default_timeout must be a number"),
        ({"lease_renew_every": float("nan")}, ValueError, "Options.lease_renew_every must be"),
        ({"lease_renew_every": float("inf")}, ValueError, "Options.lease_renew_every must be"),
        ({"poll_timeout": float("nan")}, ValueError, "Options.poll_timeout must be"),
        ({"poll_timeout": "1"}, TypeError, "Options.poll_timeout must be a number"),
        ({"shutdown_grace": float("nan")}, ValueError, "Options.shutdown_grace must be"),
        ({"shutdown_grace": float("inf")}, ValueError, "Options.shutdown_grace must be"),
        (
            {"concurrency": 1.5},
            TypeError,
            "Options.concurrency must be a positive integer or None, not 1.5",
        ),
        ({"concurrency": True}, TypeError, "Options.concurrency must be a positive integer"),
        ({"concurrency": 4097}, ValueError, "Options.concurrency must be at most 4096, not 4097"),
        ({"sync_threads": 2.0}, TypeError, "Options.sync_threads must be a positive integer"),
        ({"claim_batch": "8"}, TypeError, "Options.claim_batch must be a positive integer"),
        ({"complete_batch": 1.5}, TypeError, "Options.complete_batch must be a positive integer"),
        (
            {"priorities": "default"},
            TypeError,
            "Options.priorities must be a sequence of priority names, not the str 'default'",
        ),
        ({"priorities": 5}, TypeError, "Options.priorities must be a sequence of priority names"),
        (
            {"priorities": ("a b",)},
            ValueError,
            "Options.priorities: 'a b' is not a priority: 1 to 32 characters of a-z, 0-9, '_' or",
        ),
        ({"priorities": ("High",)}, ValueError, "Options.priorities: 'High' is not a priority"),
        (
            {"priorities": ("x" * 33,)},
            ValueError,
            "Options.priorities: 'xxxxxxxxxxxxxxxxxxxx...' (33 characters) is not a priority",
        ),
        ({"priorities": (5,)}, ValueError, "Options.priorities: 5 is not a priority"),
    ],
)
def test_options_refuse_values_that_would_break_at_run_time_naming_the_field(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    """NaN timed every attempt out with 'cannot convert float NaN to integer', 1.5 slots never
    claimed, a str was split into one tier per letter, 'a b' is a tier no submit can use."""
    with pytest.raises(error) as caught:
        Options(**kwargs)  # type: ignore[arg-type]

    assert str(caught.value).startswith(message), caught.value
    assert "\n" not in str(caught.value)


def test_options_take_any_sequence_of_valid_priorities_as_a_tuple() -> None:
    options = Options(
        priorities=["high", "default"],  # type: ignore[arg-type]
        concurrency=4096,
        default_timeout=1,
    )

    assert options.priorities == ("high", "default")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("a b", "kind 'a b' is refused by the API: 1 to 200 characters of letters, digits,"),
        ("x" * 300, "kind 'xxxxxxxxxxxxxxxxxxxx...' (300 characters) is refused by the API: 1 to"),
        ("echo\n", "kind 'echo\\n' is refused by the API"),
        ("é", "kind 'é' is refused by the API"),
        (" ", "kind ' ' is refused by the API"),
        (5, "kind 5 is refused by the API"),
    ],
)
def test_a_kind_the_api_refuses_cannot_be_registered(kind: object, message: str) -> None:
    """Such a handler could never receive a task: every submit of its kind is a 400."""
    runtime = Runtime()

    with pytest.raises(ValueError, match="is refused by the API") as caught:
        runtime.register(kind, lambda task: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is refused by the API"):
        runtime.handler(kind)(lambda task: None)  # type: ignore[arg-type]

    assert str(caught.value).startswith(message), caught.value
    assert runtime.kinds == ()


def test_the_longest_kind_the_api_accepts_can_be_registered() -> None:
    runtime = Runtime()
    runtime.register("a." + "x" * 198, lambda task: None)

    assert len(runtime.kinds[0]) == 200


# -- outcomes ---------------------------------------------------------------------------------


async def test_handler_success_completes_the_task_and_job() -> None:
    h = build_harness()
    seen: list[Task] = []
    runtime = Runtime(FAST)

    @runtime.handler("echo")
    async def echo(task: Task) -> None:
        seen.append(task)

    task_id = await h.one("echo", {"n": 1})
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED])
        job = await h.wait_job(view.task.job_id)

    assert job.job.status is JobStatus.COMPLETED
    assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert view.runs[0].worker_id == SETTINGS.worker_id
    assert seen == [
        Task(id=task_id, job_id=view.task.job_id, kind="echo", payload={"n": 1}, attempt=1)
    ]
    assert h.queue.get_lease(task_id) is None
    assert not h.queue.has_marker(task_id)
    assert h.counter("worker_tasks_claimed_total", kind="echo") == 1
    assert h.counter("worker_tasks_succeeded_total", kind="echo") == 1


async def test_a_registered_kinds_counters_exist_at_zero_before_its_first_task() -> None:
    """``rate()`` and ``increase()`` see an increment only from a series that existed before
    it: a kind's first failure would escape the failure-ratio alert."""
    h = build_harness()
    runtime = Runtime(FAST)
    runtime.register("echo", lambda task: None)
    async with h.running(runtime, reconcile=False):
        await asyncio.sleep(0.05)
        for name in (
            "worker_tasks_claimed_total",
            "worker_tasks_succeeded_total",
            "worker_tasks_failed_total",
            "worker_tasks_retried_total",
            "worker_lease_extensions_total",
            "worker_lease_losses_total",
        ):
            assert h.metrics.registry.get_sample_value(name, {"kind": "echo"}) == 0.0, name


async def test_failures_are_retried_until_the_handler_succeeds() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("flaky")
    async def flaky(task: Task) -> None:
        if task.attempt < 3:
            raise RuntimeError(f"boom {task.attempt}")

    task_id = await h.one("flaky", max_attempts=3)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED, TaskStatus.FAILED])
        job = await h.wait_job(view.task.job_id)

    assert view.task.status is TaskStatus.COMPLETED
    assert job.job.status is JobStatus.COMPLETED
    assert [(r.attempt_number, r.status, r.error) for r in view.runs] == [
        (1, RunStatus.FAILED, "RuntimeError: boom 1"),
        (2, RunStatus.FAILED, "RuntimeError: boom 2"),
        (3, RunStatus.SUCCEEDED, None),
    ]
    assert h.counter("worker_tasks_failed_total", kind="flaky") == 2
    assert h.counter("worker_tasks_retried_total", kind="flaky") == 2


async def test_exhausted_retries_fail_the_task_and_cascade_to_dependents() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    ran: list[str] = []

    @runtime.handler("boom")
    def boom(task: Task) -> None:
        raise ValueError("always")

    @runtime.handler("never")
    def never(task: Task) -> None:
        ran.append("never")

    result = await h.submit_tasks(
        TaskSpec(name="a", kind="boom", max_attempts=2),
        TaskSpec(name="b", kind="never", depends_on=("a",)),
        TaskSpec(name="c", kind="never", depends_on=("b",)),
    )
    async with h.running(runtime):
        job = await h.wait_job(result.job_id)

    assert job.job.status is JobStatus.FAILED
    status = {t.name: t.status for t in job.tasks}
    assert status == {"a": TaskStatus.FAILED, "b": TaskStatus.FAILED, "c": TaskStatus.FAILED}
    a = await h.task(result.task_ids["a"])
    assert [r.status for r in a.runs] == [RunStatus.FAILED, RunStatus.FAILED]
    assert a.task.last_error == "ValueError: always"
    c = await h.task(result.task_ids["c"])
    assert c.runs == []
    assert c.task.last_error == "dependency 'b' failed"
    assert ran == []
    assert h.counter("worker_tasks_retried_total", kind="boom") == 1


async def test_permanent_error_skips_the_remaining_retries() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("strict")
    async def strict(task: Task) -> None:
        raise PermanentError("payload has no 'to'")

    task_id = await h.one("strict", {}, max_attempts=5)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    assert [(r.status, r.error) for r in view.runs] == [
        (RunStatus.FAILED, "PermanentError: payload has no 'to'")
    ]
    assert h.counter("worker_tasks_retried_total", kind="strict") == 0


async def test_handler_timeout_is_a_failed_attempt() -> None:
    h = build_harness()
    runtime = Runtime(replace(FAST, default_timeout=0.15))
    cancelled = asyncio.Event()

    @runtime.handler("slow")
    async def slow(task: Task) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task_id = await h.one("slow", max_attempts=1)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    assert cancelled.is_set()
    assert [(r.status, r.error) for r in view.runs] == [
        (RunStatus.FAILED, "timed out after 0.15 s")
    ]


async def test_a_sync_handler_past_its_deadline_fails_the_attempt() -> None:
    h = build_harness()
    runtime = Runtime(replace(FAST, default_timeout=0.1))

    @runtime.handler("stuck")
    def stuck(task: Task) -> None:
        time.sleep(0.4)  # a thread cannot be cancelled: the runtime stops waiting for it

    task_id = await h.one("stuck", max_attempts=1)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    assert [(r.status, r.error) for r in view.runs] == [(RunStatus.FAILED, "timed out after 0.1 s")]


async def test_a_handler_raising_its_own_timeout_error_is_not_reported_as_the_deadline() -> None:
    h = build_harness()
    runtime = Runtime(replace(FAST, default_timeout=5.0))

    @runtime.handler("net")
    async def net(task: Task) -> None:
        raise TimeoutError("upstream did not answer")

    task_id = await h.one("net", max_attempts=1)
    async with h.running(runtime):
        view = await h.wait_task(task_id, [TaskStatus.FAILED])

    assert view.runs[0].error == "TimeoutError: upstream did not answer"


async def test_a_kind_without_handler_is_routed_away_not_failed() -> None:
    """Kind-aware routing (issue 15 item 2) replaced the spec's "unknown kind fails": the worker
    does not claim a task it has no handler for; it waits, queued, for a worker of its kind."""
    h = build_harness()
    runtime = Runtime(FAST)
    runtime.register("known", lambda task: None)

    task_id = await h.one("mystery", max_attempts=3)
    async with h.running(runtime):
        while h.queue.routed_ids("default", "mystery") != [task_id]:
            await asyncio.sleep(0.01)
        view = await h.task(task_id)

    assert view.task.status is TaskStatus.QUEUED and view.runs == []
    assert h.counter("worker_unknown_kind_total") == 0


# -- lease ------------------------------------------------------------------------------------


async def test_heartbeat_keeps_a_long_handler_leased() -> None:
    h = build_harness()
    # lease_renew_every 5 s is capped to lease_duration / 3 = 0.2 s, or the lease would lapse.
    runtime = Runtime(replace(FAST, lease_renew_every=5.0))

    @runtime.handler("long")
    async def long(task: Task) -> None:
        await asyncio.sleep(2 * 0.6)  # two lease durations

    task_id = await h.one("long", max_attempts=1)
    async with h.running(runtime):
        # The reclaimer runs throughout: it must never find the task without a lease.
        async def reclaimer() -> int:
            total = 0
            while True:
                total += await h.reconcile.reclaim_stale()
                view = await h.task(task_id)
                if view.task.status.terminal:
                    return total
                await asyncio.sleep(0.05)

        assert await reclaimer() == 0

    view = await h.task(task_id)
    assert [r.status for r in view.runs] == [RunStatus.SUCCEEDED]
    assert h.counter("worker_lease_extensions_total", kind="long") >= 4


async def test_lost_lease_cancels_the_handler_and_records_nothing() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    calls = 0
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @runtime.handler("job")
    async def job(task: Task) -> None:
        nonlocal calls
        calls += 1
        if calls > 1:
            return  # the redelivery succeeds at once
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task_id = await h.one("job", max_attempts=1)
    async with h.running(runtime):
        await asyncio.wait_for(started.wait(), 5)
        first = (await h.task(task_id)).runs[0]
        # Another run takes the lease over (as after a reclaim and a new claim elsewhere).
        usurper = Lease(task_id, "other-worker", uuid4(), deadline_ms=0)
        await h.queue.set_leases([usurper], ttl=0.3)
        await asyncio.wait_for(cancelled.wait(), 5)

        view = await h.task(task_id)
        assert view.task.status is TaskStatus.RUNNING  # nothing was recorded for the run
        assert [r.status for r in view.runs] == [RunStatus.RUNNING]
        assert h.counter("worker_lease_losses_total", kind="job") == 1

        # The usurper's lease lapses; the reconciler reclaims the abandoned run and the task
        # is delivered again.
        await asyncio.sleep(0.35)
        assert await h.reconcile.reclaim_stale() == 1
        view = await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert [(r.id == first.id, r.status) for r in view.runs] == [
        (True, RunStatus.DEAD),
        (False, RunStatus.SUCCEEDED),
    ]
    assert view.runs[1].attempt_number == 1  # the lost run cost no retry
    assert calls == 2


async def test_a_sync_handler_that_outlives_a_lost_lease_reports_nothing() -> None:
    h = build_harness()
    runtime = Runtime(FAST)
    started = threading.Event()
    finished = threading.Event()

    @runtime.handler("blocking")
    def blocking(task: Task) -> None:
        started.set()
        time.sleep(0.5)
        finished.set()

    task_id = await h.one("blocking", max_attempts=1)
    async with h.running(runtime, reconcile=False):
        await asyncio.to_thread(started.wait, 5)
        await h.queue.set_leases([Lease(task_id, "other", uuid4(), deadline_ms=0)], ttl=30)
        await asyncio.to_thread(finished.wait, 5)
        await asyncio.sleep(0.2)  # the late result has come back to the loop by now
        view = await h.task(task_id)

    assert [r.status for r in view.runs] == [RunStatus.RUNNING]
    assert h.counter("worker_tasks_succeeded_total", kind="blocking") == 0


# -- concurrency ------------------------------------------------------------------------------


async def test_sync_handlers_run_in_threads_and_do_not_block_other_loops() -> None:
    h = build_harness()
    runtime = Runtime(replace(FAST, concurrency=2))
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    @runtime.handler("cpu")
    def cpu(task: Task) -> None:
        begin = time.monotonic()
        time.sleep(0.4)
        with lock:
            spans.append((begin, time.monotonic()))

    result = await h.submit_tasks(TaskSpec(name="x", kind="cpu"), TaskSpec(name="y", kind="cpu"))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    tick = asyncio.create_task(ticker())
    async with h.running(runtime):
        job = await h.wait_job(result.job_id)
    tick.cancel()

    assert job.job.status is JobStatus.COMPLETED
    (_, a_end), (b_start, _) = sorted(spans)
    assert b_start < a_end  # the two handlers overlapped in time
    assert ticks >= 10  # and the event loop kept turning meanwhile


# -- logging ----------------------------------------------------------------------------------


async def test_task_log_lines_carry_the_task_fields() -> None:
    h = build_harness()
    runtime = Runtime(FAST)

    @runtime.handler("fails")
    async def fails(task: Task) -> None:
        raise RuntimeError("nope")

    task_id = await h.one("fails", max_attempts=1)
    with capture_logs() as logs:
        async with h.running(runtime):
            await h.wait_task(task_id, [TaskStatus.FAILED])

    failed = [e for e in logs if e["event"] == "task failed"]
    assert len(failed) == 1
    assert {k: failed[0][k] for k in ("task_id", "kind", "attempt", "error")} == {
        "task_id": str(task_id),
        "kind": "fails",
        "attempt": 1,
        "error": "RuntimeError: nope",
    }
    assert "job_id" in failed[0]


async def test_each_handler_call_carries_its_own_jobs_id_in_the_log_context() -> None:
    """The runner keeps the text of the last job id it saw; tasks of two jobs interleaved
    must each log under their own job."""
    h = build_harness()
    runtime = Runtime(replace(FAST, claim_batch=1))
    seen: list[tuple[str, str, str]] = []

    @runtime.handler("ctx")
    async def ctx(task: Task) -> None:
        bound = structlog.contextvars.get_contextvars()
        seen.append((str(task.job_id), bound["job_id"], bound["task_id"]))

    first = await h.one("ctx")
    second = await h.one("ctx")
    third = await h.one("ctx")
    async with h.running(runtime):
        for task_id in (first, second, third):
            await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert len(seen) == 3
    assert len({job for job, _, _ in seen}) == 3  # three jobs
    assert all(job == bound for job, bound, _ in seen)
    assert {task for _, _, task in seen} == {str(first), str(second), str(third)}


async def test_demo_runtime_echo_logs_kind_attempt_and_payload() -> None:
    h = build_harness()
    runtime = demo_runtime(FAST)
    task_id = await h.one("echo", {"hello": "world"})

    with capture_logs() as logs:
        async with h.running(runtime):
            await h.wait_task(task_id, [TaskStatus.COMPLETED])

    assert runtime.kinds == ("echo",)
    assert 'echo: kind=echo attempt=1 payload={"hello":"world"}' in [e["event"] for e in logs]
