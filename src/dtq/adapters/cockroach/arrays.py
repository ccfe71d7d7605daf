"""Typed one-dimensional array parameters: ``Int8Array``, ``UuidArray``, ``TextArray``,
``TimestamptzArray``.

A batch statement sends one array per column (``%b::bigint[]`` ...). Handed a plain ``list``,
psycopg finds its element type on every execution (a scan of the whole list, twice: ``get_key``
and ``upgrade``), picks the smallest integer type for ints unless each element is wrapped in
``Int8``, and dumps element by element through Python. These ``list`` subclasses name their
element type instead: their dumpers (registered on ``psycopg.adapters`` when this module is
imported) have a fixed OID and write the binary array in one pass, the fixed-size elements
(``bigint``, ``uuid``) with ``struct`` and no per-element dumper call. The bytes are exactly
what psycopg's own ``ListBinaryDumper`` writes for the same values (the unit tests compare
them), so PostgreSQL and CockroachDB read the same arrays as before.

Elements may be None (SQL NULL); an empty list is an empty array. Values must be of the named
type (``int``, ``UUID``, ``str``, an aware ``datetime``): nothing is converted or checked.
Without the registration (a connection with its own adapters map) they still dump, as plain
lists.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import datetime
from itertools import repeat
from typing import Any, ClassVar
from uuid import UUID

import psycopg
from psycopg import pq
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Dumper

__all__ = ["Int8Array", "TextArray", "TimestamptzArray", "UuidArray"]


class Int8Array(list[int | None]):
    """A ``bigint[]`` parameter."""

    __slots__ = ()


class UuidArray(list[UUID | None]):
    """A ``uuid[]`` parameter."""

    __slots__ = ()


class TextArray(list[str | None]):
    """A ``text[]`` parameter."""

    __slots__ = ()


class TimestamptzArray(list[datetime | None]):
    """A ``timestamptz[]`` parameter (aware datetimes)."""

    __slots__ = ()


_types = psycopg.adapters.types
# binary array header of a 1-D array: ndim, has-null flag, element OID, length, lower bound
_head = struct.Struct("!iiIii").pack
_empty_head = struct.Struct("!iiI").pack
_pack_len = struct.Struct("!i").pack
_NULL = b"\xff\xff\xff\xff"
_int8_item = struct.Struct("!iq").pack
_UUID_LEN = _pack_len(16)


class _ArrayDumper(Dumper):
    """Binary dumper of a 1-D array of ``element`` (a type name of ``psycopg.adapters``)."""

    format = pq.Format.BINARY
    element: ClassVar[str]

    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        info = _types[self.element]
        self.oid = info.array_oid
        self._element_oid = info.oid
        self._context = context
        self._element_dumper: Callable[[Any], Buffer | None] | None = None

    def _element(self) -> Callable[[Any], Buffer | None]:
        """psycopg's dumper of one element, made on first use: a dumper lives as long as one
        statement's parameters, and the fixed-size arrays need it only for a column with a
        NULL."""
        if self._element_dumper is None:
            context = self._context
            adapters = context.adapters if context is not None else psycopg.adapters
            dumper_class = adapters.get_dumper_by_oid(self._element_oid, self.format)
            self._element_dumper = dumper_class(type(None), context).dump
        return self._element_dumper

    def dump(self, obj: Any) -> Buffer | None:
        if not obj:
            return _empty_head(0, 0, self._element_oid)
        has_null = None in obj
        return _head(1, has_null, self._element_oid, len(obj), 1) + (
            self._items_with_nulls(obj) if has_null else self._items(obj)
        )

    def _items(self, obj: list[Any]) -> bytes:
        """The elements of ``obj`` (no None among them), each with its length."""
        return self._items_with_nulls(obj)

    def _items_with_nulls(self, obj: list[Any]) -> bytes:
        # A batch column often repeats one object (the transaction time, a status): an element
        # that is the previous one reuses its bytes.
        dump = self._element()
        parts: list[bytes] = []
        last: object = None
        encoded = b""
        for item in obj:
            if item is None:
                parts.append(_NULL)
            elif item is last:
                parts.append(encoded)
            else:
                data = dump(item)
                assert data is not None
                last, encoded = item, _pack_len(len(data)) + data
                parts.append(encoded)
        return b"".join(parts)


class _Int8ArrayDumper(_ArrayDumper):
    element = "int8"

    def _items(self, obj: list[Any]) -> bytes:
        return b"".join(map(_int8_item, repeat(8), obj))


class _UuidArrayDumper(_ArrayDumper):
    element = "uuid"

    def dump(self, obj: Any) -> Buffer | None:
        # Each element's 16 bytes from its int (a slot) rather than its ``bytes`` property, and
        # no ``None in obj`` scan first (UUID.__eq__ is Python code): a None fails the join
        # with AttributeError and the array is dumped again by the general path.
        if not obj:
            return _empty_head(0, 0, self._element_oid)
        try:
            items = b"".join([_UUID_LEN + item.int.to_bytes(16, "big") for item in obj])
        except AttributeError:
            return super().dump(obj)
        return _head(1, 0, self._element_oid, len(obj), 1) + items


class _TextArrayDumper(_ArrayDumper):
    element = "text"


class _TimestamptzArrayDumper(_ArrayDumper):
    element = "timestamptz"


psycopg.adapters.register_dumper(Int8Array, _Int8ArrayDumper)
psycopg.adapters.register_dumper(UuidArray, _UuidArrayDumper)
psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)
psycopg.adapters.register_dumper(TimestamptzArray, _TimestamptzArrayDumper)
