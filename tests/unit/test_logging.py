"""Logging: JSON lines or console, ISO UTC timestamps, standard-library records routed through."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from dtq.entrypoints.logging import configure_logging, use_json


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.reset_defaults()


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_event_level_logger_and_utc_timestamp() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)

    structlog.get_logger("dtq.test").info("task claimed", task_id="t1", attempt=2)

    [record] = records(out)
    assert record["event"] == "task claimed"
    assert record["level"] == "info"
    assert record["logger"] == "dtq.test"
    assert record["task_id"] == "t1"
    assert record["attempt"] == 2
    assert str(record["timestamp"]).endswith("Z")


def test_standard_library_records_are_routed_through_the_same_renderer() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)

    logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)

    [record] = records(out)
    assert record["event"] == "Started server process [42]"
    assert record["logger"] == "uvicorn.error"
    assert record["level"] == "info"


def test_records_below_the_level_are_dropped() -> None:
    out = io.StringIO()
    configure_logging("json", "warning", stream=out)

    structlog.get_logger("dtq.test").info("quiet")
    logging.getLogger("uvicorn.access").info("quiet too")
    structlog.get_logger("dtq.test").warning("loud")

    assert [r["event"] for r in records(out)] == ["loud"]


def test_exceptions_are_rendered_inside_the_json_line() -> None:
    out = io.StringIO()
    configure_logging("json", "info", stream=out)

    try:
        raise ValueError("bad")
    except ValueError:
        structlog.get_logger("dtq.test").exception("pass failed")

    [record] = records(out)
    assert "ValueError: bad" in str(record["exception"])


def test_console_format_is_not_json() -> None:
    out = io.StringIO()
    configure_logging("console", "debug", stream=out)

    structlog.get_logger("dtq.test").debug("hello", n=1)

    text = out.getvalue()
    assert "hello" in text
    assert "n=1" in text
    assert not text.lstrip().startswith("{")


def test_console_lines_show_a_nul_as_its_escape() -> None:
    """A handler's error may hold NUL: a raw one makes grep treat the log as binary."""
    out = io.StringIO()
    configure_logging("console", "info", stream=out)

    try:
        raise RuntimeError("nul \x00 here")
    except RuntimeError as exc:
        structlog.get_logger("dtq.test").warning("task failed", error=str(exc), exc_info=exc)

    text = out.getvalue()
    assert "\x00" not in text
    assert "nul \\x00 here" in text


def test_auto_means_json_unless_the_stream_is_a_terminal() -> None:
    assert use_json("auto", io.StringIO()) is True
    assert use_json("auto", FakeTTY()) is False
    assert use_json("json", FakeTTY()) is True
    assert use_json("console", io.StringIO()) is False


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("json", "loud", stream=io.StringIO())


def test_console_format_prints_a_plain_traceback() -> None:
    """structlog's default console formatter is rich's when rich is installed (it is, for the
    CLI): 32 ms of the event loop for a two-frame traceback here, ~180 ms for a handler's in
    the worker, so a worker whose handler raised on every task started one task about every
    180 ms whatever its concurrency."""
    out = FakeTTY()
    configure_logging("console", "info", stream=out)

    def handler() -> None:
        raise ValueError("bad payload")

    try:
        handler()
    except ValueError as exc:
        structlog.get_logger("dtq.test").warning("task failed", exc_info=exc)

    text = out.getvalue()
    assert "Traceback (most recent call last):" in text
    assert "ValueError: bad payload" in text
    assert "in handler" in text
    assert "╭" not in text and "│" not in text  # no rich panel


@pytest.mark.parametrize("name", ["httpx", "httpcore"])
def test_an_http_clients_per_request_lines_show_only_at_debug(name: str) -> None:
    # a worker over HTTP polls, renews and reports through httpx: one INFO line per request
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    logging.getLogger(name).info('HTTP Request: POST http://o/v1/worker/claim "204"')
    logging.getLogger(name).warning("connection pool is full")
    assert [r["event"] for r in records(out)] == ["connection pool is full"]

    out = io.StringIO()
    configure_logging("json", "debug", stream=out)
    logging.getLogger(name).info('HTTP Request: POST http://o/v1/worker/claim "204"')
    assert [r["event"] for r in records(out)] == [
        'HTTP Request: POST http://o/v1/worker/claim "204"'
    ]
