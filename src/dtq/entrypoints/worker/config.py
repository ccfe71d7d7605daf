"""``WorkerConfig``: everything a worker run is tuned by, resolved once (spec §6, §8)."""

from __future__ import annotations

from dataclasses import dataclass

from dtq.entrypoints.config import Settings
from dtq.worker import Options


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """One worker process's configuration, from ``Settings`` (spec §8) and ``Options`` (§6).

    All durations are seconds.

    Attributes:
        worker_id: ``WORKER_ID``, written to runs and leases.
        concurrency: handler slots (``Options.concurrency`` or ``WORKER_CONCURRENCY``).
        lease_duration: ``LEASE_DURATION``: the window within which a lease must be renewed.
        lease_renew_every: lease renewal period, ``min(Options.lease_renew_every,
            lease_duration / 3)``.
        registry_every: ``WORKER_HEARTBEAT_INTERVAL``, period of the ``workers`` row upsert.
        metrics_listen: ``WORKER_METRICS_LISTEN`` (``[host]:port``), or None for no endpoint.
        priorities, poll_timeout, claim_batch, complete_batch, default_timeout,
        shutdown_grace, sync_threads: as :class:`dtq.worker.Options`.
    """

    worker_id: str
    concurrency: int
    lease_duration: float
    lease_renew_every: float
    registry_every: float
    metrics_listen: str | None
    priorities: tuple[str, ...]
    poll_timeout: float
    claim_batch: int | None
    complete_batch: int
    default_timeout: float | None
    shutdown_grace: float
    sync_threads: int

    @classmethod
    def resolve(cls, settings: Settings, options: Options) -> WorkerConfig:
        """Combine the process settings with a runtime's options.

        Args:
            settings: the process configuration (worker id, concurrency, lease duration, ...).
            options: the runtime's tuning; ``concurrency`` None takes ``WORKER_CONCURRENCY``.

        Returns:
            The frozen configuration of one worker run.
        """
        lease = settings.lease_duration
        return cls(
            worker_id=settings.worker_id,
            concurrency=options.concurrency or settings.worker_concurrency,
            lease_duration=lease,
            lease_renew_every=min(options.lease_renew_every, lease / 3),
            registry_every=settings.worker_heartbeat_interval,
            metrics_listen=settings.worker_metrics_listen or None,
            priorities=options.priorities,
            poll_timeout=options.poll_timeout,
            claim_batch=options.claim_batch,
            complete_batch=options.complete_batch,
            default_timeout=options.default_timeout,
            shutdown_grace=options.shutdown_grace,
            sync_threads=options.sync_threads,
        )
