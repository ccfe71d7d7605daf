"""What a worker run's loops call: the narrow interface both backends implement.

The native backend is :class:`~dtq.entrypoints.bundles.WorkerServices` (the execution service,
the registry and the ready lists on the database and Redis); the HTTP backend is
:class:`~dtq.entrypoints.worker.http.HttpWorkerServices` (the same calls made by the
orchestrator's ``/v1/worker`` routes, issue 15 item 1). The session, fetch, completion and lease
loops see only these protocols, so the same handler code runs in both modes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol
from uuid import UUID

from dtq.application.artifacts import ArtifactService
from dtq.application.commands import Claim, ExecutionPolicy, ReportOutcome
from dtq.application.execution import FailOutcome
from dtq.application.ports import LeaseState
from dtq.worker import Artifacts


class WorkerExecution(Protocol):
    """The claim flow and reports (``ExecutionService`` has exactly these; see it for each
    method's contract)."""

    @property
    def policy(self) -> ExecutionPolicy: ...

    async def claim_many(
        self,
        task_ids: Sequence[UUID],
        worker_id: str,
        kinds: Collection[str] | None = None,
        *,
        on_commit: Callable[[list[Claim]], None] | None = None,
    ) -> list[Claim]: ...

    async def recover_claims(self, run_ids: Mapping[UUID, UUID], worker_id: str) -> list[Claim]: ...

    async def put_back(self, task_id: UUID) -> bool: ...

    async def complete_many(
        self,
        claims: Sequence[Claim],
        results: Sequence[Any] | None = None,
        *,
        progress: Mapping[UUID, Any] | None = None,
    ) -> list[ReportOutcome]: ...

    async def fail(
        self,
        claim: Claim,
        error: str,
        *,
        permanent: bool = False,
        progress: Mapping[UUID, Any] | None = None,
    ) -> FailOutcome: ...

    async def hand_back(
        self, claim: Claim, reason: str, *, progress: Mapping[UUID, Any] | None = None
    ) -> ReportOutcome: ...

    async def record_progress(self, reports: Sequence[tuple[Claim, Any]]) -> set[UUID]: ...

    async def heartbeat_many(self, claims: Sequence[Claim]) -> list[LeaseState]: ...


class ReadyLists(Protocol):
    """What the fetch loop pops from (``Queue.pop_many``'s contract)."""

    async def pop_many(
        self,
        priorities: Sequence[str],
        timeout: float,
        max_count: int,
        kinds: Collection[str] | None = None,
    ) -> list[UUID]: ...


class WorkerRegistry(Protocol):
    """The ``workers`` registry heartbeat and the row's removal at a clean stop
    (``WorkerRegistryService.heartbeat`` and ``remove``)."""

    async def heartbeat(
        self, worker_id: str, hostname: str | None, metadata: dict[str, Any]
    ) -> None: ...

    async def remove(self, worker_id: str) -> bool: ...


class WorkerBackend(Protocol):
    """A worker run's bundle: execution, registry, ready lists and artifacts.

    ``artifacts`` is the artifact service (wrapped for ``task.artifacts``) or an ``Artifacts``
    implementation used as it is.
    """

    @property
    def execution(self) -> WorkerExecution: ...

    @property
    def registry(self) -> WorkerRegistry: ...

    @property
    def queue(self) -> ReadyLists: ...

    @property
    def artifacts(self) -> ArtifactService | Artifacts: ...
