"""The one-server connection packs commands with hiredis (``connection._InlineSend``): the bytes
are redis-py's own, and what redis-py refuses it still refuses."""

from __future__ import annotations

from typing import Any

import hiredis
import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from dtq.adapters.redis import connection as redis_connection

ARGS: list[tuple[Any, ...]] = [
    ("EVALSHA", "0" * 40, 2, "dtq:{q}:a", "dtq:{q}:b", 1.5, 0.1, 1e20, -3, "é", b"\x00\xff"),
    ("SCRIPT LOAD", "return 1"),
    (b"CONFIG GET", b"maxmemory"),
    ("SET", "k", memoryview(b"value")),
    ("SET", "k", bytearray(b"value")),
    ("PING",),
]


def _inline() -> Any:
    return redis_connection._InlineTcp()


@pytest.mark.parametrize("args", ARGS)
def test_a_command_packs_to_redis_pys_bytes(args: tuple[Any, ...]) -> None:
    assert b"".join(_inline().pack_command(*args)) == b"".join(Connection().pack_command(*args))


def test_hiredis_packs_the_common_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    packed: list[tuple[Any, ...]] = []
    real = hiredis.pack_command

    def counting(args: tuple[Any, ...]) -> bytes:
        packed.append(args)
        out: bytes = real(args)
        return out

    monkeypatch.setattr(hiredis, "pack_command", counting)
    _inline().pack_command("SCRIPT LOAD", "return 1")
    assert packed == [(b"SCRIPT", b"LOAD", "return 1")]


@pytest.mark.parametrize("value", [True, None, object()])
def test_a_value_redis_py_refuses_is_still_refused(value: Any) -> None:
    with pytest.raises(DataError):
        _inline().pack_command("SET", "k", value)
