"""``dtq worker`` (and ``dtq-worker``): run a worker runtime on the real backend (spec §6), or
over HTTP with ``--orchestrator URL`` (issue 15 item 1: no database or Redis credentials)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from dtq.domain.urls import http_url_problem
from dtq.entrypoints.cli.apps import load_runtime
from dtq.entrypoints.cli.common import (
    EXIT_OK,
    UsageError,
    add_app_option,
    cli_settings,
    exit_without_lingering_threads,
    positive_int,
    run,
)
from dtq.entrypoints.config import Settings

if TYPE_CHECKING:
    from dtq.entrypoints.worker.runtime import Runtime


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``worker`` on the ``commands`` subparsers."""
    parser = commands.add_parser("worker", help="run a worker runtime", parents=list(parents))
    add_app_option(parser, required=True)
    parser.add_argument(
        "--concurrency", type=positive_int, metavar="N", help="poll loops (WORKER_CONCURRENCY)"
    )
    parser.add_argument(
        "--orchestrator",
        metavar="URL",
        help=(
            "work over HTTP through this orchestrator (e.g. http://host:8080) instead of the "
            "database and Redis; sends DTQ_TOKEN as a bearer token when set"
        ),
    )
    parser.set_defaults(command=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    """Load settings and ``--app``, then work until a signal.

    Raises:
        UsageError: ``--app`` is missing or blank (the demo runtime is never a worker's), or
            cannot be loaded; ``--orchestrator`` is not an http(s) URL.
    """
    settings = cli_settings(args, service="dtq-worker")
    if args.concurrency is not None:
        settings = dataclasses.replace(settings, worker_concurrency=args.concurrency)
    orchestrator = _orchestrator_url(args.orchestrator)
    if orchestrator is None:
        settings.require_dsn()
    if args.app is None or not args.app.strip():
        # Checked here, not by argparse, so configuration errors are still reported first. A
        # blank --app ('' from an unset shell variable) is as missing as no --app at all.
        raise UsageError(
            "--app",
            "required: the Runtime with your handlers, e.g. --app myapp.tasks:runtime (a worker "
            "without them would fail every task it pops; the demo echo runtime is for dtq dev)",
        )
    runtime = load_runtime(args.app)
    if orchestrator is not None:
        return exit_without_lingering_threads(run(work_over_http(settings, runtime, orchestrator)))
    return exit_without_lingering_threads(run(work(settings, runtime)))


def _orchestrator_url(value: str | None) -> str | None:
    """``--orchestrator``, checked: an ``http(s)://host[:port]`` URL.

    Raises:
        UsageError: anything else.
    """
    if value is None:
        return None
    problem = http_url_problem(value) or ("has a query" if urlsplit(value).query else None)
    if problem is not None:
        raise UsageError(
            "--orchestrator", f"must be an http(s)://host[:port] URL ({problem}), got {value!r}"
        )
    return value.rstrip("/")


async def work(settings: Settings, runtime: Runtime) -> int:
    """Open the worker's bundle on the real backend and serve ``runtime`` until a signal."""
    from dtq.entrypoints.container import open_worker_services
    from dtq.entrypoints.worker.runtime import serve

    await serve(runtime, settings, lambda: open_worker_services(settings, backend="real"))
    return EXIT_OK


async def work_over_http(settings: Settings, runtime: Runtime, url: str) -> int:
    """Serve ``runtime`` through the orchestrator at ``url`` (``/v1/worker``) until a signal."""
    from dtq.entrypoints.worker.http import open_http_worker_services
    from dtq.entrypoints.worker.runtime import serve

    await serve(
        runtime,
        settings,
        lambda: open_http_worker_services(
            url,
            worker_id=settings.worker_id,
            kinds=runtime.kinds,
            lease_duration=settings.lease_duration,
            max_result_bytes=settings.api_max_result_bytes,
            token=settings.dtq_token,
        ),
    )
    return EXIT_OK
