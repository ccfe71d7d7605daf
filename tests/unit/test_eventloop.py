"""The event loop the dtq processes run on (``dtq.entrypoints.eventloop``)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from dtq.entrypoints import eventloop
from dtq.entrypoints.config import ConfigError


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_is_the_default_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv(eventloop.EVENT_LOOP_ENV, raising=False)
    assert eventloop.loop_name() == "uvloop"
    assert eventloop.run(_loop_module()).startswith("uvloop")


def test_asyncio_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.EVENT_LOOP_ENV, "AsyncIO")
    assert eventloop.loop_name() == "asyncio"
    assert eventloop.run(_loop_module()).startswith("asyncio")


def test_run_returns_the_coroutine_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.EVENT_LOOP_ENV, raising=False)

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert eventloop.run(answer()) == 42


def test_unknown_loop_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(eventloop.EVENT_LOOP_ENV, "trio")
    coro = _loop_module()
    with pytest.raises(ConfigError) as raised:
        eventloop.run(coro)
    assert raised.value.variable == "DTQ_EVENT_LOOP"
    assert "trio" in raised.value.message
    assert coro.cr_frame is None  # type: ignore[attr-defined]  # closed, not left to warn "never awaited"


def test_running_loop_name_names_the_loop_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.EVENT_LOOP_ENV, "asyncio")

    async def name() -> str:
        return eventloop.running_loop_name()

    assert eventloop.run(name()) == "asyncio"
    if importlib.util.find_spec("uvloop") is not None:
        monkeypatch.setenv(eventloop.EVENT_LOOP_ENV, "uvloop")
        assert eventloop.run(name()) == "uvloop"
