"""Every SQL text the store sends keeps to the dialect CockroachDB and PostgreSQL share
(CRDB.md, "Making PostgreSQL catch CockroachDB bugs here": a lint over the SQL)."""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from dtq.adapters.cockroach import sessions, sql, txconn

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
