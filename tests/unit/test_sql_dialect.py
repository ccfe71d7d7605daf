"""Every SQL text the store sends keeps to the dialect CockroachDB and PostgreSQL share
(CRDB.md, "Making PostgreSQL catch CockroachDB bugs here": a lint over the SQL)."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta, timezone
from types import ModuleType
from uuid import UUID

import pytest
from psycopg.adapt import Transformer
from psycopg.types.numeric import Int8

from dtq.adapters.cockroach import sessions, sql, txconn
from dtq.adapters.cockroach.arrays import Int8Array, TextArray, TimestamptzArray, UuidArray
from dtq.domain.status import TaskStatus

#: Constructs that are absent from, or mean something else on, one of the two databases.
FORBIDDEN = re.compile(
    r"\b(STRING|SERIAL|BIGSERIAL|nextval|LISTEN|NOTIFY|pg_advisory\w*|DEFERRABLE|UPSERT|"
    r"CONCURRENTLY|INT|INTEGER|JSON|TIMESTAMP)\b",
    re.IGNORECASE,
)
#: The start of a data-modifying common table expression.
MODIFYING_CTE = re.compile(r"\bAS\s*\(\s*(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
_STATEMENT = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|BEGIN)\b", re.IGNORECASE)


def statements(module: ModuleType) -> dict[str, str]:
    """The module's SQL constants (upper-case names whose text starts like a statement)."""
    return {
        name: value
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and _STATEMENT.match(value)
    }


MODULES = [sql, sessions]  # events, retention and webhooks send the texts of sql.py


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_no_statement_uses_a_construct_that_differs_on_cockroachdb(module: ModuleType) -> None:
    found = {name: FORBIDDEN.findall(text) for name, text in statements(module).items()}
    assert statements(module), "no statement found: the lint would check nothing"
    assert {name: hits for name, hits in found.items() if hits} == {}


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_no_statement_modifies_data_in_a_common_table_expression(module: ModuleType) -> None:
    """The guard wrapper of ``TryConnection.send_guarded`` is the only data-modifying CTE, and
    it wraps one single-row ``UPDATE`` at the top level (CRDB.md)."""
    modifying = [name for name, text in statements(module).items() if MODIFYING_CTE.search(text)]
    assert modifying == []


@pytest.mark.parametrize("update", [sql.UPDATE_TASK, sql.UPDATE_JOB, sql.UPDATE_RUN])
def test_the_guard_wraps_one_update_and_casts_its_division(update: str) -> None:
    wrapped = txconn.guarded(update)
    assert len(MODIFYING_CTE.findall(wrapped)) == 1
    assert wrapped.count("UPDATE ") == 1
    assert "CAST(1 / count(*) AS BIGINT)" in wrapped
    assert not FORBIDDEN.findall(wrapped)


def test_a_prepared_statement_numbers_every_placeholder_in_order() -> None:
    """``PREPARE`` takes the server's ``$n``: psycopg's ``%s``, ``%b`` and ``%t`` are numbered
    left to right and a literal ``%%`` becomes ``%`` (``txconn.numbered``)."""
    text = "SELECT a FROM t WHERE b = %s AND c = ANY(%b::uuid[]) AND d LIKE 'x%%' AND e = %t"
    assert txconn.numbered(text) == (
        "SELECT a FROM t WHERE b = $1 AND c = ANY($2::uuid[]) AND d LIKE 'x%' AND e = $3"
    )


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_statement_numbers_as_many_parameters_as_it_takes(module: ModuleType) -> None:
    for name, text in statements(module).items():
        taken = len(re.findall(r"%[sbt]", text))
        numbered = txconn.numbered(text)
        assert "%s" not in numbered and "%b" not in numbered, name
        assert re.findall(r"\$(\d+)", numbered) == [str(i) for i in range(1, taken + 1)], name


_LITERAL_CASES = [
    None,
    True,
    False,
    0,
    3,
    2**31,
    2**63,
    -3,
    Int8(7),
    Int8(-7),
    "pending",
    "",
    "it's",
    "back\\slash",
    "naïve ✓",
    UUID("6c0c4964-6b7b-4088-a7da-3195d840d734"),
    datetime(2026, 12, 2, 10, 22, 23, 98930, tzinfo=UTC),
    datetime(2026, 12, 2, 10, 22, 23, tzinfo=UTC),
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(2026, 1, 1, 1, 2, 3, 4, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(2026, 1, 1),  # naive: psycopg's timestamp dumper, not ours
    TaskStatus.QUEUED,  # a str subclass: psycopg's dumper
    1.5,
    [UUID("6c0c4964-6b7b-4088-a7da-3195d840d734")],
    UuidArray([UUID("6c0c4964-6b7b-4088-a7da-3195d840d734"), None]),
    UuidArray([]),
    UuidArray([None]),
    Int8Array([0, -1, None, 2**63 - 1]),
    Int8Array([Int8(7)]),
    Int8Array([True]),  # a bool: psycopg's dumper
    TimestamptzArray([datetime(2026, 12, 2, 10, 22, 23, 98930, tzinfo=UTC), None]),
    TimestamptzArray([datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-3, minutes=-30)))]),
    TimestamptzArray([None, None]),
    TimestamptzArray([datetime(2026, 1, 1)]),  # naive: psycopg's dumper
    TextArray(["pending", None, "", "NULL", "null", "it's", "a b", "{x}", 'q"t', "b\\s"]),
    TextArray(['{"k": [1, 2]}', "tab\tnew\nline", "\u2000lead", "naïve ✓", "\u3000"]),
    TextArray([]),
    TextArray(["x" * 70 + " a \"{,}\\ '", "y" * 65]),  # past the cached length
    TextArray([TaskStatus.QUEUED]),  # a str subclass: psycopg's dumper
]


@pytest.mark.parametrize("value", _LITERAL_CASES, ids=repr)
def test_a_fast_literal_is_the_text_psycopgs_dumper_writes(value: object) -> None:
    expected = Transformer().as_literal(value).decode()
    fast = txconn.fast_literal(value)
    assert fast in (None, expected)


_ARRAY_ALPHABET = (
    "ab ,{}\"\\'\t\n\r\x0b\x0cN ULnul\u1680\u2000\u200a\u2028\u202f\u205f\u3000é\u00a0"
)


def test_a_text_array_literal_is_the_text_psycopg_writes_for_any_strings() -> None:
    """Random strings over the characters that array syntax and SQL quoting treat specially."""
    rng = random.Random(17)
    for _ in range(2000):
        value = TextArray(
            "".join(rng.choice(_ARRAY_ALPHABET) for _ in range(rng.randrange(6)))
            for _ in range(rng.randrange(1, 5))
        )
        assert txconn.fast_literal(value) == Transformer().as_literal(value).decode(), value


def test_the_common_types_of_a_state_change_take_the_fast_path() -> None:
    common = [
        None,
        True,
        3,
        Int8(3),
        "running",
        UUID(int=1),
        datetime(2026, 1, 1, tzinfo=UTC),
        UuidArray([UUID(int=1)]),
        TextArray(["a", None]),
        Int8Array([1]),
        TimestamptzArray([datetime(2026, 1, 1, tzinfo=UTC)]),
    ]
    assert [txconn.fast_literal(v) is not None for v in common] == [True] * len(common)
