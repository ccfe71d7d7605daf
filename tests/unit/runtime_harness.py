"""A worker runtime on the memory adapters with a real clock and short timings, for tests.

Leases last 0.6 s and the retry backoff is 0.05 s, so whole task lifecycles (retries, reclaims,
shutdown hand-backs) run in well under a second. A background "orchestrator" loop promotes due
scheduled entries and re-enqueues due queued tasks, as the real reconciler would.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID, uuid4

from prometheus_client import CollectorRegistry

from dtq.adapters.artifacts.fs import FsArtifactStore
from dtq.adapters.clock import SystemClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.artifacts import ArtifactService
from dtq.application.commands import (
    ExecutionPolicy,
    JobView,
    SubmitJob,
    SubmitResult,
    TaskSpec,
    TaskView,
)
from dtq.application.execution import ExecutionService
from dtq.application.queries import QueryService
from dtq.application.reconcile import ReconcileService
from dtq.application.registry import WorkerRegistryService
from dtq.application.submit import SubmitService
from dtq.domain.errors import BackendUnavailable
from dtq.domain.status import TaskStatus
from dtq.entrypoints.bundles import WorkerServices
from dtq.entrypoints.config import Settings
from dtq.entrypoints.metrics import WorkerMetrics
from dtq.entrypoints.worker.config import WorkerConfig
from dtq.worker import Runtime
from tests.unit.conftest import memory_container

T = TypeVar("T")

LEASE = 0.6  # seconds
POLICY = ExecutionPolicy(
    lease_duration=LEASE,
    retry_backoff=0.05,
    stale_running_after=0.3,
    max_reclaims=5,
    lease_ttl_buffer=0.2,
)
SETTINGS = Settings(
    worker_id="worker-test",
    worker_concurrency=1,
    lease_duration=LEASE,
    worker_heartbeat_interval=0.2,
)


@dataclass
class Harness:
    """Services wired on memory adapters with a real clock."""

    store: InMemoryStore
    queue: InMemoryQueue
    submit: SubmitService
    queries: QueryService
    execution: ExecutionService
    reconcile: ReconcileService
    registry: WorkerRegistryService
    settings: Settings
    metrics: WorkerMetrics = field(default_factory=lambda: WorkerMetrics(CollectorRegistry()))
    # artifacts in a fresh directory under the system temp dir, created on first write and
    # removed when the harness is collected (or at exit)
    artifacts_dir: Path = field(
        default_factory=lambda: Path(tempfile.gettempdir()) / "dtq-test-artifacts" / uuid4().hex
    )
    artifacts: ArtifactService = field(init=False)

    def __post_init__(self) -> None:
        self.artifacts = ArtifactService(store=FsArtifactStore(self.artifacts_dir))
        weakref.finalize(self, shutil.rmtree, self.artifacts_dir, ignore_errors=True)

    @property
    def services(self) -> WorkerServices:
        return WorkerServices(self.execution, self.registry, self.queue, self.artifacts)

    async def submit_tasks(self, *specs: TaskSpec) -> SubmitResult:
        return await self.submit.submit_job(SubmitJob(tasks=tuple(specs)))

    async def one(self, kind: str, payload: Any = None, **spec: Any) -> UUID:
        """Submit a one-task job; return the task id."""
        result = await self.submit_tasks(TaskSpec(name="t", kind=kind, payload=payload, **spec))
        return result.task_ids["t"]

    async def task(self, task_id: UUID) -> TaskView:
        return await self.queries.get_task(task_id)

    async def wait_job(self, job_id: UUID, timeout: float = 5.0) -> JobView:
        """Poll until the job is terminal."""
        return await _poll(
            lambda: self.queries.get_job(job_id), lambda v: v.job.status.terminal, timeout
        )

    async def wait_task(
        self, task_id: UUID, statuses: Iterable[TaskStatus], timeout: float = 5.0
    ) -> TaskView:
        wanted = set(statuses)
        return await _poll(lambda: self.task(task_id), lambda v: v.task.status in wanted, timeout)

    def config(self, runtime: Runtime, settings: Settings | None = None) -> WorkerConfig:
        """``runtime``'s options resolved against this harness's settings (or ``settings``)."""
        return runtime.configure(self.settings if settings is None else settings)

    def counter(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    @contextlib.asynccontextmanager
    async def running(
        self, runtime: Runtime, *, reconcile: bool = True, settings: Settings | None = None
    ) -> AsyncIterator[asyncio.Event]:
        """Run ``runtime`` (and the orchestrator loop) for the block; yield its stop event.

        On exit the runtime is stopped gracefully (unless the block already stopped it) and
        awaited, so exceptions inside it surface in the test.
        """
        stop = asyncio.Event()
        config = self.config(runtime, settings)
        worker = asyncio.create_task(
            runtime.run(self.services, config, stop=stop, metrics=self.metrics)
        )
        orchestrator = asyncio.create_task(self._orchestrate()) if reconcile else None
        try:
            yield stop
        finally:
            stop.set()
            await asyncio.wait_for(worker, timeout=10.0)
            if orchestrator is not None:
                orchestrator.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await orchestrator

    async def _orchestrate(self) -> None:
        while True:
            with contextlib.suppress(BackendUnavailable):  # outage drills: keep going
                await self.reconcile.promote_scheduled()
                await self.reconcile.enqueue_due()
            await asyncio.sleep(0.02)


def build_harness(
    policy: ExecutionPolicy = POLICY, settings: Settings = SETTINGS, *, marker_ttl: float = 5.0
) -> Harness:
    c = memory_container(SystemClock(), policy, replace(settings, pending_marker_ttl=marker_ttl))
    store, queue = c.store(), c.queue()
    assert isinstance(store, InMemoryStore) and isinstance(queue, InMemoryQueue)
    return Harness(
        store=store,
        queue=queue,
        submit=c.submit(),
        queries=c.queries(),
        execution=c.execution(),
        reconcile=c.reconcile(),
        registry=c.registry(),
        settings=settings,
    )


async def _poll(
    read: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout: float = 5.0
) -> T:
    """Call ``read`` every 10 ms until ``done(value)``; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = await read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s; last state: {value!r}")
        await asyncio.sleep(0.01)
