"""Configuration: the environment variables of spec §8 (plus dtq's own), read once, validated.

``load_settings(environ)`` turns a mapping of variable names to strings into a frozen
:class:`Settings`. One variable is read elsewhere: ``DTQ_EVENT_LOOP`` is read from the real
process environment by :mod:`dtq.entrypoints.eventloop`, because the loop must be chosen before
any coroutine (and so before settings) runs; it is listed in :data:`ENV_VARS` all the same.
Durations are Go-style strings (``500ms``, ``30s``, ``1h30m``), stored as float seconds and
range-checked (positive, at most :data:`MAX_DURATION`). A value that cannot be used raises
:class:`ConfigError` naming the variable, so the CLI can print one line.

An empty value counts as unset (``WORKER_ID=`` in a ``.env`` file means "generate one").
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import psycopg
from dotenv import dotenv_values
from psycopg.conninfo import conninfo_to_dict

from dtq.application.commands import ExecutionPolicy
from dtq.application.events import EventStreamPolicy
from dtq.application.retention import RetentionPolicy
from dtq.application.webhooks import WebhookPolicy
from dtq.domain.urls import http_url_problem
from dtq.entrypoints.config_values import (
    ConfigError,
    ascii_int,
    listen_address,
    parse_duration,
    redis_address,
    redis_key_prefix,
)

__all__ = [
    "ENV_VARS",
    "MAX_DURATION",
    "ConfigError",
    "LogFormat",
    "LogLevel",
    "Settings",
    "listen_address",
    "load_dotenv_file",
    "load_settings",
    "parse_duration",
    "redis_address",
]

T = TypeVar("T")

LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
ArtifactBackend = Literal["fs", "s3"]
ApiAuth = Literal["tokens", "none"]

_MIB = 1024 * 1024
#: Upper bound of ``API_MAX_RESULT_BYTES``: a result lives in the task's row.
MAX_RESULT_BYTES = 64 * _MIB
_KIB = 1024

#: Every environment variable dtq reads, in the order of ``.env.example``.
ENV_VARS: tuple[str, ...] = (
    "CRDB_DSN",
    "REDIS_ADDR",
    "REDIS_KEY_PREFIX",
    "ORCHESTRATOR_LISTEN",
    "RECONCILE_INTERVAL",
    "LEASE_DURATION",
    "STALE_RUNNING_AFTER",
    "WORKER_ID",
    "WORKER_CONCURRENCY",
    "WORKER_HEARTBEAT_INTERVAL",
    "RETRY_BACKOFF",
    "PENDING_MARKER_TTL",
    "MAX_RECLAIMS",
    "PROMOTE_INTERVAL",
    "RECONCILE_BATCH",
    "WORKER_METRICS_LISTEN",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "API_MAX_BODY_BYTES",
    "API_MAX_TASKS_PER_JOB",
    "API_MAX_PAYLOAD_BYTES",
    "API_MAX_RESULT_BYTES",
    "DB_POOL_SIZE",
    "DB_ACQUIRE_TIMEOUT",
    "REDIS_PUSH_TRIAL_TIMEOUT",
    "DTQ_EVENT_LOOP",
    "ARTIFACT_BACKEND",
    "ARTIFACT_DIR",
    "ARTIFACT_S3_BUCKET",
    "ARTIFACT_S3_ENDPOINT",
    "API_MAX_ARTIFACT_BYTES",
    "API_AUTH",
    "METRICS_AUTH",
    "RETENTION_COMPLETED",
    "RETENTION_FAILED",
    "IDEMPOTENCY_KEY_TTL",
    "DTQ_TOKEN",
    "EVENTS_SETTLE",
    "EVENTS_POLL_INTERVAL",
    "WEBHOOK_TIMEOUT",
    "WEBHOOK_BACKOFF_MIN",
    "WEBHOOK_BACKOFF_MAX",
    "WEBHOOK_POLL_INTERVAL",
)

_LOG_FORMATS: tuple[LogFormat, ...] = ("auto", "json", "console")
_LOG_LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warning", "error", "critical")
_MIN_HEARTBEAT_INTERVAL = 1.0
_ARTIFACT_BACKENDS: tuple[ArtifactBackend, ...] = ("fs", "s3")
_API_AUTHS: tuple[ApiAuth, ...] = ("tokens", "none")
_BOOLEANS: tuple[str, ...] = ("true", "false")
_BOOLEAN_ALIASES = {
    "1": "true",
    "yes": "true",
    "on": "true",
    "0": "false",
    "no": "false",
    "off": "false",
}
#: Upper bound of ``API_MAX_ARTIFACT_BYTES`` (1 TiB): one upload is one streamed request.
_MAX_ARTIFACT_BYTES = 1024 * 1024 * _MIB
#: Longest accepted duration, in seconds (7 days). Far beyond any sensible lease or interval, and
#: far below what overflows a timestamp when added to the database's ``now()``.
MAX_DURATION = 7 * 24 * 3600.0
#: Longest retention or idempotency-key TTL (about ten years, in seconds): far below what
#: overflows a timestamp when subtracted from the database's ``now()``.
MAX_RETENTION = 3650 * 86400.0
_DAY = 86400.0
#: Longest ``DB_ACQUIRE_TIMEOUT``: past a minute a request is better failed (503) than held.
_MAX_ACQUIRE_TIMEOUT = 60.0
#: Longest ``REDIS_PUSH_TRIAL_TIMEOUT``: the Redis client's own reply timeout (3 s) bounds a push
#: anyway.
_MAX_PUSH_TRIAL_TIMEOUT = 3.0
#: Upper bounds of the integer variables: far past any sensible value, and far below what
#: overflows the database's BIGINT or a Python allocation.
_MAX_CONCURRENCY = 4096
_MAX_RECLAIMS = 1000
_MAX_RECONCILE_BATCH = 100_000
_MAX_BODY_BYTES = 1024 * _MIB
_MAX_TASKS_PER_JOB = 1_000_000
_MAX_PAYLOAD_BYTES = 64 * _MIB
_MAX_POOL_SIZE = 1000
#: libpq's ``sslmode`` values; any other makes every connection attempt fail.
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _new_worker_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Validated configuration; durations in seconds, sizes in bytes (spec §8).

    Build it with :func:`load_settings`; the defaults here are the documented defaults, so
    ``Settings()`` is a valid memory-backend configuration for tests.

    Attributes:
        crdb_dsn: PostgreSQL/CockroachDB DSN (``CRDB_DSN``); required by the real backend only.
        redis_addr: Redis ``host:port``, URL or ``redis+cluster://`` seed list (``REDIS_ADDR``).
        redis_key_prefix: prefix of every Redis key (``REDIS_KEY_PREFIX``), made their hash tag.
        orchestrator_listen: HTTP bind address (``ORCHESTRATOR_LISTEN``); ``:8080`` = all
            interfaces. See :func:`listen_address`.
        reconcile_interval: seconds between reconcile passes (``RECONCILE_INTERVAL``).
        lease_duration: logical lease window in seconds (``LEASE_DURATION``).
        stale_running_after: minimum seconds a task stays ``running`` before reclaim is
            considered (``STALE_RUNNING_AFTER``; default twice lease_duration).
        worker_id: stable worker identity (``WORKER_ID``; default a random UUID).
        worker_concurrency: parallel pop loops per worker process (``WORKER_CONCURRENCY``).
        worker_heartbeat_interval: seconds between worker-registry upserts, ≥ 1
            (``WORKER_HEARTBEAT_INTERVAL``). Not the lease heartbeat.
        retry_backoff: seconds before a failed task is retried (``RETRY_BACKOFF``).
        pending_marker_ttl: TTL in seconds of the pending marker (``PENDING_MARKER_TTL``).
        max_reclaims: lost-worker reclaims allowed per task before it fails (``MAX_RECLAIMS``).
        promote_interval: seconds between scheduled-set promotions (``PROMOTE_INTERVAL``).
        reconcile_batch: page size of the reconciler's scans (``RECONCILE_BATCH``).
        worker_metrics_listen: bind address of a worker's ``/metrics``, or None for none
            (``WORKER_METRICS_LISTEN``).
        log_format: ``auto`` (JSON unless stderr is a TTY), ``json`` or ``console``.
        log_level: ``debug``, ``info``, ``warning``, ``error`` or ``critical``.
        api_max_body_bytes: largest accepted request body (``API_MAX_BODY_BYTES``).
        api_max_tasks_per_job: most tasks in one submitted job (``API_MAX_TASKS_PER_JOB``).
        api_max_payload_bytes: largest encoded payload of one task (``API_MAX_PAYLOAD_BYTES``).
        api_max_result_bytes: largest JSON-encoded result of one task, 1 B..64 MiB
            (``API_MAX_RESULT_BYTES``); a larger one fails its run permanently.
        db_pool_size: maximum connections in the database pool (``DB_POOL_SIZE``).
        db_acquire_timeout: seconds a request waits for a database connection before it fails
            with ``BackendUnavailable`` (HTTP 503), and the connect timeout of one connection
            attempt (``DB_ACQUIRE_TIMEOUT``).
        redis_push_trial_timeout: seconds the push breaker's half-open trial push may take
            before it is given up as failed (``REDIS_PUSH_TRIAL_TIMEOUT``, at most 3 s; the
            push after a submit's commit, ARCHITECTURE.md "The push breaker").
        artifact_backend: ``fs`` (a directory) or ``s3`` (a bucket) (``ARTIFACT_BACKEND``).
        artifact_dir: the fs backend's directory (``ARTIFACT_DIR``); None means ``./artifacts``
            (``dtq dev``: a new temporary directory).
        artifact_s3_bucket: the s3 backend's bucket (``ARTIFACT_S3_BUCKET``, required for s3).
        artifact_s3_endpoint: an S3-compatible endpoint URL, or None for AWS
            (``ARTIFACT_S3_ENDPOINT``).
        artifact_s3_credentials: ``(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)``
            from the environment; empty keys mean unsigned requests. Not shown in ``repr``.
        api_max_artifact_bytes: largest accepted ``POST /v1/artifacts`` body, 1 B..1 TiB
            (``API_MAX_ARTIFACT_BYTES``; 413 above it).
        api_auth: ``tokens`` (every ``/v1`` route needs ``Authorization: Bearer <token>`` with
            the route's scope) or ``none`` (no authentication) (``API_AUTH``; issue 15 item 3).
            ``dtq dev`` defaults to ``none``.
        metrics_auth: ``GET /metrics`` needs a ``read`` token too (``METRICS_AUTH``, ``true`` or
            ``false``; only with ``api_auth="tokens"``).
        retention_completed: seconds a completed job is kept after it finished, 0 = for ever
            (``RETENTION_COMPLETED``, default 7 days; issue 14 item 8).
        retention_failed: the same for failed and cancelled jobs (``RETENTION_FAILED``,
            default 30 days).
        idempotency_key_ttl: seconds a pruned job's ``Idempotency-Key`` still answers its
            original ids; 0 = not at all (``IDEMPOTENCY_KEY_TTL``, default 7 days).
        dtq_token: ``DTQ_TOKEN``, the bearer token an HTTP worker sends to the orchestrator
            (issue 15 item 1); None when unset. Not shown in ``repr``.
        events_settle: seconds an outbox event must be old before ``GET /v1/events`` serves it
            (``EVENTS_SETTLE``, default 1s, at most 1m; issue 16 item 1): more than the time
            from a transaction's outbox insert to its COMMIT plus the database nodes' clock
            offset.
        events_poll_interval: seconds between outbox reads of a caught-up stream
            (``EVENTS_POLL_INTERVAL``, default 250ms, 10ms..10s).
        webhook_timeout: seconds one webhook request may take in all (``WEBHOOK_TIMEOUT``,
            default 5s, at most 1m; issue 16 item 2).
        webhook_backoff_min: seconds before the first retry of a failed delivery
            (``WEBHOOK_BACKOFF_MIN``, default 1s); doubled per failure in a row, with jitter.
        webhook_backoff_max: the longest gap between two tries (``WEBHOOK_BACKOFF_MAX``,
            default 5m; at least ``webhook_backoff_min``).
        webhook_poll_interval: seconds between outbox reads of a caught-up webhook, and between
            reads of the webhook list (``WEBHOOK_POLL_INTERVAL``, default 1s, 10ms..1m).
    """

    crdb_dsn: str | None = None
    redis_addr: str = "127.0.0.1:6379"
    redis_key_prefix: str = "dto:"
    orchestrator_listen: str = ":8080"
    reconcile_interval: float = 30.0
    lease_duration: float = 30.0
    stale_running_after: float = 60.0
    worker_id: str = field(default_factory=_new_worker_id)
    worker_concurrency: int = 1
    worker_heartbeat_interval: float = 30.0
    retry_backoff: float = 5.0
    pending_marker_ttl: float = 15.0
    max_reclaims: int = 5
    promote_interval: float = 0.025
    reconcile_batch: int = 500
    worker_metrics_listen: str | None = None
    log_format: LogFormat = "auto"
    log_level: LogLevel = "info"
    api_max_body_bytes: int = 10 * _MIB
    api_max_tasks_per_job: int = 10_000
    api_max_payload_bytes: int = 256 * _KIB
    api_max_result_bytes: int = _MIB
    db_pool_size: int = 8
    db_acquire_timeout: float = 3.0
    redis_push_trial_timeout: float = 0.5
    artifact_backend: ArtifactBackend = "fs"
    artifact_dir: Path | None = None
    artifact_s3_bucket: str | None = None
    artifact_s3_endpoint: str | None = None
    artifact_s3_credentials: tuple[str, str, str] = field(default=("", "", "us-east-1"), repr=False)
    api_max_artifact_bytes: int = 256 * _MIB
    api_auth: ApiAuth = "tokens"
    metrics_auth: bool = False
    retention_completed: float = 7 * _DAY
    retention_failed: float = 30 * _DAY
    idempotency_key_ttl: float = 7 * _DAY
    dtq_token: str | None = field(default=None, repr=False)
    events_settle: float = 1.0
    events_poll_interval: float = 0.25
    webhook_timeout: float = 5.0
    webhook_backoff_min: float = 1.0
    webhook_backoff_max: float = 300.0
    webhook_poll_interval: float = 1.0

    def webhook_policy(self) -> WebhookPolicy:
        """The webhook deliveries' timings (issue 16 item 2); events settle as for the stream."""
        return WebhookPolicy(
            timeout=self.webhook_timeout,
            backoff_first=self.webhook_backoff_min,
            backoff_cap=self.webhook_backoff_max,
            poll_interval=self.webhook_poll_interval,
            settle=self.events_settle,
        )

    def event_stream_policy(self) -> EventStreamPolicy:
        """The event stream's timings (issue 16 item 1)."""
        return EventStreamPolicy(settle=self.events_settle, poll_interval=self.events_poll_interval)

    def retention_policy(self) -> RetentionPolicy:
        """The retention periods of the reconciler's retention pass (issue 14 item 8)."""
        return RetentionPolicy(
            completed=self.retention_completed,
            failed=self.retention_failed,
            idempotency_key_ttl=self.idempotency_key_ttl,
        )

    def execution_policy(self) -> ExecutionPolicy:
        """The timings and budgets the execution and reconcile services run with.

        Returns:
            An ``ExecutionPolicy`` with this configuration's lease duration, retry backoff,
            stale threshold and reclaim budget (the lease TTL buffer keeps its default).
        """
        return ExecutionPolicy(
            lease_duration=self.lease_duration,
            retry_backoff=self.retry_backoff,
            stale_running_after=self.stale_running_after,
            max_reclaims=self.max_reclaims,
            max_result_bytes=self.api_max_result_bytes,
        )

    def require_dsn(self) -> str:
        """The database DSN, for commands that need the real database.

        Returns:
            ``crdb_dsn``.

        Raises:
            ConfigError: ``CRDB_DSN`` is not set, is neither a ``postgresql://`` URL nor a
                libpq ``key=value`` string, or has an ``sslmode`` libpq does not know.
        """
        example = "e.g. postgresql://root@127.0.0.1:26257/defaultdb?sslmode=disable"
        if not self.crdb_dsn:
            raise ConfigError("CRDB_DSN", f"required ({example})")
        try:
            params = conninfo_to_dict(self.crdb_dsn)
        except psycopg.ProgrammingError as exc:
            reason = " ".join(str(exc).split())
            raise ConfigError("CRDB_DSN", f"not a PostgreSQL DSN ({reason}); {example}") from None
        sslmode = params.get("sslmode")
        if sslmode is not None and sslmode not in _SSLMODES:
            raise ConfigError(
                "CRDB_DSN", f"sslmode must be one of {'|'.join(_SSLMODES)}, got {sslmode!r}"
            )
        return self.crdb_dsn


def load_dotenv_file(
    path: str | os.PathLike[str] = ".env", *, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Merge a ``.env`` file under the real environment (real variables win).

    A missing file is not an error: the result is then a copy of the environment. Keys the
    file lists without a value are ignored.

    Args:
        path: the dotenv file.
        environ: the process environment; ``os.environ`` when None.

    Returns:
        A new mapping suitable for :func:`load_settings`.

    Raises:
        ConfigError: the file cannot be read, or is not UTF-8 text (named by its path).
    """
    real = os.environ if environ is None else environ
    merged: dict[str, str] = {}
    if Path(path).is_file():
        try:
            values = dotenv_values(path, encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                str(path), f"not UTF-8 text (byte {exc.start}: {exc.object[exc.start]:#04x})"
            ) from None
        except OSError as exc:
            raise ConfigError(str(path), f"cannot read: {exc.strerror or exc}") from None
        merged.update({k: v for k, v in values.items() if v is not None})
    merged.update(real)
    return merged


class _Reader:
    """Reads and validates variables from one mapping; every error names its variable."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def raw(self, name: str) -> str | None:
        value = self._environ.get(name)
        if value is None or not value.strip():
            return None
        return value.strip()

    def text(self, name: str, default: str) -> str:
        value = self.raw(name)
        return default if value is None else value

    def _parsed(self, name: str, default: T, parse: Callable[[str], T]) -> T:
        value = self.raw(name)
        return default if value is None else parse(value)

    def duration(
        self,
        name: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float = MAX_DURATION,
    ) -> float:
        seconds = self._parsed(name, default, lambda v: parse_duration(v, variable=name))
        if seconds <= 0:
            raw = self.raw(name)
            # e.g. 1ns: positive as written, but no whole microsecond
            if (
                raw is not None
                and not raw.lstrip().startswith("-")
                and any(map(str.isdigit, raw.replace("0", "")))
            ):
                raise ConfigError(
                    name,
                    f"must be at least 1us (durations count whole microseconds), got {raw!r}",
                )
            raise ConfigError(name, f"must be a positive duration, got {raw!r}")
        if minimum is not None and seconds < minimum:
            raise ConfigError(name, f"must be at least {minimum:g}s, got {self.raw(name)!r}")
        if seconds > maximum and self.raw(name) is not None:  # a derived default may exceed it
            limit = f"{maximum / 3600:g}h" if maximum >= 3600 else f"{maximum:g}s"
            raise ConfigError(name, f"must be at most {limit}, got {self.raw(name)!r}")
        return seconds

    def integer(self, name: str, default: int, *, minimum: int, maximum: int) -> int:
        def parse(value: str) -> int:
            shown = repr(value) if len(value) <= 40 else f"{value[:20]!r}... ({len(value)} chars)"
            digits = value.lstrip("+-")
            if len(digits) > len(str(maximum)) and digits.isascii() and digits.isdigit():
                # Checked before int(): a 5000-digit value is out of range, not "not an integer".
                if value.startswith("-"):
                    raise ConfigError(name, f"must be at least {minimum}, got {shown}")
                raise ConfigError(name, f"must be at most {maximum}, got {shown}")
            try:
                return ascii_int(value)
            except ValueError:
                raise ConfigError(name, f"must be an integer, got {shown}") from None

        number = self._parsed(name, default, parse)
        if number < minimum:
            raise ConfigError(name, f"must be at least {minimum}, got {number}")
        if number > maximum:
            raise ConfigError(name, f"must be at most {maximum}, got {number}")
        return number

    def choice(self, name: str, default: T, choices: tuple[T, ...], aliases: dict[str, T]) -> T:
        value = self.raw(name)
        if value is None:
            return default
        key = value.lower()
        for choice in choices:
            if key == choice:
                return choice
        if key in aliases:
            return aliases[key]
        allowed = "|".join(str(c) for c in choices)
        if aliases:
            allowed += f" (or {', '.join(aliases)}; any case)"
        raise ConfigError(name, f"must be one of {allowed}, got {value!r}")


def load_settings(environ: Mapping[str, str]) -> Settings:
    """Build :class:`Settings` from environment variables (spec §8).

    Args:
        environ: variable name → value, e.g. ``os.environ`` or :func:`load_dotenv_file`'s
            result. Unknown keys are ignored; empty values count as unset.

    Returns:
        The validated settings.

    Raises:
        ConfigError: the first variable whose value cannot be used, with the reason.
    """
    env = _Reader(environ)

    listen = env.text("ORCHESTRATOR_LISTEN", ":8080")
    listen_address(listen, variable="ORCHESTRATOR_LISTEN")
    metrics_listen = env.raw("WORKER_METRICS_LISTEN")
    if metrics_listen is not None:
        listen_address(metrics_listen, variable="WORKER_METRICS_LISTEN")

    redis_addr = redis_address(env.text("REDIS_ADDR", "127.0.0.1:6379"))

    lease = env.duration("LEASE_DURATION", 30.0, minimum=1.0)
    stale = env.duration("STALE_RUNNING_AFTER", 2 * lease)
    if stale < lease:
        # A run younger than its own lease window is never stale; a shorter threshold would
        # let the reconciler reclaim on a lease that merely expired between two heartbeats.
        raise ConfigError(
            "STALE_RUNNING_AFTER",
            f"must be at least LEASE_DURATION ({lease:g}s), got {env.raw('STALE_RUNNING_AFTER')!r}",
        )
    return Settings(
        crdb_dsn=env.raw("CRDB_DSN"),
        redis_addr=redis_addr,
        # The prefix is taken verbatim (not stripped): it is part of every key.
        redis_key_prefix=redis_key_prefix(environ.get("REDIS_KEY_PREFIX") or "dto:"),
        orchestrator_listen=listen,
        reconcile_interval=env.duration("RECONCILE_INTERVAL", 30.0),
        lease_duration=lease,
        stale_running_after=stale,
        worker_id=env.raw("WORKER_ID") or _new_worker_id(),
        worker_concurrency=env.integer(
            "WORKER_CONCURRENCY", 1, minimum=1, maximum=_MAX_CONCURRENCY
        ),
        worker_heartbeat_interval=env.duration(
            "WORKER_HEARTBEAT_INTERVAL", 30.0, minimum=_MIN_HEARTBEAT_INTERVAL
        ),
        retry_backoff=env.duration("RETRY_BACKOFF", 5.0),
        pending_marker_ttl=env.duration("PENDING_MARKER_TTL", 15.0),
        max_reclaims=env.integer("MAX_RECLAIMS", 5, minimum=0, maximum=_MAX_RECLAIMS),
        promote_interval=env.duration("PROMOTE_INTERVAL", 0.025),
        reconcile_batch=env.integer(
            "RECONCILE_BATCH", 500, minimum=1, maximum=_MAX_RECONCILE_BATCH
        ),
        worker_metrics_listen=metrics_listen,
        log_format=env.choice("LOG_FORMAT", "auto", _LOG_FORMATS, {}),
        log_level=env.choice("LOG_LEVEL", "info", _LOG_LEVELS, {"warn": "warning"}),
        api_max_body_bytes=env.integer(
            "API_MAX_BODY_BYTES", 10 * _MIB, minimum=1, maximum=_MAX_BODY_BYTES
        ),
        api_max_tasks_per_job=env.integer(
            "API_MAX_TASKS_PER_JOB", 10_000, minimum=1, maximum=_MAX_TASKS_PER_JOB
        ),
        api_max_payload_bytes=env.integer(
            "API_MAX_PAYLOAD_BYTES", 256 * _KIB, minimum=1, maximum=_MAX_PAYLOAD_BYTES
        ),
        api_max_result_bytes=env.integer(
            "API_MAX_RESULT_BYTES", _MIB, minimum=1, maximum=MAX_RESULT_BYTES
        ),
        db_pool_size=env.integer("DB_POOL_SIZE", 8, minimum=1, maximum=_MAX_POOL_SIZE),
        db_acquire_timeout=env.duration("DB_ACQUIRE_TIMEOUT", 3.0, maximum=_MAX_ACQUIRE_TIMEOUT),
        redis_push_trial_timeout=env.duration(
            "REDIS_PUSH_TRIAL_TIMEOUT", 0.5, maximum=_MAX_PUSH_TRIAL_TIMEOUT
        ),
        **_artifact_settings(env),
        api_auth=env.choice("API_AUTH", "tokens", _API_AUTHS, {}),
        metrics_auth=env.choice("METRICS_AUTH", "false", _BOOLEANS, _BOOLEAN_ALIASES) == "true",
        **_retention_settings(env),
        dtq_token=env.raw("DTQ_TOKEN"),
        events_settle=env.duration("EVENTS_SETTLE", 1.0, maximum=60.0),
        events_poll_interval=env.duration("EVENTS_POLL_INTERVAL", 0.25, minimum=0.01, maximum=10.0),
        **_webhook_settings(env),
    )


def _webhook_settings(env: _Reader) -> dict[str, Any]:
    backoff_min = env.duration("WEBHOOK_BACKOFF_MIN", 1.0, minimum=0.001, maximum=3600.0)
    backoff_max = env.duration("WEBHOOK_BACKOFF_MAX", 300.0, maximum=86400.0)
    if backoff_max < backoff_min:
        raise ConfigError(
            "WEBHOOK_BACKOFF_MAX", f"must be at least WEBHOOK_BACKOFF_MIN ({backoff_min:g}s)"
        )
    return {
        "webhook_timeout": env.duration("WEBHOOK_TIMEOUT", 5.0, minimum=0.01, maximum=60.0),
        "webhook_backoff_min": backoff_min,
        "webhook_backoff_max": backoff_max,
        "webhook_poll_interval": env.duration(
            "WEBHOOK_POLL_INTERVAL", 1.0, minimum=0.01, maximum=60.0
        ),
    }


def _artifact_settings(env: _Reader) -> dict[str, Any]:
    """The ``ARTIFACT_*`` settings and ``API_MAX_ARTIFACT_BYTES``, checked (issue 13 item 4)."""
    backend = env.choice("ARTIFACT_BACKEND", "fs", _ARTIFACT_BACKENDS, {})
    bucket = env.raw("ARTIFACT_S3_BUCKET")
    if backend == "s3" and bucket is None:
        raise ConfigError("ARTIFACT_S3_BUCKET", "required when ARTIFACT_BACKEND=s3")
    endpoint = env.raw("ARTIFACT_S3_ENDPOINT")
    problem = None if endpoint is None else http_url_problem(endpoint)
    if problem is not None:
        raise ConfigError("ARTIFACT_S3_ENDPOINT", f"must be an http(s):// URL, got {endpoint!r}")
    directory = env.raw("ARTIFACT_DIR")
    return {
        "artifact_backend": backend,
        "artifact_dir": None if directory is None else Path(directory).expanduser(),
        "artifact_s3_bucket": bucket,
        "artifact_s3_endpoint": endpoint,
        "artifact_s3_credentials": (
            env.raw("AWS_ACCESS_KEY_ID") or "",
            env.raw("AWS_SECRET_ACCESS_KEY") or "",
            env.raw("AWS_REGION") or env.raw("AWS_DEFAULT_REGION") or "us-east-1",
        ),
        "api_max_artifact_bytes": env.integer(
            "API_MAX_ARTIFACT_BYTES", 256 * _MIB, minimum=1, maximum=_MAX_ARTIFACT_BYTES
        ),
    }


def _retention_settings(env: _Reader) -> dict[str, Any]:
    """``RETENTION_COMPLETED``, ``RETENTION_FAILED``, ``IDEMPOTENCY_KEY_TTL`` (issue 14 item 8):
    Go durations where ``0`` is allowed (it disables), at most :data:`MAX_RETENTION`."""

    def period(name: str, default: float) -> float:
        raw = env.raw(name)
        if raw is None:
            return default
        seconds = parse_duration(raw, variable=name)
        if seconds < 0:
            raise ConfigError(name, f"must not be negative (0 disables), got {raw!r}")
        if seconds > MAX_RETENTION:
            raise ConfigError(name, f"must be at most {MAX_RETENTION / 3600:g}h, got {raw!r}")
        return seconds

    return {
        "retention_completed": period("RETENTION_COMPLETED", 7 * _DAY),
        "retention_failed": period("RETENTION_FAILED", 30 * _DAY),
        "idempotency_key_ttl": period("IDEMPOTENCY_KEY_TTL", 7 * _DAY),
    }
