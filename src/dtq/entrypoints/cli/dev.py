"""``dtq dev``: API + reconciler + one worker in one process on the in-memory backend."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import uvicorn

from dtq.entrypoints.cli.apps import load_runtime
from dtq.entrypoints.cli.common import (
    add_app_option,
    cli_settings,
    exit_without_lingering_threads,
    port,
    run,
    say,
)
from dtq.entrypoints.config import ConfigError, Settings, listen_address

#: Timings of ``dtq dev`` unless the environment sets them: fast feedback on one machine.
DEV_DEFAULTS: Mapping[str, str] = {
    "LEASE_DURATION": "10s",
    "RECONCILE_INTERVAL": "1s",
    "ORCHESTRATOR_LISTEN": "127.0.0.1:8080",
    "API_AUTH": "none",
}

_CURL_EXAMPLE = (
    "curl -sS -X POST http://{host}:{port}/v1/tasks -H 'Content-Type: application/json' "
    """-d '{{"kind":"echo","payload":{{"msg":"hi"}}}}'"""
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``dev`` on the ``commands`` subparsers."""
    parser = commands.add_parser(
        "dev", help="API + reconciler + worker in memory, one process", parents=list(parents)
    )
    add_app_option(parser)
    parser.add_argument(
        "--port", type=port, metavar="N", help="HTTP port (default 8080, 0 = any free port)"
    )
    parser.set_defaults(command=cmd_dev)


def cmd_dev(args: argparse.Namespace) -> int:
    """Run everything in memory until a signal (``DEV_DEFAULTS`` under the environment)."""
    from dtq.entrypoints.cli.orchestrator import serve

    settings = cli_settings(args, defaults=DEV_DEFAULTS, service="dtq-dev")
    if args.port is not None:
        host, _ = listen_address(settings.orchestrator_listen)
        settings = dataclasses.replace(settings, orchestrator_listen=f"[{host}]:{args.port}")
    check_dev_auth(settings)
    runtime = load_runtime(args.app)  # a bad --app fails before any directory is made
    chosen = settings
    settings = dev_artifact_dir(settings)
    try:
        code = run(serve(settings, backend="memory", runtime=runtime))
    finally:
        drop_empty_artifact_dir(chosen, settings)
    return exit_without_lingering_threads(code)


def check_dev_auth(settings: Settings) -> None:
    """``dtq dev`` serves without authentication, on loopback only (ARCHITECTURE.md, "API tokens").

    Tokens live in the database and ``dtq token create`` runs in another process, which cannot
    reach the dev server's in-memory store, so ``API_AUTH=tokens`` could admit nobody.

    Raises:
        ConfigError: ``API_AUTH=tokens``, or ``ORCHESTRATOR_LISTEN`` not a loopback address.
    """
    from dtq.entrypoints.cli.orchestrator import is_loopback

    if settings.api_auth != "none":
        raise ConfigError(
            "API_AUTH",
            "dtq dev runs on the in-memory backend, which `dtq token create` cannot reach; "
            "only API_AUTH=none (use dtq orchestrator with CRDB_DSN for tokens)",
        )
    host, _ = listen_address(settings.orchestrator_listen)
    if not is_loopback(host):
        raise ConfigError(
            "ORCHESTRATOR_LISTEN",
            f"dtq dev serves without authentication, so it binds loopback only "
            f"(e.g. 127.0.0.1:8080), not {settings.orchestrator_listen!r}",
        )


def dev_artifact_dir(settings: Settings) -> Settings:
    """``settings`` with a new temporary ``ARTIFACT_DIR`` when the fs backend has none set
    (said on stdout; after the run it is left in place for inspection when it holds any
    artifact, see :func:`drop_empty_artifact_dir`)."""
    if settings.artifact_backend != "fs" or settings.artifact_dir is not None:
        return settings
    directory = Path(tempfile.mkdtemp(prefix="dtq-dev-artifacts-"))
    say(f"dtq dev: artifacts in {directory} (ARTIFACT_DIR)")
    return dataclasses.replace(settings, artifact_dir=directory)


def drop_empty_artifact_dir(chosen: Settings, used: Settings) -> None:
    """Remove the temporary ``ARTIFACT_DIR`` :func:`dev_artifact_dir` made for ``used`` if no
    artifact was written to it; a directory the user chose (``chosen``) is never touched."""
    made = used.artifact_dir
    if made is None or made == chosen.artifact_dir:
        return
    with contextlib.suppress(OSError):  # not empty (kept for inspection), or already gone
        made.rmdir()


async def announce(server: uvicorn.Server) -> None:
    """Once the dev server listens, print where and a request to try."""
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    host, bound = server.config.host, server.config.port
    for listener in getattr(server, "servers", []):
        for sock in listener.sockets:
            bound = sock.getsockname()[1]
            break
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    say(f"dtq dev: API on http://{shown}:{bound} (in-memory backend; worker in this process)")
    say("try:")
    say("  " + _CURL_EXAMPLE.format(host=shown, port=bound))
    say(f"then: curl -sS http://{shown}:{bound}/v1/tasks/<task_id>")
