"""Logging: structlog for dtq's own events, with the standard library routed through it.

One call, :func:`configure_logging`, at process start (the CLI makes it). Every record, whether
it came from structlog or from a standard ``logging`` logger (uvicorn, litestar, psycopg), is
rendered by the same processor chain onto stderr: JSON lines in production, a coloured console
layout for a person at a terminal (DESIGN §5 Observability). Timestamps are ISO 8601 in UTC.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog
from structlog.typing import Processor

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

# Loggers that install their own handlers or would double-print: hand them to the root handler.
_ROUTED_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "litestar")
#: HTTP clients that log every request at INFO (a worker over HTTP, the webhook sender): shown
#: from WARNING up, and everything at ``LOG_LEVEL=debug``.
_PER_REQUEST_LOGGERS = ("httpx", "httpcore")


def use_json(fmt: str, stream: TextIO) -> bool:
    """Whether records are rendered as JSON lines.

    Args:
        fmt: ``json``, ``console`` or ``auto``.
        stream: the output stream; ``auto`` chooses JSON unless it is a terminal.

    Returns:
        True for JSON lines, False for the console layout.
    """
    if fmt == "json":
        return True
    if fmt == "console":
        return False
    return not _is_tty(stream)


def configure_logging(fmt: str, level: str, *, stream: TextIO | None = None) -> None:
    """Configure structlog and the standard library's root logger for this process.

    Safe to call more than once (the last call wins); it replaces the root logger's handlers.

    Args:
        fmt: ``auto`` (JSON unless the stream is a TTY), ``json`` or ``console``
            (``LOG_FORMAT``).
        level: ``debug``, ``info``, ``warning``, ``error`` or ``critical`` (``LOG_LEVEL``).
        stream: where records go; stderr when None.

    Raises:
        ValueError: ``level`` is not one of the names above.
    """
    try:
        numeric_level = _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}") from None
    out = sys.stderr if stream is None else stream
    as_json = use_json(fmt, out)

    # Applied to every record: structlog's own and the standard library's ("foreign") ones.
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Processor
    if as_json:
        renderer = structlog.processors.JSONRenderer()
        final: list[Processor] = [structlog.processors.format_exc_info, renderer]
    else:
        # plain_traceback, not structlog's default (rich's, as rich is installed for the CLI):
        # rich took 30-180 ms of the event loop per logged exception (0.4 ms plain), throttling
        # a worker whose handlers raise to a task every 180 ms
        renderer = structlog.dev.ConsoleRenderer(
            colors=_is_tty(out), exception_formatter=structlog.dev.plain_traceback
        )
        final = [renderer, _escape_nul]

    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        cache_logger_on_first_use=True,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    for name in _ROUTED_LOGGERS:
        routed = logging.getLogger(name)
        routed.handlers.clear()
        routed.propagate = True
        routed.setLevel(logging.NOTSET)
    for name in _PER_REQUEST_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.NOTSET if numeric_level <= logging.DEBUG else logging.WARNING
        )


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


def _escape_nul(logger: Any, method: str, rendered: Any) -> Any:
    """The console line with each NUL written ``\\x00`` (a handler's error may hold one; a raw
    NUL makes ``grep`` take the log for binary). JSON lines escape it themselves."""
    return rendered.replace("\x00", "\\x00") if isinstance(rendered, str) else rendered
