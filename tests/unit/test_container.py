"""The composition root: one shared store and queue, overridable providers, resources closed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from dependency_injector import providers

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.entrypoints.bundles import WorkerServices
from dtq.entrypoints.config import ConfigError, Settings
from dtq.entrypoints.container import build_container, open_services, open_worker_services


def one_task_job(kind: str = "echo") -> SubmitJob:
    return SubmitJob(tasks=(TaskSpec(name="only", kind=kind, payload={"n": 1}),))


async def test_memory_services_share_one_store_and_one_queue() -> None:
    async with open_services(Settings(), backend="memory") as services:
        result = await services.api.submit.submit_job(one_task_job())
        view = await services.api.queries.get_task(result.task_ids["only"])

        assert isinstance(services.store, InMemoryStore)
        assert isinstance(services.queue, InMemoryQueue)
        assert view.task.kind == "echo"
        assert services.queue.has_marker(view.task.id)
        assert await services.api.health.check() == {"store": None, "queue": None}


async def test_the_pending_marker_ttl_comes_from_the_settings() -> None:
    clock = FakeClock()
    container = build_container(Settings(pending_marker_ttl=5.0), backend="memory")
    container.clock.override(providers.Object(clock))

    async with open_services(container.settings(), backend="memory", container=container) as s:
        result = await s.api.submit.submit_job(one_task_job())
        task_id = result.task_ids["only"]
        queue = s.queue
        assert isinstance(queue, InMemoryQueue)
        clock.advance(4.9)
        assert queue.has_marker(task_id)
        clock.advance(0.2)
        assert not queue.has_marker(task_id)


def test_the_push_breakers_trial_timeout_comes_from_the_settings() -> None:
    container = build_container(Settings(redis_push_trial_timeout=1.5), backend="memory")

    assert container.push_breaker().trial_timeout == 1.5


async def test_the_execution_policy_comes_from_the_settings() -> None:
    settings = Settings(lease_duration=7.0, retry_backoff=2.0, stale_running_after=9.0)

    async with open_services(settings, backend="memory") as services:
        policy = services.worker.execution.policy

    assert (policy.lease_duration, policy.retry_backoff, policy.stale_running_after) == (
        7.0,
        2.0,
        9.0,
    )


async def test_providers_can_be_overridden_with_fakes() -> None:
    clock = FakeClock()
    fake_store = InMemoryStore(clock)
    fake_queue = InMemoryQueue(clock)
    container = build_container(Settings(), backend="memory")
    container.store.override(providers.Object(fake_store))
    container.queue.override(providers.Object(fake_queue))

    async with open_services(Settings(), backend="memory", container=container) as services:
        result = await services.api.submit.submit_job(one_task_job())

    assert services.store is fake_store
    assert services.queue is fake_queue
    assert fake_queue.ready_ids("default") == [result.task_ids["only"]]


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def resource(
        self, name: str, value: object, *, fail: bool = False
    ) -> providers.Resource[object]:
        async def init() -> AsyncIterator[object]:
            self.events.append(f"open {name}")
            if fail:
                raise ConnectionError(f"{name} unreachable")
            try:
                yield value
            finally:
                self.events.append(f"close {name}")

        return providers.Resource(init)


async def test_real_resources_are_opened_once_and_closed_on_exit() -> None:
    clock = FakeClock()
    recorder = Recorder()
    settings = Settings(crdb_dsn="postgresql://unused/db")
    container = build_container(settings, backend="real")
    container.real_store.override(recorder.resource("store", InMemoryStore(clock)))
    container.real_queue.override(recorder.resource("queue", InMemoryQueue(clock)))

    async with open_services(settings, backend="real", container=container) as services:
        await services.api.submit.submit_job(one_task_job())
        assert recorder.events == ["open store", "open queue"]

    assert recorder.events[:2] == ["open store", "open queue"]
    assert sorted(recorder.events[2:]) == ["close queue", "close store"]


async def test_an_opened_resource_is_closed_when_a_later_one_fails() -> None:
    recorder = Recorder()
    settings = Settings(crdb_dsn="postgresql://unused/db")
    container = build_container(settings, backend="real")
    container.real_store.override(recorder.resource("store", InMemoryStore(FakeClock())))
    container.real_queue.override(recorder.resource("queue", None, fail=True))

    with pytest.raises(ConnectionError, match="queue unreachable"):
        async with open_services(settings, backend="real", container=container):
            pytest.fail("must not get here")

    assert recorder.events == ["open store", "open queue", "close store"]


async def test_the_memory_backend_opens_no_real_resource() -> None:
    recorder = Recorder()
    container = build_container(Settings(), backend="memory")
    container.real_store.override(recorder.resource("store", None))
    container.real_queue.override(recorder.resource("queue", None))

    async with open_services(Settings(), backend="memory", container=container):
        pass

    assert recorder.events == []


def test_the_real_backend_requires_crdb_dsn() -> None:
    with pytest.raises(ConfigError, match=r"^CRDB_DSN: required"):
        build_container(Settings(), backend="real")


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend 'sqlite'"):
        build_container(Settings(), backend="sqlite")  # type: ignore[arg-type]


async def test_a_container_for_another_backend_is_refused() -> None:
    container = build_container(Settings(), backend="memory")

    with pytest.raises(ValueError, match="built for backend 'memory'"):
        async with open_services(Settings(), backend="real", container=container):
            pass


async def test_a_worker_counts_as_alive_for_three_registry_heartbeat_intervals() -> None:
    clock = FakeClock()
    settings = Settings(worker_heartbeat_interval=60.0)  # alive for 180 s after an upsert
    container = build_container(settings, backend="memory")
    container.clock.override(providers.Object(clock))

    async with open_services(settings, backend="memory", container=container) as services:
        reconcile = services.reconciler.reconcile
        await services.worker.registry.heartbeat("w1", "host", {})  # polls the default tier
        await services.api.submit.submit_job(one_task_job())

        clock.advance(170.0)  # past the 90 s default, within 3 x 60 s
        within = (await reconcile.reconcile_once()).unpolled
        clock.advance(20.0)  # 190 s since the upsert: the worker is gone
        beyond = (await reconcile.reconcile_once()).unpolled

    assert within == {}
    assert beyond == {"default": 1}


async def test_the_bundles_of_one_container_work_on_one_store_and_queue() -> None:
    async with open_services(Settings(), backend="memory") as services:
        result = await services.api.submit.submit_job(one_task_job())
        task_id = result.task_ids["only"]
        popped = await services.worker.queue.pop_many(["default"], timeout=0, max_count=1)
        claims = await services.worker.execution.claim_many(popped, "w1")
        await services.worker.execution.complete_many(claims)
        view = await services.api.queries.get_task(task_id)

    assert popped == [task_id]
    assert view.task.status.value == "completed"


async def test_a_worker_process_opens_only_the_worker_bundle() -> None:
    async with open_worker_services(Settings(), backend="memory") as worker:
        assert isinstance(worker, WorkerServices)
        assert isinstance(worker.queue, InMemoryQueue)
        assert await worker.queue.pop_many(["default"], timeout=0, max_count=1) == []
