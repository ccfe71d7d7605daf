"""What the commands that talk to a running orchestrator share (issue 15 item 5): ``--url``,
``--token`` and ``--json``, the :class:`~dtq.client.Client` they build, their output (a table on
a terminal or JSON) and how an API error becomes one line and an exit status."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import wraps
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dtq.client import ApiError, Client, TransportError
from dtq.client.config import DEFAULT_URL, idempotency_key_problem, token_problem, url_problem
from dtq.entrypoints.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    UsageError,
    env_file_environ,
    fail,
)
from dtq.entrypoints.config_values import parse_duration

#: Exit status of ``--wait`` and ``dtq watch`` when the job failed or was cancelled.
EXIT_JOB_FAILED = 1
#: Exit status of ``--wait`` when the job did not finish in ``--timeout`` (as timeout(1)).
EXIT_WAIT_TIMEOUT = 124


def client_options(url_option: str = "--url") -> argparse.ArgumentParser:
    """A parent parser with ``--url`` (or ``url_option``, for a command whose ``--url`` means
    something else), ``--token`` and ``--json``."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        url_option,
        dest="url",
        metavar="URL",
        help="orchestrator base URL (default: DTQ_URL, else :8080)",
    )
    parent.add_argument("--token", metavar="TOKEN", help="API token (default: DTQ_TOKEN)")
    parent.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parent.set_defaults(url_option=url_option)
    return parent


def resolve_connection(args: argparse.Namespace) -> None:
    """Set ``args.url`` and ``args.token`` to what the client uses: the option, else
    ``DTQ_URL``/``DTQ_TOKEN`` from the environment over ``--env-file`` (an empty variable counts
    as unset, as every dtq variable), else :data:`~dtq.client.config.DEFAULT_URL` and no token.

    Raises:
        UsageError: ``--env-file`` is missing, a directory or has a line that cannot be parsed
            (:func:`~dtq.entrypoints.cli.common.env_file_environ`); an empty ``--url``, or a
            URL the client cannot connect to (not http(s), no host, a port outside 1..65535,
            not parseable), naming ``--url/DTQ_URL``; an empty
            ``--token``, or a token holding anything but printable ASCII without spaces, naming
            ``--token/DTQ_TOKEN`` (never showing the token).
    """
    environ = env_file_environ(args.env_file)
    subject = f"{args.url_option}/DTQ_URL"
    if args.url == "":
        raise UsageError(subject, "must not be empty")
    url = args.url or environ.get("DTQ_URL") or DEFAULT_URL
    problem = url_problem(url)
    if problem is not None:
        raise UsageError(subject, f"{problem}, got {url!r}")
    args.url = url.rstrip("/")
    if args.token == "":
        raise UsageError("--token/DTQ_TOKEN", "must not be empty")
    token = args.token or environ.get("DTQ_TOKEN") or None
    if token is not None and (problem := token_problem(token)) is not None:
        raise UsageError("--token/DTQ_TOKEN", problem)
    args.token = token


def open_client(args: argparse.Namespace) -> Client:
    """The client for ``args.url`` and ``args.token``, as :func:`api_command` resolved them."""
    return Client(args.url, token=args.token)


def api_command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command so its connection settings are resolved (:func:`resolve_connection`)
    before it runs, an API refusal is one line (``dtq: code: message (field f)``, a 401 with no
    token given also saying how to give one) with exit 2 for a 4xx and 1 for a 5xx, and an
    unreachable orchestrator one line naming its URL with exit 1."""

    @wraps(fn)
    def run(args: argparse.Namespace) -> int:
        resolve_connection(args)
        try:
            return fn(args)
        except ApiError as exc:
            hint = ""
            if exc.status == 401 and args.token is None:
                hint = " (no token was given: set DTQ_TOKEN or pass --token)"
            fail(f"{exc}{hint}")
            return EXIT_USAGE if exc.status < 500 else EXIT_FAILURE
        except TransportError as exc:
            fail(f"cannot reach the orchestrator at {args.url}: {exc}")
            return EXIT_FAILURE

    return run


def json_argument(text: str, *, option: str) -> Any:
    """``--payload``-style input: JSON text, or ``@path`` for a file holding UTF-8 JSON, read by
    :func:`json_text`.

    Raises:
        UsageError: the file cannot be read (or is not UTF-8) or the text is not such JSON
            (naming ``option``).
    """
    source = text
    if text.startswith("@"):
        source = _read_utf8(text[1:], subject=option, shown=f" {text[1:]!r}")
    return json_text(source, subject=option)


def json_file(path: str) -> Any:
    """The JSON held by a UTF-8 file, ``-`` for standard input, read by :func:`json_text`.

    Raises:
        UsageError: the file cannot be read (or is not UTF-8) or does not hold such JSON, naming
            the path as given (``stdin`` for ``-``).
    """
    if path == "-":
        try:
            source = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError("stdin", f"cannot read: not UTF-8 ({exc.reason})") from None
        return json_text(source, subject="stdin")
    return json_text(_read_utf8(path, subject=path, shown=""), subject=path)


def _read_utf8(path: str, *, subject: str, shown: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(subject, f"cannot read{shown}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(subject, f"cannot read{shown}: not UTF-8 ({exc.reason})") from None


def json_text(source: str, *, subject: str) -> Any:
    """Strict JSON only, refused as the API refuses it (so that what is sent is what was
    given): ``NaN``, ``Infinity`` and a number beyond a float's range (encoded they would become
    ``null``), a key repeated in one object (decoding would keep the last), a lone UTF-16
    surrogate escape (it cannot be encoded), nesting deeper than Python's recursion limit.

    Raises:
        UsageError: the text is not such JSON (naming ``subject``).
    """
    try:
        value = json.loads(
            source, parse_constant=_not_json, parse_float=_finite, object_pairs_hook=_unique_keys
        )
    except json.JSONDecodeError as exc:
        raise UsageError(subject, f"not JSON: {exc.msg} at line {exc.lineno}") from None
    except ValueError as exc:
        raise UsageError(subject, f"not JSON: {exc}") from None
    except RecursionError:
        raise UsageError(subject, "not JSON: nested too deeply") from None
    try:
        msgspec.json.encode(value)
    except UnicodeEncodeError:
        raise UsageError(
            subject, "not JSON: a lone UTF-16 surrogate escape (a surrogate must be half of a pair)"
        ) from None
    except (OverflowError, RecursionError) as exc:
        raise UsageError(subject, f"not JSON the API takes: {exc}") from None
    return value


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"{text} is beyond a JSON number's range")
    return number


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {json.dumps(key)} repeated in one object")
            seen.add(key)
    return document


def idempotency_key(text: str | None) -> str | None:
    """``--idempotency-key``, checked as the client checks the ``Idempotency-Key`` header it
    is sent as (:func:`dtq.client.config.idempotency_key_problem`: the API's bounds, no space
    at either end), so that a key that cannot be sent as given sends nothing.

    Raises:
        UsageError: empty, longer than ``IDEMPOTENCY_KEY_MAX`` characters, holding a character
            outside printable ASCII, or a space at either end.
    """
    if text is not None and (problem := idempotency_key_problem(text)) is not None:
        raise UsageError("--idempotency-key", problem)
    return text


def console() -> Console:
    """A console on stdout (colours only on a terminal; wide enough for ids when piped)."""
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)


def emit_json(value: Any) -> None:
    """Print ``value`` (msgspec Structs included) as indented JSON on stdout."""
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")
    sys.stdout.flush()


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A rich table of ``rows``: cells as plain text, never read as rich markup (an error
    text's ``[...]`` is printed as it is); None as an empty cell, a dict or list as JSON. No
    header row when every column name is empty (a two-column list of fields and values)."""
    out = Table(
        title=title,
        title_justify="left",
        show_edge=False,
        pad_edge=False,
        show_header=any(columns),
    )
    for column in columns:
        out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*(Text(_cell(cell)) for cell in row))
    return out


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def short(text: str | None, limit: int = 80) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def positive_duration(text: str, *, option: str) -> float:
    """A Go duration option (``1s``, ``500ms``) in seconds, more than zero.

    Raises:
        ConfigError: not a Go duration (reported as one line naming ``option``).
        UsageError: zero.
    """
    seconds = parse_duration(text, variable=option)
    if seconds <= 0:
        raise UsageError(option, f"must be more than 0, got {text!r}")
    return seconds
