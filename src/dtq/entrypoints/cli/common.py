"""What every ``dtq`` command shares: exit codes, one-line errors, settings, the loop runner."""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import threading
from collections.abc import Coroutine, Mapping
from typing import Any

from dotenv.parser import parse_stream

from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints import eventloop, tracing
from dtq.entrypoints.config import ConfigError, Settings, load_dotenv_file, load_settings
from dtq.entrypoints.config_values import ascii_int
from dtq.entrypoints.logging import configure_logging

PROG = "dtq"
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """A command-line problem reported as one line with exit status 2.

    Args:
        subject: what the problem is about, e.g. ``--app``.
        message: what is wrong.
    """

    def __init__(self, subject: str, message: str) -> None:
        self.subject = subject
        self.message = message
        super().__init__(f"{subject}: {message}")


def fail(line: str) -> None:
    """Write ``dtq: <line>`` to stderr, whitespace (newlines included) collapsed to one line."""
    sys.stderr.write(f"{PROG}: {' '.join(line.split())}\n")


def say(line: str) -> None:
    """Write ``line`` to stdout and flush."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def positive_int(text: str) -> int:
    """argparse type: an integer in 1..``sys.maxsize`` (ASCII digits; a count or a size that
    Python's own sequences and slices can hold)."""
    try:
        value = ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    if value > sys.maxsize:
        raise argparse.ArgumentTypeError(f"must be at most {sys.maxsize}, got {value}")
    return value


def port(text: str) -> int:
    """argparse type: a TCP port, 0..65535 (0 = any free port)."""
    try:
        value = ascii_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value


def add_app_option(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """Add ``--app MODULE:ATTR`` (checked by the command, so config errors are reported first)."""
    parser.add_argument(
        "--app",
        default=None,
        metavar="MODULE:ATTR",
        help=(
            "the Runtime (or a factory of one) with your handlers (required)"
            if required
            else "the Runtime (or a factory of one) to run; default: the demo echo runtime"
        ),
    )


def cli_settings(
    args: argparse.Namespace,
    *,
    defaults: Mapping[str, str] | None = None,
    service: str | None = None,
) -> Settings:
    """Load settings (``.env`` under the environment, ``defaults`` under both) and configure
    logging from them; for a long-running process (``service``: its OpenTelemetry
    ``service.name``), traces too, from the same variables (``tracing.setup``, issue 16 item 5).

    Raises:
        ConfigError: a variable has an unusable value; as :func:`env_file_environ`.
        UsageError: as :func:`env_file_environ`.
    """
    environ = env_file_environ(args.env_file)
    settings = load_settings({**(defaults or {}), **environ})
    configure_logging(settings.log_format, settings.log_level)
    if service is not None:
        tracing.setup(environ, service_name=service)
    return settings


def env_file_environ(path: str) -> dict[str, str]:
    """The process environment over the dotenv file ``path`` (``--env-file``; ``.env`` by
    default, which may be absent, or a directory such as a virtualenv's).

    Every line of the file must be ``NAME=value`` (``export`` allowed), a comment or blank:
    python-dotenv skips any other with a warning that names neither the file nor the variable
    lost, so it is refused here, by line number (the line is not shown: it may hold a secret).

    Raises:
        UsageError: ``path`` was named and does not exist, or is a directory; a line of the
            file cannot be parsed (named ``<path>: line N``).
        ConfigError: the file cannot be read, or is not UTF-8 text (named by its path).
    """
    if path != ".env":
        if os.path.isdir(path):
            raise UsageError("--env-file", f"{path!r} is a directory, not a file")
        if not os.path.isfile(path):
            raise UsageError("--env-file", f"no such file: {path!r}")
    _check_dotenv_lines(path)
    return load_dotenv_file(path, environ=os.environ)


def _check_dotenv_lines(path: str) -> None:
    """Refuse the first line of ``path`` python-dotenv cannot parse; nothing to check when it
    is not a readable UTF-8 file (absent, or :func:`load_dotenv_file` says what is wrong).

    Raises:
        UsageError: ``<path>: line N is not a NAME=value line, ...``.
    """
    if not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    except (OSError, UnicodeDecodeError):
        return
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            raise UsageError(
                path,
                f"line {binding.original.line} is not a NAME=value line, a comment or blank "
                "(python-dotenv cannot parse it)",
            )


def run(coro: Coroutine[Any, Any, int]) -> int:
    """Run ``coro`` in a new event loop; a lone backend or config error leaves its task group
    as itself, so :func:`~dtq.entrypoints.cli.entry.main` reports it as one line."""
    try:
        return eventloop.run(coro)
    except ExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1 and isinstance(
            leaves[0], BackendUnavailable | ConfigError | UsageError
        ):
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(_leaves(exc))
        else:
            found.append(exc)
    return found


def exit_without_lingering_threads(code: int) -> int:
    """Return ``code``, or end the process at once if handler threads are still running.

    A plain ``def`` handler cannot be interrupted; at shutdown its task was already handed back
    (or its outcome recorded), but Python would wait at exit for its thread to return. Logs are
    flushed first; nothing else is left to do by then.
    """
    lingering = [
        t
        for t in threading.enumerate()
        if t.is_alive() and not t.daemon and t is not threading.main_thread()
    ]
    if not lingering:
        return code
    say(f"dtq: {len(lingering)} handler thread(s) still running; exiting without waiting")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
