"""The worker's HTTP backend (issue 15 item 1): the runtime's loops over ``/v1/worker``.

``dtq-worker --app myapp.tasks:runtime --orchestrator http://host:8080`` runs the same handlers
as the native worker with no database or Redis credentials: every call of
:class:`~dtq.entrypoints.worker.backend.WorkerBackend` becomes a request to the orchestrator,
which does the claim, marker, lease and fencing work through the native services.

The fetch loop's two steps, pop then claim, are one request here: :meth:`HttpReadyLists.pop_many`
sends ``POST /v1/worker/claim`` and keeps the claims it brought; :meth:`HttpExecution.claim_many`
hands them over. Errors: an unreachable orchestrator, a 5xx or a 429 raise ``BackendUnavailable``
(the loops back off and retry, as for a database outage); a 409 on a report is ``STALE``, on a
heartbeat ``LOST``. Artifacts (``task.artifacts``) go through ``/v1/artifacts``; a 401 or 403
there is ``ArtifactForbidden`` (permanent, naming the scope the token lacks).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import httpx

from dtq.application.commands import Claim, ExecutionPolicy, ReportOutcome
from dtq.application.execution import FailOutcome
from dtq.application.ports import LeaseState
from dtq.domain.entities import Task, TaskRun
from dtq.domain.errors import BackendUnavailable, DtqError
from dtq.domain.payload import MAX_ERROR_CHARS, storable_text
from dtq.domain.status import RunStatus, TaskStatus
from dtq.entrypoints.config import parse_duration
from dtq.entrypoints.worker.artifacts import chunks
from dtq.worker import (
    ArtifactData,
    ArtifactForbidden,
    ArtifactNotFound,
    ArtifactRef,
    PermanentError,
)

#: Longest claim ``wait`` the orchestrator accepts, in seconds (``MAX_CLAIM_WAIT``).
MAX_WAIT = 30.0
#: Seconds a request may take beyond its own hold (connect, the claim's work, the reply).
REQUEST_MARGIN = 10.0


#: Most successes in one ``POST /v1/worker/results``.
RESULTS_BATCH = 128
#: Heartbeat requests in flight together during one renewal tick.
_BEATS_AT_ONCE = 32


def _outcome(answer: str) -> ReportOutcome:
    """``recorded``/``duplicate`` as they are; a stale, unknown or foreign run: STALE."""
    if answer in ("recorded", "duplicate"):
        return ReportOutcome(answer)
    return ReportOutcome.STALE


class ReportRefused(DtqError):
    """The orchestrator refused a report as invalid (a 4xx other than 409/404)."""

    code = "report_refused"


class Orchestrator:
    """One orchestrator's ``/v1/worker`` routes over an ``httpx.AsyncClient``.

    Args:
        client: its ``base_url`` is the orchestrator (``--orchestrator``); it carries the
            ``Authorization: Bearer`` header when ``DTQ_TOKEN`` is set.
        worker_id: sent with every claim and as ``X-Worker-Id`` on the run routes.
    """

    def __init__(self, client: httpx.AsyncClient, worker_id: str) -> None:
        self.client = client
        self.worker_id = worker_id

    async def post(
        self, path: str, body: Mapping[str, Any], *, timeout: float = REQUEST_MARGIN
    ) -> httpx.Response:
        """POST ``body`` as JSON; the response unless the orchestrator is unavailable.

        Raises:
            BackendUnavailable: no connection, a timeout, a 5xx or a 429.
        """
        try:
            response = await self.client.post(
                path, json=body, headers={"X-Worker-Id": self.worker_id}, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"orchestrator unreachable: {type(exc).__name__}") from exc
        if response.status_code >= 500 or response.status_code == 429:
            raise BackendUnavailable(f"orchestrator answered {response.status_code}")
        return response


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return f"http_{response.status_code}"


def _refused(response: httpx.Response) -> ReportRefused:
    return ReportRefused(
        f"orchestrator refused the request: {response.status_code} {_error_code(response)}"
    )


def claim_from_wire(item: Mapping[str, Any], worker_id: str) -> Claim:
    """A ``Claim`` built from one task of a claim response (what the runtime's loops read:
    ids, kind, payload, attempt, checkpoint, timeout, parents, and the job's trace context, so
    the worker's claim, handler and complete spans join the submit's trace)."""
    now = datetime.now(UTC)
    task_id, run_id = UUID(item["task_id"]), UUID(item["run_id"])
    timeout = item.get("timeout")
    task = Task(
        id=task_id,
        job_id=UUID(item["job_id"]),
        name="",
        kind=item["kind"],
        payload=item.get("payload"),
        status=TaskStatus.RUNNING,
        scheduled_at=now,
        created_at=now,
        updated_at=now,
        attempt=item["attempt"],
        current_run_id=run_id,
        progress=item.get("checkpoint"),
        timeout=None
        if timeout is None
        else timedelta(seconds=parse_duration(timeout, variable="timeout")),
    )
    run = TaskRun(
        id=run_id,
        task_id=task_id,
        attempt_number=item["attempt"],
        worker_id=worker_id,
        status=RunStatus.RUNNING,
        started_at=now,
    )
    return Claim(
        task=task,
        run=run,
        worker_id=worker_id,
        parents=item.get("parents") or {},
        trace_context=item.get("traceparent"),
    )


class HttpReadyLists:
    """The fetch loop's pop: one held ``POST /v1/worker/claim``.

    Args:
        orchestrator: the routes.
        kinds: the runtime's registered kinds (only those are claimed).
        claimed: where the claims are kept for :meth:`HttpExecution.claim_many`.
    """

    def __init__(
        self, orchestrator: Orchestrator, kinds: Sequence[str], claimed: dict[UUID, Claim]
    ) -> None:
        self._orchestrator = orchestrator
        self._kinds = list(kinds)
        self._claimed = claimed

    async def pop_many(
        self,
        priorities: Sequence[str],
        timeout: float,
        max_count: int,
        kinds: Collection[str] | None = None,
    ) -> list[UUID]:
        """Claim up to ``max_count`` (at most 100) tasks, holding up to ``timeout`` seconds
        (at most 30); their ids (the claims wait in ``claimed``).

        Raises:
            BackendUnavailable: the orchestrator is unavailable.
            ReportRefused: it refused the claim (e.g. a kind name it does not accept).
        """
        wait = min(max(timeout, 0.0), MAX_WAIT)
        response = await self._orchestrator.post(
            "/v1/worker/claim",
            {
                "worker_id": self._orchestrator.worker_id,
                "kinds": self._kinds,
                "priorities": list(priorities),
                "max": min(max_count, 100),
                "wait": f"{wait:.3f}s",
            },
            timeout=wait + REQUEST_MARGIN,
        )
        if response.status_code == 204:
            return []
        if response.status_code != 200:
            raise _refused(response)
        ids: list[UUID] = []
        for item in response.json()["tasks"]:
            claim = claim_from_wire(item, self._orchestrator.worker_id)
            self._claimed[claim.task.id] = claim
            ids.append(claim.task.id)
        return ids


class HttpExecution:
    """The runtime's execution calls as ``/v1/worker/runs/{run_id}/…`` requests.

    Args:
        orchestrator: the routes.
        claimed: the claims :class:`HttpReadyLists` brought, by task id.
        max_result_bytes: the handler results' size limit checked before sending
            (``API_MAX_RESULT_BYTES``; the orchestrator checks it again).
    """

    def __init__(
        self,
        orchestrator: Orchestrator,
        claimed: dict[UUID, Claim],
        *,
        lease_duration: float,
        max_result_bytes: int,
    ) -> None:
        self._orchestrator = orchestrator
        self._claimed = claimed
        self._policy = ExecutionPolicy(
            lease_duration=lease_duration, max_result_bytes=max_result_bytes
        )

    @property
    def policy(self) -> ExecutionPolicy:
        """The lease duration and result size limit this worker runs with."""
        return self._policy

    async def claim_many(
        self,
        task_ids: Sequence[UUID],
        worker_id: str,
        kinds: Collection[str] | None = None,
        *,
        on_commit: Callable[[list[Claim]], None] | None = None,
    ) -> list[Claim]:
        """The claims the last pops brought for ``task_ids`` (already committed; the
        orchestrator routed other kinds away, so ``kinds`` needs no check here), passed to
        ``on_commit`` too when given (as ``ExecutionService.claim_many`` does)."""
        claims = [c for i in dict.fromkeys(task_ids) if (c := self._claimed.pop(i, None))]
        if on_commit is not None:
            on_commit(claims)
        return claims

    async def recover_claims(self, run_ids: Mapping[UUID, UUID], worker_id: str) -> list[Claim]:
        """Nothing to recover: a claim over HTTP never raises ``ClaimsUnresolved``."""
        return []

    async def put_back(self, task_id: UUID) -> bool:
        """Give back a claim popped after the stop: hand it back at once (``…/release``)."""
        claim = self._claimed.pop(task_id, None)
        if claim is None:
            return False
        return await self.hand_back(claim, "worker shutting down") is ReportOutcome.RECORDED

    async def complete_many(
        self,
        claims: Sequence[Claim],
        results: Sequence[Any] | None = None,
        *,
        progress: Mapping[UUID, Any] | None = None,
    ) -> list[ReportOutcome]:
        """One ``POST /v1/worker/results`` for the batch (at most 128; the runtime's
        ``complete_batch`` default), one transaction on the orchestrator.

        Raises:
            BackendUnavailable: the batch did not get through (it is sent again; a report that
                had landed answers ``duplicate``).
            ReportRefused: the orchestrator refused the batch.
        """
        values = list(results) if results is not None else [None] * len(claims)
        outcomes: list[ReportOutcome] = []
        for start in range(0, len(claims), RESULTS_BATCH):
            reports = []
            for claim, result in zip(
                claims[start : start + RESULTS_BATCH],
                values[start : start + RESULTS_BATCH],
                strict=True,
            ):
                report: dict[str, Any] = {"run_id": str(claim.run.id), "result": result}
                if progress and claim.task.id in progress:
                    report["progress"] = progress[claim.task.id]
                reports.append(report)
            response = await self._orchestrator.post("/v1/worker/results", {"reports": reports})
            if response.status_code != 200:
                raise _refused(response)
            outcomes.extend(_outcome(answer) for answer in response.json()["outcomes"])
        return outcomes

    async def fail(
        self,
        claim: Claim,
        error: str,
        *,
        permanent: bool = False,
        progress: Mapping[UUID, Any] | None = None,
    ) -> FailOutcome:
        """``…/failure`` (retried by the task's policy unless ``permanent``); ``error`` is sent
        storable (``domain.payload.storable_text``), at most ``MAX_ERROR_CHARS``."""
        text = storable_text(error, max_chars=MAX_ERROR_CHARS) or "error"
        body = {"error": text, "permanent": permanent}
        response = await self._send(claim, "failure", body, progress)
        if response is None:
            return FailOutcome(ReportOutcome.STALE)
        data = response.json()
        retry_at = data.get("retry_at")
        return FailOutcome(
            ReportOutcome(data["outcome"]),
            None if retry_at is None else datetime.fromisoformat(retry_at),
        )

    async def hand_back(
        self, claim: Claim, reason: str, *, progress: Mapping[UUID, Any] | None = None
    ) -> ReportOutcome:
        """``…/release``: the task is queued again at once, no retry charged."""
        return await self._report(claim, "release", {"reason": reason}, progress)

    async def record_progress(self, reports: Sequence[tuple[Claim, Any]]) -> set[UUID]:
        """One ``…/heartbeat`` with ``progress`` per report; the ids stored."""
        answers = await asyncio.gather(
            *(self._beat(claim, {"progress": value}) for claim, value in reports)
        )
        return {
            claim.task.id
            for (claim, _), state in zip(reports, answers, strict=True)
            if state is LeaseState.EXTENDED
        }

    async def heartbeat_many(self, claims: Sequence[Claim]) -> list[LeaseState]:
        """``…/heartbeat`` of each run, ``_BEATS_AT_ONCE`` in flight: per claim EXTENDED,
        CANCELLED (the task was cancelled), or LOST once the run is not live.

        Raises:
            BackendUnavailable: the orchestrator is unavailable (the leases are unconfirmed).
        """
        states: list[LeaseState] = []
        for i in range(0, len(claims), _BEATS_AT_ONCE):
            chunk = claims[i : i + _BEATS_AT_ONCE]
            states += await asyncio.gather(*(self._beat(claim, {}) for claim in chunk))
        return states

    async def _beat(self, claim: Claim, body: dict[str, Any]) -> LeaseState:
        response = await self._orchestrator.post(f"/v1/worker/runs/{claim.run.id}/heartbeat", body)
        if response.status_code == 200:
            if response.json().get("cancel"):
                return LeaseState.CANCELLED  # the task was cancelled: stop, report nothing
            return LeaseState.EXTENDED
        if response.status_code in (404, 409):
            return LeaseState.LOST
        raise _refused(response)

    async def _report(
        self,
        claim: Claim,
        what: str,
        body: dict[str, Any],
        progress: Mapping[UUID, Any] | None,
    ) -> ReportOutcome:
        response = await self._send(claim, what, body, progress)
        if response is None:
            return ReportOutcome.STALE
        return ReportOutcome(response.json()["outcome"])

    async def _send(
        self,
        claim: Claim,
        what: str,
        body: dict[str, Any],
        progress: Mapping[UUID, Any] | None,
    ) -> httpx.Response | None:
        """POST a report; None when the run is stale (409) or unknown (404)."""
        if progress and claim.task.id in progress:
            body = {**body, "progress": progress[claim.task.id]}
        response = await self._orchestrator.post(f"/v1/worker/runs/{claim.run.id}/{what}", body)
        if response.status_code in (404, 409):
            return None
        if response.status_code != 200:
            raise _refused(response)
        return response


class HttpRegistry:
    """The registry heartbeat as ``POST /v1/worker/registry``."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self._orchestrator = orchestrator

    async def heartbeat(
        self, worker_id: str, hostname: str | None, metadata: dict[str, Any]
    ) -> None:
        """Upsert the worker's row.

        Raises:
            BackendUnavailable: the orchestrator is unavailable.
            ReportRefused: it refused the body.
        """
        body = {"worker_id": worker_id, "hostname": hostname or "", "metadata": metadata}
        response = await self._orchestrator.post("/v1/worker/registry", body)
        if response.status_code != 204:
            raise _refused(response)

    async def remove(self, worker_id: str) -> bool:
        """Delete the worker's row (``POST /v1/worker/registry/remove``, idempotent).

        Returns:
            True (the orchestrator does not say whether there was a row).

        Raises:
            BackendUnavailable: the orchestrator is unavailable.
            ReportRefused: it refused the body.
        """
        response = await self._orchestrator.post(
            "/v1/worker/registry/remove", {"worker_id": worker_id}
        )
        if response.status_code != 204:
            raise _refused(response)
        return True


#: The scope a 403's message names (``this route needs a token with the 'submit' scope``).
_SCOPE_NEEDED = re.compile(r"'(\w+)' scope")


def _answered(response: httpx.Response) -> tuple[str, str]:
    """``("the orchestrator answered 413 payload_too_large: ...", message)`` of an error answer
    (its JSON body's code and message, when it has one)."""
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"http_{response.status_code}", "no JSON error body"
    return f"the orchestrator answered {response.status_code} {code}: {message}", message


def _artifact_refusal(response: httpx.Response, what: str) -> ArtifactForbidden:
    """The handler-visible error of a 401 or 403 on ``/v1/artifacts`` (``what``: ``artifact
    upload`` or ``artifact download``), naming the scope the answer's JSON body names."""
    answered, message = _answered(response)
    needed = _SCOPE_NEEDED.search(message) if response.status_code == 403 else None
    if needed is not None:
        return ArtifactForbidden(f"the token lacks the {needed[1]!r} scope ({what}): {answered}")
    return ArtifactForbidden(f"the token was refused ({what}): {answered}")


class HttpArtifacts:
    """``task.artifacts`` over ``/v1/artifacts`` (upload streams the data, open streams back).

    The worker's token needs the ``submit`` scope to upload and ``read`` to download, besides
    ``worker``; a 401 or 403 is :class:`~dtq.worker.ArtifactForbidden` and an upload's 413 or
    400 a :class:`~dtq.worker.PermanentError` (the task fails at once), a 5xx, a 429 or no
    answer ``BackendUnavailable`` (retried by the task's policy).
    """

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def put(self, data: ArtifactData) -> dict[str, Any]:
        """See :meth:`dtq.worker.Artifacts.put`.

        Raises:
            TypeError: ``data`` is none of the accepted kinds.
            ArtifactForbidden: the orchestrator refused the token (401, or 403: it lacks the
                ``submit`` scope; the message names the scope).
            PermanentError: the orchestrator refused the data (413 over
                ``API_MAX_ARTIFACT_BYTES``, 400), which another attempt would not change.
            BackendUnavailable: the upload failed otherwise.
        """
        try:
            response = await self._client.post(
                "/v1/artifacts",
                content=chunks(data),
                headers={"Content-Type": "application/octet-stream"},
                timeout=None,
            )
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"artifact upload failed: {type(exc).__name__}") from exc
        if response.status_code in (401, 403):
            raise _artifact_refusal(response, "artifact upload")
        if response.status_code in (400, 413):  # the same answer on every attempt
            raise PermanentError(f"artifact upload refused: {_answered(response)[0]}")
        if response.status_code != 201:
            raise BackendUnavailable(f"artifact upload answered {response.status_code}")
        ref: dict[str, Any] = response.json()
        return ref

    async def open(self, ref: ArtifactRef | str) -> AsyncIterator[bytes]:
        """See :meth:`dtq.worker.Artifacts.open`.

        Raises:
            ArtifactNotFound: no artifact has that id (404), or the ref is malformed.
            ArtifactForbidden: the orchestrator refused the token (401, or 403: it lacks the
                ``read`` scope; the message names the scope).
            BackendUnavailable: the download failed otherwise.
        """
        artifact_id = ref if isinstance(ref, str) else ref.get("artifact_id")
        if not isinstance(artifact_id, str) or not artifact_id or "/" in artifact_id:
            raise ArtifactNotFound(f"not an artifact ref (no string 'artifact_id'): {ref!r}")
        request = self._client.build_request("GET", f"/v1/artifacts/{artifact_id}", timeout=None)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"artifact download failed: {type(exc).__name__}") from exc
        if response.status_code in (400, 404):
            await response.aclose()
            raise ArtifactNotFound(f"no artifact has id {artifact_id!r}")
        if response.status_code in (401, 403):
            await response.aread()  # the JSON error body, for the message
            await response.aclose()
            raise _artifact_refusal(response, "artifact download")
        if response.status_code != 200:
            await response.aclose()
            raise BackendUnavailable(f"artifact download answered {response.status_code}")
        return _stream(response)


async def _stream(response: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_bytes():
            yield chunk
    finally:
        await response.aclose()


@dataclass(frozen=True, slots=True)
class HttpWorkerServices:
    """The HTTP backend's bundle (a :class:`~dtq.entrypoints.worker.backend.WorkerBackend`)."""

    execution: HttpExecution
    registry: HttpRegistry
    queue: HttpReadyLists
    artifacts: HttpArtifacts


@asynccontextmanager
async def open_http_worker_services(
    url: str,
    *,
    worker_id: str,
    kinds: Sequence[str],
    lease_duration: float,
    max_result_bytes: int,
    token: str | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[HttpWorkerServices]:
    """Open an HTTP client to the orchestrator at ``url`` and yield the worker's bundle on it.

    Args:
        url: the orchestrator's base URL, e.g. ``http://127.0.0.1:8080``.
        worker_id: ``WORKER_ID``.
        kinds: the runtime's registered kinds.
        lease_duration: ``LEASE_DURATION`` (keep it equal to the orchestrator's).
        max_result_bytes: ``API_MAX_RESULT_BYTES``.
        token: sent as ``Authorization: Bearer`` (``DTQ_TOKEN``); never logged.
        transport: an httpx transport to use instead of the network (tests).
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, limits=limits, transport=transport
    ) as client:
        orchestrator = Orchestrator(client, worker_id)
        claimed: dict[UUID, Claim] = {}
        yield HttpWorkerServices(
            execution=HttpExecution(
                orchestrator,
                claimed,
                lease_duration=lease_duration,
                max_result_bytes=max_result_bytes,
            ),
            registry=HttpRegistry(orchestrator),
            queue=HttpReadyLists(orchestrator, kinds, claimed),
            artifacts=HttpArtifacts(client),
        )
