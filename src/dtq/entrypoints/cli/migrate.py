"""``dtq migrate``: apply the SQL migrations to ``CRDB_DSN`` and print what was applied."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from dtq.entrypoints.cli.common import EXIT_OK, cli_settings, say


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``migrate`` on the ``commands`` subparsers."""
    parser = commands.add_parser(
        "migrate", help="apply SQL migrations to CRDB_DSN", parents=list(parents)
    )
    parser.set_defaults(command=cmd_migrate)


def cmd_migrate(args: argparse.Namespace) -> int:
    """Apply pending migrations; one ``migrate: …`` line per applied migration (or one saying
    nothing was applied). A database that cannot be reached is a ``ConfigError`` (exit 2)."""
    from dtq.entrypoints.container import migrate

    applied = migrate(cli_settings(args))
    if not applied:
        say("migrate: schema is up to date (nothing applied)")
    for migration in applied:
        say(f"migrate: applied {migration}")
    return EXIT_OK
