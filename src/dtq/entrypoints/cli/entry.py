"""The ``dtq`` parser and the console entry points ``dtq``, ``dtq-worker``, ``dtq-orchestrator``."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.cli import (
    control,
    dev,
    migrate,
    orchestrator,
    submit,
    token,
    watch,
    webhook,
    worker,
)
from dtq.entrypoints.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    PROG,
    UsageError,
    fail,
)
from dtq.entrypoints.config import ConfigError

#: The command groups, in ``--help`` order; each module has ``add_parser(commands, parents)``.
COMMAND_GROUPS = (orchestrator, worker, migrate, token, dev, submit, watch, control, webhook)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dtq``.

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status: 0 done, 1 a backend failed, 2 bad configuration or usage (a database
        unreachable at start included), 130 interrupted before the command could install its
        signal handlers.
    """
    given = list(sys.argv[1:] if argv is None else argv)
    for number, arg in enumerate(given, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:  # bytes the locale could not decode, kept as surrogates
            shown = arg.encode("utf-8", "backslashreplace").decode()
            fail(f"argument {number}: not UTF-8 text: {shown!r}")
            return EXIT_USAGE
    args = parser().parse_args(given)
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except (ConfigError, UsageError) as exc:
        fail(str(exc))
        return EXIT_USAGE
    except BackendUnavailable as exc:
        fail(exc.detail)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def orchestrator_main() -> int:
    """Console entry point ``dtq-orchestrator`` (same as ``dtq orchestrator``)."""
    return main(["orchestrator", *sys.argv[1:]])


def worker_main() -> int:
    """Console entry point ``dtq-worker`` (same as ``dtq worker``)."""
    return main(["worker", *sys.argv[1:]])


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` for which a word starting with ``-`` and a digit (``-1s``,
    ``-1.5e3``, ``-.5``) is a value, never an option: ``--delay -1s`` gives ``--delay`` the
    value ``-1s``, as ``--delay=-1s`` does.

    argparse takes only ``-1`` and ``-1.5`` for negative numbers and reports ``--delay -1s``
    as "expected one argument"; this is the rule later Pythons' argparse applies (its
    ``_negative_number_matcher``). No ``dtq`` option looks like a negative number, so none is
    shadowed. Subparsers are of this class too (``add_subparsers`` uses the parent's class).

    An error is one line, ``<prog>: <message>`` (``dtq submit: --max-attempts: must be at least
    1, got 0``), with exit status 2, instead of argparse's usage block (``--help`` shows it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"-\.?\d")

    def error(self, message: str) -> NoReturn:
        """Write ``<prog>: <message>`` on one line (argparse's ``argument X: ...`` as
        ``X: ...``) to stderr and exit with status 2."""
        subject, sep, rest = message.partition(": ")
        if sep and subject.startswith("argument "):
            message = f"{subject.removeprefix('argument ')}: {rest}"
        self.exit(EXIT_USAGE, f"{self.prog}: {' '.join(message.split())}\n")


def parser() -> argparse.ArgumentParser:
    """The ``dtq`` argument parser with every command group registered."""
    env_help = "dotenv file read under the real environment (default: .env; missing is fine)"
    top = Parser(prog=PROG, description="dtq: distributed task orchestrator (CockroachDB + Redis).")
    top.add_argument("--env-file", default=".env", metavar="PATH", help=env_help)
    # Accepted after the command too (``dtq-worker --env-file x``); SUPPRESS keeps the default
    # above when it is not given there.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--env-file", default=argparse.SUPPRESS, metavar="PATH", help=env_help)
    commands = top.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for group in COMMAND_GROUPS:
        group.add_parser(commands, [common])
    return top
