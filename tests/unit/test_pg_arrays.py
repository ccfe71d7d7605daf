"""Typed array parameters (``dtq.adapters.cockroach.arrays``) dump exactly as psycopg's own
``ListBinaryDumper`` does for the same values, so the server reads the same arrays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.numeric import Int8

from dtq.adapters.cockroach.arrays import Int8Array, TextArray, TimestamptzArray, UuidArray

_NOW = datetime(2026, 12, 1, 19, 0, tzinfo=UTC)


def _dumped(value: list[Any]) -> tuple[int, bytes]:
    dumper = Transformer().get_dumper(value, PyFormat.BINARY)
    data = dumper.dump(value)
    assert data is not None
    return dumper.oid, bytes(data)


@pytest.mark.parametrize(
    ("typed", "plain"),
    [
        (Int8Array([0, 1, -5, 2**40]), [Int8(0), Int8(1), Int8(-5), Int8(2**40)]),
        (Int8Array([3, None]), [Int8(3), None]),
        (UuidArray([UUID(int=1), UUID(int=2**128 - 1)]), [UUID(int=1), UUID(int=2**128 - 1)]),
        (UuidArray([None, UUID(int=7)]), [None, UUID(int=7)]),
        (UuidArray([UUID(int=7), UUID(int=8), None]), [UUID(int=7), UUID(int=8), None]),
        (TextArray(["completed", "", "é\u20ac"]), ["completed", "", "é\u20ac"]),
        (TextArray(["a", None]), ["a", None]),
        (
            TimestamptzArray([_NOW, _NOW + timedelta(microseconds=1)]),
            [_NOW, _NOW + timedelta(microseconds=1)],
        ),
        (TimestamptzArray([None, _NOW]), [None, _NOW]),
        # one object repeated (its bytes are reused), then an equal but distinct one
        (
            TimestamptzArray([_NOW, _NOW, None, _NOW, _NOW + timedelta(0), _NOW]),
            [_NOW, _NOW, None, _NOW, _NOW + timedelta(0), _NOW],
        ),
        (TextArray(["x", "x", "y", "x"]), ["x", "x", "y", "x"]),
    ],
)
def test_a_typed_array_dumps_as_psycopg_dumps_the_list(typed: list[Any], plain: list[Any]) -> None:
    assert _dumped(typed) == _dumped(plain)


@pytest.mark.parametrize(
    ("typed", "oid"),
    [(Int8Array(), 1016), (UuidArray(), 2951), (TextArray(), 1009), (TimestamptzArray(), 1185)],
)
def test_an_empty_typed_array_keeps_its_type(typed: list[Any], oid: int) -> None:
    got_oid, data = _dumped(typed)
    assert got_oid == oid
    # an empty array: no dimension, no null, the element type's OID
    assert data[:8] == b"\x00\x00\x00\x00\x00\x00\x00\x00"


def test_an_all_null_array_keeps_its_element_type() -> None:
    """psycopg cannot tell the type of ``[None, None]`` (it falls back to text); the typed
    array still says uuid."""
    oid, data = _dumped(UuidArray([None, None]))
    assert oid == 2951
    assert data == (
        b"\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x0b\x86\x00\x00\x00\x02\x00\x00\x00\x01"
        + b"\xff\xff\xff\xff" * 2
    )


def test_small_ints_travel_as_int8() -> None:
    assert _dumped(Int8Array([1, 2]))[0] == 1016
    assert _dumped(Int8Array([uuid4().int % 100]))[0] == 1016
