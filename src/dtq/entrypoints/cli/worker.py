"""``dtq worker`` (and ``dtq-worker``): run a worker runtime on the real backend (spec §6)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
    parser.set_defaults(command=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    """Load settings and ``--app``, then work until a signal."""
    settings = cli_settings(args, service="dtq-worker")
    if args.concurrency is not None:
        settings = dataclasses.replace(settings, worker_concurrency=args.concurrency)
    settings.require_dsn()
    if args.app is None:
        # Checked here, not by argparse, so configuration errors are still reported first.
        raise UsageError(
            "--app",
            "required: the Runtime with your handlers, e.g. --app myapp.tasks:runtime (a worker "
            "without them would fail every task it pops; the demo echo runtime is for dtq dev)",
        )
    runtime = load_runtime(args.app)
    return exit_without_lingering_threads(run(work(settings, runtime)))


async def work(settings: Settings, runtime: Runtime) -> int:
    """Open the worker's bundle on the real backend and serve ``runtime`` until a signal."""
    from dtq.entrypoints.container import open_worker_services
    from dtq.entrypoints.worker.runtime import serve

    await serve(runtime, settings, lambda: open_worker_services(settings, backend="real"))
    return EXIT_OK
