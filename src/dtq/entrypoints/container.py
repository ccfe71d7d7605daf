"""The composition root: the one place that names concrete adapters (DESIGN §1, STYLE).

:class:`Container` wires settings → clock → store and queue → application services. The store and
queue come from one of two backends, chosen by the ``backend`` dependency:

* ``memory``: one ``InMemoryStore`` and one ``InMemoryQueue`` shared by everything the container
  builds (the embedded default of ``dtq dev`` and of unit tests);
* ``real``: ``CockroachStore`` over a psycopg pool and ``RedisQueue`` over a redis-py client, as
  async ``providers.Resource``\\ s that close what they opened when the container shuts down.

Nothing is built at import time. :func:`open_services` builds a container, resolves the
per-process bundles of :mod:`dtq.entrypoints.bundles` (API, worker, reconciler) on one store and
queue, and shuts the resources down on exit; :func:`open_worker_services` yields only the worker's
bundle, :func:`open_token_service` the token service alone (``dtq token``). :func:`migrate`
applies the schema migrations, so the CLI never names an adapter. Tests
replace any provider with ``container.<name>.override(providers.Object(fake))`` and pass the
container in.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import structlog
from dependency_injector import containers, providers

from dtq.adapters.clock import SystemClock
from dtq.adapters.memory.queue import InMemoryQueue
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.artifacts import ArtifactService, ArtifactStore
from dtq.application.breaker import PushBreaker
from dtq.application.bulk import BulkService
from dtq.application.commands import ExecutionPolicy
from dtq.application.control import ControlService
from dtq.application.events import EventService
from dtq.application.execution import ExecutionService
from dtq.application.explain import ExplainService
from dtq.application.fleet import FleetService
from dtq.application.health import HealthService
from dtq.application.ports import Queue, QueueInspector, Store, WebhookSender
from dtq.application.queries import QueryService
from dtq.application.reconcile import ReconcileService
from dtq.application.registry import WorkerRegistryService
from dtq.application.remote import RemoteWorkerService
from dtq.application.retention import RetentionPolicy, RetentionService
from dtq.application.sessions import SessionService
from dtq.application.submit import SubmitService
from dtq.application.tokens import TokenService
from dtq.application.webhooks import WebhookService
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.bundles import ApiServices, ReconcilerServices, Services, WorkerServices
from dtq.entrypoints.config import ConfigError, Settings
from dtq.entrypoints.pushes import PushReport

Backend = Literal["memory", "real"]
BACKENDS: tuple[Backend, ...] = ("memory", "real")


async def _cockroach_store(
    dsn: str, pool_size: int, acquire_timeout: float, on_retry: Callable[[str], None] | None
) -> AsyncIterator[Store]:
    """Open the database pool, yield a ``CockroachStore`` on it, close the pool afterwards.

    Raises:
        ConfigError: ``CRDB_DSN`` names a database that cannot be reached now (one line with
            host, port and reason: the CLI exits 2, as for any unusable setting), or one whose
            schema lacks migrations this dtq ships (``dtq migrate`` applies them).
    """
    from dtq.adapters.cockroach import CockroachStore, open_pool, unapplied_migrations

    try:
        pool = await open_pool(dsn, min_size=1, max_size=pool_size, acquire_timeout=acquire_timeout)
    except BackendUnavailable as exc:
        raise ConfigError("CRDB_DSN", exc.detail) from exc
    try:
        missing = await unapplied_migrations(pool)
        if missing:
            raise ConfigError(
                "CRDB_DSN",
                f"the database's schema lacks {len(missing)} of this dtq's migrations (the"
                f" first: {missing[0]}): run `dtq migrate`",
            )
        if missing is None:
            structlog.get_logger("dtq.container").warning(
                "could not read which migrations the database has applied; going on"
            )
        yield CockroachStore(pool, on_retry=on_retry)
    finally:
        await pool.close()


def _queue_prefix(prefix: str) -> str:
    """What every Redis key of ``REDIS_KEY_PREFIX`` ``prefix`` starts with (its hash tag)."""
    from dtq.adapters.redis.keys import tagged_prefix

    return tagged_prefix(prefix)


async def _redis_queue(addr: str, prefix: str, marker_ttl: float) -> AsyncIterator[Queue]:
    """Connect to Redis, warn about an evicting memory policy, yield a ``RedisQueue``.

    The eviction check never stops the process: Redis being down at start is survivable (the
    store is the system of record), so a failed check is logged and startup goes on.
    """
    from dtq.adapters.redis import RedisQueue, check_eviction_policy, connect_redis

    log = structlog.get_logger("dtq.container")
    client = connect_redis(addr)
    try:
        try:
            warning = await check_eviction_policy(client)
        except Exception as exc:  # reported, not fatal: see the docstring
            log.warning("could not check Redis maxmemory-policy", addr=addr, error=str(exc))
        else:
            if warning:
                log.warning(warning, addr=addr)
        yield RedisQueue(client, prefix=prefix, marker_ttl=marker_ttl)
    finally:
        await client.aclose()


#: ``ARTIFACT_DIR`` when unset (relative to the working directory; ``dtq dev`` uses a temp dir).
DEFAULT_ARTIFACT_DIR = "artifacts"


def _webhook_sender(timeout: float) -> WebhookSender:
    """An httpx webhook sender (``WEBHOOK_TIMEOUT``); it opens its connections on first use and
    the webhook loop closes them when it stops."""
    from dtq.adapters.http.webhooks import HttpxWebhookSender

    return HttpxWebhookSender(timeout=timeout)


def _artifact_store(settings: Settings) -> ArtifactStore:
    """The artifact store ``ARTIFACT_BACKEND`` names: a directory, or an S3-compatible bucket.

    Raises:
        ConfigError: ``ARTIFACT_BACKEND=s3`` but the ``s3`` extra (``obstore``) is missing.
    """
    if settings.artifact_backend == "fs":
        from pathlib import Path

        from dtq.adapters.artifacts.fs import FsArtifactStore

        return FsArtifactStore(settings.artifact_dir or Path(DEFAULT_ARTIFACT_DIR))
    try:
        from dtq.adapters.artifacts.s3 import S3ArtifactStore
    except ImportError:
        raise ConfigError(
            "ARTIFACT_BACKEND", "s3 needs the obstore package: pip install 'dtq[s3]'"
        ) from None
    key_id, secret, region = settings.artifact_s3_credentials
    return S3ArtifactStore(
        settings.artifact_s3_bucket or "",
        endpoint=settings.artifact_s3_endpoint,
        region=region,
        access_key_id=key_id or None,
        secret_access_key=secret or None,
    )


async def check_artifact_store(settings: Settings, store: ArtifactStore) -> None:
    """At start: with ``ARTIFACT_BACKEND=s3``, the bucket must exist (one ``LIST``).

    A bucket the server cannot be asked about now (unreachable, a listing refused) is a
    warning, not a stop: artifact calls answer 503 until it answers, as during an outage.

    Raises:
        ConfigError: the server answers that ``ARTIFACT_S3_BUCKET`` does not exist (the CLI
            exits 2 with this one line, as for a database that cannot be reached).
    """
    if settings.artifact_backend != "s3":
        return
    from dtq.adapters.artifacts.s3 import S3ArtifactStore

    if not isinstance(store, S3ArtifactStore):  # a test's override
        return
    bucket = settings.artifact_s3_bucket
    where = settings.artifact_s3_endpoint or "AWS"
    try:
        exists = await store.bucket_exists()
    except BackendUnavailable as exc:
        structlog.get_logger("dtq.container").warning(
            "could not check the artifact bucket; going on", bucket=bucket, error=exc.detail
        )
        return
    if not exists:
        raise ConfigError(
            "ARTIFACT_S3_BUCKET",
            f"the bucket {bucket!r} does not exist at {where}: create it, or name one that does",
        )


def _policy(settings: Settings) -> ExecutionPolicy:
    return settings.execution_policy()


def _retention_policy(settings: Settings) -> RetentionPolicy:
    return settings.retention_policy()


#: A worker counts as alive for the reconciler's checks when its registry row was written within
#: this many ``WORKER_HEARTBEAT_INTERVAL``\ s: two upserts may be missed before it looks gone.
WORKER_ALIVE_HEARTBEATS = 3


def _queue_inspector(queue: Queue) -> QueueInspector:
    """The ``QueueInspector`` over ``queue``'s data: each queue adapter offers one through its
    ``inspector()`` (the fakes' and Redis's; not part of the hot ``Queue`` port).

    Raises:
        TypeError: ``queue`` offers none (a test double that is not a queue adapter).
    """
    make = getattr(queue, "inspector", None)
    if make is None:
        raise TypeError(f"{type(queue).__name__} offers no QueueInspector (inspector())")
    inspector: QueueInspector = make()
    return inspector


#: The live-worker window of explain and the submit warnings, in seconds: the default
#: ``active_since`` of ``GET /v1/workers`` (``api.params.DEFAULT_ACTIVE_SINCE``, 2m; equal by
#: test, not imported, so a worker process loads no server library), so "no live worker" means
#: what that route lists by default.
FLEET_ALIVE_WITHIN = 120.0


def worker_alive_within(settings: Settings) -> float:
    """Seconds since a worker's last registry upsert within which the reconciler counts it
    alive: ``WORKER_ALIVE_HEARTBEATS`` x ``WORKER_HEARTBEAT_INTERVAL``."""
    return WORKER_ALIVE_HEARTBEATS * settings.worker_heartbeat_interval


class Container(containers.DeclarativeContainer):
    """dtq's dependency graph. Provide ``settings`` and ``backend`` when constructing it.

    Providers:
        settings: the :class:`~dtq.entrypoints.config.Settings` (a dependency).
        backend: ``"memory"`` or ``"real"`` (a dependency).
        store_retry_hook: called with the reason each time the real store re-runs a
            transaction function (``orchestrator_store_retries_total``); None by default.
        push_missed_hook: called with the reason and the number of jobs each time a submit's
            push after the commit fails or is skipped
            (``orchestrator_submit_pushes_missed_total``); None by default.
        push_breaker: the submit pushes' breaker (a singleton: one per process), reporting
            through a :class:`~dtq.entrypoints.pushes.PushReport` on ``push_missed_hook``.
        clock: the host clock (one per container).
        policy: the ``ExecutionPolicy`` derived from the settings.
        store, queue: selected by ``backend``; memory ones are singletons, real ones resources.
        submit, queries, health, execution, registry, control: stateless services (factories).
        bulk: bulk cancel and retry; a singleton, since it holds its background operations.
        inspector, explain: the queue's ``QueueInspector`` and the explain service on it.
        fleet: the worker-registry view (a singleton: it caches the submit warnings' read);
            its live window is ``FLEET_ALIVE_WITHIN``.
        tokens: the API token service; a singleton, since it keeps the authentication cache.
        sessions: the dashboard's sessions; a singleton, for its lookup cache and keys.
        submit, queries, health, execution, registry, remote: stateless services (factories);
            ``remote`` serves the HTTP worker protocol (issue 15 item 1); a claim rewrites its
            worker's registry row at most every ``WORKER_HEARTBEAT_INTERVAL``.
        artifact_store, artifacts: the ``ARTIFACT_BACKEND`` store (one per container) and the
            artifact service on it.
        reconcile: the reconcile service; a singleton, since it keeps keyset cursors. Its
            ``worker_alive_within`` is :func:`worker_alive_within` of the settings.
        retention: the retention service (``RETENTION_*``, ``IDEMPOTENCY_KEY_TTL``); a
            singleton for its keyset cursors.
        webhook_sender, webhooks: the httpx sender (``WEBHOOK_TIMEOUT``) and the webhook
            service on it (singletons; issue 16 item 2).
        api_services, worker_services, reconciler_services: the per-process bundles.
    """

    settings = providers.Dependency(instance_of=Settings)
    backend = providers.Dependency(instance_of=str)

    store_retry_hook: providers.Object[Callable[[str], None] | None] = providers.Object(None)

    push_missed_hook: providers.Object[Callable[[str, int], None] | None] = providers.Object(None)

    clock = providers.Singleton(SystemClock)
    policy = providers.Singleton(_policy, settings)

    memory_store = providers.Singleton(InMemoryStore, clock)
    memory_queue = providers.Singleton(
        InMemoryQueue, clock, marker_ttl=settings.provided.pending_marker_ttl
    )
    real_store = providers.Resource(
        _cockroach_store,
        dsn=settings.provided.crdb_dsn,
        pool_size=settings.provided.db_pool_size,
        acquire_timeout=settings.provided.db_acquire_timeout,
        on_retry=store_retry_hook,
    )
    real_queue = providers.Resource(
        _redis_queue,
        addr=settings.provided.redis_addr,
        prefix=settings.provided.redis_key_prefix,
        marker_ttl=settings.provided.pending_marker_ttl,
    )
    store = providers.Selector(backend, memory=memory_store, real=real_store)
    queue = providers.Selector(backend, memory=memory_queue, real=real_queue)
    #: the prefix every Redis key of this deployment starts with (reconcile, registry, fleet)
    queue_prefix = providers.Callable(_queue_prefix, settings.provided.redis_key_prefix)

    artifact_store = providers.Singleton(_artifact_store, settings)
    artifacts = providers.Factory(ArtifactService, store=artifact_store)

    push_breaker = providers.Singleton(
        PushBreaker,
        trial_timeout=settings.provided.redis_push_trial_timeout,
        watcher=providers.Singleton(PushReport, count=push_missed_hook),
    )
    submit = providers.Factory(SubmitService, store=store, queue=queue, pushes=push_breaker)
    queries = providers.Factory(QueryService, store=store)
    control = providers.Factory(ControlService, store=store, queue=queue)
    bulk = providers.Singleton(BulkService, store=store, control=control, clock=clock)
    health = providers.Factory(HealthService, store=store, queue=queue)
    execution = providers.Factory(
        ExecutionService, store=store, queue=queue, policy=policy, clock=clock
    )
    reconcile = providers.Singleton(
        ReconcileService,
        store=store,
        queue=queue,
        policy=policy,
        worker_alive_within=providers.Callable(worker_alive_within, settings),
        queue_prefix=queue_prefix,
    )
    registry = providers.Factory(WorkerRegistryService, store=store, queue_prefix=queue_prefix)
    remote = providers.Factory(
        RemoteWorkerService,
        execution=execution,
        store=store,
        queue=queue,
        registry=registry,
        clock=clock,
        refresh_every=settings.provided.worker_heartbeat_interval,
        live_within=FLEET_ALIVE_WITHIN,
    )
    inspector = providers.Factory(_queue_inspector, queue)
    fleet = providers.Singleton(
        FleetService,
        store=store,
        clock=clock,
        alive_within=FLEET_ALIVE_WITHIN,
        queue_prefix=queue_prefix,
    )
    explain = providers.Factory(
        ExplainService,
        store=store,
        inspector=inspector,
        fleet=fleet,
        stale_running_after=policy.provided.stale_running_after,
        reconcile_interval=settings.provided.reconcile_interval,
    )
    tokens = providers.Singleton(TokenService, store=store, clock=clock)
    sessions = providers.Singleton(SessionService, store=store, clock=clock)
    retention = providers.Singleton(
        RetentionService, store=store, policy=providers.Callable(_retention_policy, settings)
    )

    events = providers.Singleton(
        EventService, store=store, policy=settings.provided.event_stream_policy.call()
    )

    webhook_sender = providers.Singleton(_webhook_sender, timeout=settings.provided.webhook_timeout)
    webhooks = providers.Singleton(
        WebhookService,
        store=store,
        sender=webhook_sender,
        policy=settings.provided.webhook_policy.call(),
    )

    api_services = providers.Factory(
        ApiServices,
        submit=submit,
        queries=queries,
        health=health,
        artifacts=artifacts,
        explain=explain,
        fleet=fleet,
        tokens=tokens,
        control=control,
        remote=remote,
        bulk=bulk,
        events=events,
        inspector=inspector,
        webhooks=webhooks,
        sessions=sessions,
    )
    worker_services = providers.Factory(
        WorkerServices, execution=execution, registry=registry, queue=queue, artifacts=artifacts
    )
    reconciler_services = providers.Factory(
        ReconcilerServices, reconcile=reconcile, retention=retention, webhooks=webhooks
    )


def build_container(settings: Settings, *, backend: Backend) -> Container:
    """Build (but do not start) a container for ``settings`` on ``backend``.

    Args:
        settings: the process configuration.
        backend: ``"memory"`` or ``"real"``.

    Returns:
        A container whose providers can be overridden before :func:`open_services`.

    Raises:
        ValueError: ``backend`` is not one of ``memory``/``real``.
        ConfigError: the real backend without ``CRDB_DSN``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "real":
        settings.require_dsn()
    return Container(settings=settings, backend=backend)


async def _resolve(provider: Any) -> Any:
    """Call a provider; await the result when it is asynchronous (async resources, and every
    provider that depends on one, return awaitables)."""
    value = provider()
    if inspect.isawaitable(value):
        value = await value
    return value


@asynccontextmanager
async def open_services(
    settings: Settings,
    *,
    backend: Backend,
    container: Container | None = None,
    on_store_retry: Callable[[str], None] | None = None,
    on_push_missed: Callable[[str, int], None] | None = None,
) -> AsyncIterator[Services]:
    """Start the backends, yield the services, and close the backends on exit.

    Args:
        settings: the process configuration.
        backend: ``"memory"`` (in-process fakes) or ``"real"`` (CockroachDB/PostgreSQL + Redis).
        container: a container built by :func:`build_container` for the same backend,
            possibly with overridden providers; a new one when None.
        on_store_retry: metric hook for the real store's transaction re-runs (the reason:
            SQLSTATE, ``concurrent_update`` or ``connection_lost``).
        on_push_missed: metric hook for a submit's push after the commit that failed or was
            skipped (the reason, ``failed`` or ``skipped``, and the number of jobs).

    Yields:
        The resolved :class:`~dtq.entrypoints.bundles.Services`: the three bundles on one store
        and one queue.

    Raises:
        ValueError: ``container`` was built for another backend.
        ConfigError: the real backend without ``CRDB_DSN``, or with a database that cannot be
            reached at start; ``ARTIFACT_BACKEND=s3`` with a bucket that does not exist
            (:func:`check_artifact_store`).
    """
    if container is None:
        container = build_container(settings, backend=backend)
    elif container.backend() != backend:
        raise ValueError(f"the container was built for backend {container.backend()!r}")
    if on_store_retry is not None:
        container.store_retry_hook.override(providers.Object(on_store_retry))
    if on_push_missed is not None:
        container.push_missed_hook.override(providers.Object(on_push_missed))
    await check_artifact_store(settings, container.artifact_store())
    try:
        services = Services(
            settings=settings,
            store=await _resolve(container.store),
            queue=await _resolve(container.queue),
            api=await _resolve(container.api_services),
            worker=await _resolve(container.worker_services),
            reconciler=await _resolve(container.reconciler_services),
        )
        yield services
    finally:
        shutdown = container.shutdown_resources()
        if inspect.isawaitable(shutdown):
            await shutdown


@asynccontextmanager
async def open_worker_services(
    settings: Settings, *, backend: Backend = "real", container: Container | None = None
) -> AsyncIterator[WorkerServices]:
    """Like :func:`open_services`, yielding only the worker's bundle (``dtq worker``).

    Raises:
        ValueError: ``container`` was built for another backend.
        ConfigError: as :func:`open_services`.
    """
    async with open_services(settings, backend=backend, container=container) as services:
        yield services.worker


@asynccontextmanager
async def open_token_service(settings: Settings) -> AsyncIterator[TokenService]:
    """The token service on the real store alone (``dtq token``: no Redis needed).

    Raises:
        ConfigError: ``CRDB_DSN`` is unset or names a database that cannot be reached.
    """
    container = build_container(settings, backend="real")
    try:
        await _resolve(container.store)
        yield await _resolve(container.tokens)
    finally:
        shutdown = container.shutdown_resources()
        if inspect.isawaitable(shutdown):
            await shutdown


def migrate(settings: Settings) -> list[str]:
    """Apply the schema migrations to ``CRDB_DSN`` (``dtq migrate``).

    Returns:
        The ids of the migrations this call applied, in order; empty when the schema is current.

    Raises:
        ConfigError: ``CRDB_DSN`` is unset, or names a database that cannot be reached (one
            line with host, port and reason, as at the start of ``dtq orchestrator``).
        BackendUnavailable: the database was reached but refused a migration, or the migration
            lock stayed taken.
    """
    import psycopg

    from dtq.adapters.cockroach import apply_migrations
    from dtq.adapters.cockroach.pool import describe_connect_error

    dsn = settings.require_dsn()
    try:
        return apply_migrations(dsn)
    except BackendUnavailable as exc:
        cause = exc.__cause__
        # No SQLSTATE: libpq never got an answer from a server (refused, unresolvable, timed
        # out, or the server refused the session itself, e.g. an unknown database).
        if isinstance(cause, psycopg.OperationalError) and cause.sqlstate is None:
            raise ConfigError(
                "CRDB_DSN", f"cannot connect: {describe_connect_error(cause)}"
            ) from exc
        raise
