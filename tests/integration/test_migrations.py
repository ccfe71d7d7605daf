"""Migrations: the files follow CRDB.md, and applying them gives exactly the reference schema."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlparse
from yoyo.connections import parse_uri

from dtq.adapters.cockroach import open_pool
from dtq.adapters.cockroach.migrate import (
    apply_migrations,
    default_migrations_dir,
    pending_migrations,
    unapplied_migrations,
    yoyo_url,
)
from dtq.entrypoints.config import ConfigError, Settings
from dtq.entrypoints.container import open_services

OUR_TABLES = (
    "jobs",
    "tasks",
    "task_dependencies",
    "task_runs",
    "workers",
    "api_tokens",
    "idempotency_tombstones",
    "events",
    "webhooks",
    "dashboard_sessions",
    "dashboard_keys",
)
YOYO_TABLES = ("_yoyo_log", "_yoyo_migration", "_yoyo_version", "yoyo_lock")

# --- the reference schema (spec §4 + the columns the domain needs) ---------------------------

TS = "timestamp with time zone"
REFERENCE_COLUMNS: dict[str, list[tuple[str, str, bool]]] = {  # (name, type, nullable)
    "jobs": [
        ("id", "uuid", False),
        ("name", "text", False),
        ("status", "text", False),
        ("metadata", "jsonb", True),
        ("idempotency_key", "text", True),
        ("request_hash", "text", True),
        ("version", "bigint", False),
        ("created_at", TS, False),
        ("updated_at", TS, False),
        ("trace_context", "text", True),
        ("has_dependencies", "boolean", True),
        ("task_count", "bigint", True),
    ],
    "tasks": [
        ("id", "uuid", False),
        ("job_id", "uuid", False),
        ("name", "text", False),
        ("kind", "text", False),
        ("status", "text", False),
        ("payload", "jsonb", True),
        ("priority", "text", False),
        ("max_attempts", "bigint", False),
        ("attempt", "bigint", False),
        ("reclaims", "bigint", False),
        ("current_run_id", "uuid", True),
        ("scheduled_at", TS, False),
        ("started_at", TS, True),
        ("finished_at", TS, True),
        ("last_error", "text", True),
        ("version", "bigint", False),
        ("created_at", TS, False),
        ("updated_at", TS, False),
        ("result", "jsonb", True),
        ("job_position", "bigint", False),
        ("progress", "jsonb", True),
        ("retry_policy", "jsonb", True),
        ("timeout_ms", "bigint", True),
    ],
    "task_dependencies": [
        ("task_id", "uuid", False),
        ("depends_on_task_id", "uuid", False),
    ],
    "task_runs": [
        ("id", "uuid", False),
        ("task_id", "uuid", False),
        ("attempt_number", "bigint", False),
        ("worker_id", "text", False),
        ("status", "text", False),
        ("error", "text", True),
        ("started_at", TS, False),
        ("finished_at", TS, True),
    ],
    "workers": [
        ("id", "text", False),
        ("hostname", "text", True),
        ("last_heartbeat_at", TS, False),
        ("metadata", "jsonb", True),
        ("redis_key_prefix", "text", True),
    ],
    "api_tokens": [
        ("id", "uuid", False),
        ("name", "text", False),
        ("secret_hash", "text", False),
        ("scopes", "ARRAY", False),
        ("created_at", TS, False),
        ("expires_at", TS, True),
        ("revoked_at", TS, True),
    ],
    "idempotency_tombstones": [
        ("idempotency_key", "text", False),
        ("request_hash", "text", True),
        ("job_id", "uuid", False),
        ("task_ids", "jsonb", False),
        ("pruned_at", TS, False),
    ],
    "events": [
        ("created_at", TS, False),
        ("id", "uuid", False),
        ("job_id", "uuid", False),
        ("task_id", "uuid", True),
        ("type", "text", False),
        ("data", "jsonb", False),
    ],
    "webhooks": [
        ("id", "uuid", False),
        ("url", "text", False),
        ("events", "ARRAY", False),
        ("secret", "text", False),
        ("created_at", TS, False),
        ("cursor_at", TS, False),
        ("cursor_id", "uuid", False),
        ("attempts", "bigint", False),
        ("next_attempt_at", TS, True),
        ("last_status", "bigint", True),
        ("last_error", "text", True),
        ("last_attempt_at", TS, True),
        ("delivered", "bigint", False),
    ],
    "dashboard_sessions": [
        ("id_hash", "text", False),
        ("token_id", "uuid", False),
        ("csrf", "text", False),
        ("created_at", TS, False),
        ("expires_at", TS, False),
    ],
    "dashboard_keys": [
        ("name", "text", False),
        ("secret", "text", False),
        ("created_at", TS, False),
    ],
}

REFERENCE_INDEXES: dict[str, tuple[str, str, bool]] = {  # name -> (table, columns, unique)
    "jobs_pkey": ("jobs", "id", True),
    "jobs_idempotency_key_key": ("jobs", "idempotency_key", True),
    "tasks_pkey": ("tasks", "id", True),
    "idx_tasks_job_id": ("tasks", "job_id, status", False),
    "idx_tasks_queued_scheduled": ("tasks", "scheduled_at, id WHERE status = 'queued'", False),
    "idx_tasks_running_id_started": ("tasks", "id, started_at WHERE status = 'running'", False),
    "idx_tasks_job_position": ("tasks", "job_id, job_position, id", False),
    "idx_tasks_status_created": ("tasks", "status, created_at, job_position, id", False),
    "idx_tasks_kind_created": ("tasks", "kind, created_at, job_position, id", False),
    "idx_jobs_status_created": ("jobs", "status, created_at, id", False),
    "idx_jobs_name_created": ("jobs", "name, created_at, id", False),
    "task_dependencies_pkey": ("task_dependencies", "task_id, depends_on_task_id", True),
    "idx_task_dependencies_depends": ("task_dependencies", "depends_on_task_id", False),
    "task_runs_pkey": ("task_runs", "id", True),
    "idx_task_runs_task_id": ("task_runs", "task_id, started_at DESC", False),
    "workers_pkey": ("workers", "id", True),
    "idx_workers_last_heartbeat": ("workers", "last_heartbeat_at", False),
    "api_tokens_pkey": ("api_tokens", "id", True),
    "api_tokens_name_key": ("api_tokens", "name", True),
    "api_tokens_secret_hash_key": ("api_tokens", "secret_hash", True),
    "idx_jobs_status_updated_id": ("jobs", "status, updated_at, id", False),
    "idempotency_tombstones_pkey": ("idempotency_tombstones", "idempotency_key", True),
    "idx_idempotency_tombstones_pruned": (
        "idempotency_tombstones",
        "pruned_at, idempotency_key",
        False,
    ),
    "events_pkey": ("events", "created_at, id", True),
    "idx_events_job_created": ("events", "job_id, created_at, id", False),
    "webhooks_pkey": ("webhooks", "id", True),
    "dashboard_sessions_pkey": ("dashboard_sessions", "id_hash", True),
    "idx_dashboard_sessions_expires": ("dashboard_sessions", "expires_at, id_hash", False),
    "dashboard_keys_pkey": ("dashboard_keys", "name", True),
}

REFERENCE_CONSTRAINTS: dict[str, tuple[str, str]] = {  # name -> (table, type)
    "jobs_pkey": ("jobs", "PRIMARY KEY"),
    "jobs_idempotency_key_key": ("jobs", "UNIQUE"),
    "jobs_status_check": ("jobs", "CHECK"),
    "tasks_pkey": ("tasks", "PRIMARY KEY"),
    "tasks_job_id_fkey": ("tasks", "FOREIGN KEY"),
    "tasks_status_check": ("tasks", "CHECK"),
    "task_dependencies_pkey": ("task_dependencies", "PRIMARY KEY"),
    "task_dependencies_task_id_fkey": ("task_dependencies", "FOREIGN KEY"),
    "task_dependencies_depends_on_task_id_fkey": ("task_dependencies", "FOREIGN KEY"),
    "no_self_dependency": ("task_dependencies", "CHECK"),
    "task_runs_pkey": ("task_runs", "PRIMARY KEY"),
    "task_runs_task_id_fkey": ("task_runs", "FOREIGN KEY"),
    "task_runs_status_check": ("task_runs", "CHECK"),
    "workers_pkey": ("workers", "PRIMARY KEY"),
    "api_tokens_pkey": ("api_tokens", "PRIMARY KEY"),
    "api_tokens_name_key": ("api_tokens", "UNIQUE"),
    "api_tokens_secret_hash_key": ("api_tokens", "UNIQUE"),
    "idempotency_tombstones_pkey": ("idempotency_tombstones", "PRIMARY KEY"),
    "events_pkey": ("events", "PRIMARY KEY"),
    "webhooks_pkey": ("webhooks", "PRIMARY KEY"),
    "dashboard_sessions_pkey": ("dashboard_sessions", "PRIMARY KEY"),
    "dashboard_keys_pkey": ("dashboard_keys", "PRIMARY KEY"),
}

FORBIDDEN = re.compile(
    r"\b(STRING|SERIAL|BIGSERIAL|nextval|LISTEN|NOTIFY|pg_advisory\w*|DEFERRABLE|UPSERT|"
    r"CONCURRENTLY|INT|INTEGER|JSON|TIMESTAMP)\b",
    re.IGNORECASE,
)


# --- helpers ----------------------------------------------------------------------------------


def _columns_of(indexdef: str) -> str:
    """``CREATE INDEX ... USING btree (a ASC, b DESC)`` -> ``a, b DESC`` (PG and CRDB forms);
    a partial index's predicate follows as ``a, b WHERE status = 'queued'``."""
    indexdef, _, predicate = indexdef.partition(" WHERE ")
    inner = indexdef[indexdef.index("(", indexdef.index(" USING ")) + 1 : indexdef.rindex(")")]
    columns = re.sub(r"\s+ASC\b", "", inner).strip()
    if not predicate:
        return columns
    predicate = re.sub(r"::(text|string)\b|^\(|\)$", "", predicate.strip())
    return f"{columns} WHERE {predicate}"


def snapshot(dsn: str) -> dict[str, Any]:
    """Tables, columns, indexes and constraints of the public schema."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
            )
        }
        columns: dict[str, list[tuple[str, str, bool]]] = {t: [] for t in OUR_TABLES}
        for table, name, dtype, nullable in conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable"
            " FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name = ANY(%s::text[])"
            " ORDER BY table_name, ordinal_position",
            (list(OUR_TABLES),),
        ):
            columns[table].append((name, dtype, nullable == "YES"))
        indexes = {
            name: (table, _columns_of(indexdef), indexdef.startswith("CREATE UNIQUE"))
            for table, name, indexdef in conn.execute(
                "SELECT tablename, indexname, indexdef FROM pg_indexes"
                " WHERE schemaname = 'public' AND tablename = ANY(%s::text[])",
                (list(OUR_TABLES),),
            )
        }
        constraints = {
            name: (table, ctype)
            for table, name, ctype in conn.execute(
                "SELECT table_name, constraint_name, constraint_type"
                " FROM information_schema.table_constraints"
                " WHERE table_schema = 'public' AND table_name = ANY(%s::text[])"
                " AND constraint_name NOT LIKE '%%not_null'",
                (list(OUR_TABLES),),
            )
        }
    return {"tables": tables, "columns": columns, "indexes": indexes, "constraints": constraints}


def migration_files() -> list[Path]:
    return sorted(default_migrations_dir().glob("*.sql"))


# --- the files (no database needed) -----------------------------------------------------------


def test_migration_files_are_numbered_single_idempotent_ddl() -> None:
    files = migration_files()
    numbers = [int(f.name[:4]) for f in files]
    # Unique and increasing from 0001; gaps are allowed (each feature branch is assigned its own
    # range of numbers, e.g. 0031-0032 for API tokens, and may leave some unused).
    assert numbers[0] == 1 and numbers == sorted(set(numbers)), numbers
    for path in files:
        text = path.read_text(encoding="utf-8")
        statements = [s for s in sqlparse.split(text) if sqlparse.format(s, strip_comments=True)]
        assert len(statements) == 1, f"{path.name}: one DDL statement per migration"
        assert re.search(r"^-- transactional: false$", text, re.MULTILINE), path.name
        # A constraint is replaced idempotently by dropping it IF EXISTS in the same statement
        # (PostgreSQL has no ADD CONSTRAINT IF NOT EXISTS).
        replaces = re.search(r"DROP CONSTRAINT IF EXISTS (\w+),\s+ADD CONSTRAINT \1\b", text)
        assert re.search(r"\bIF (NOT )?EXISTS\b", text) or replaces, (
            f"{path.name}: must be idempotent"
        )


def test_migration_files_avoid_constructs_that_differ_on_cockroachdb() -> None:
    for path in migration_files():
        code = sqlparse.format(path.read_text(encoding="utf-8"), strip_comments=True)
        found = FORBIDDEN.findall(code)
        assert not found, f"{path.name} uses {found} (CRDB.md)"


def test_yoyo_url_carries_every_parameter() -> None:
    url = yoyo_url("postgresql://u:p%40ss@h1:26257,h2:26258/db%201?sslmode=require")
    parsed = parse_uri(url)
    assert parsed.scheme == "postgresql+psycopg"
    assert parsed.args == {
        "dbname": "db 1",
        "user": "u",
        "password": "p@ss",
        "host": "h1,h2",
        "port": "26257,26258",
        "sslmode": "require",
    }
    keywords = parse_uri(yoyo_url("host=127.0.0.1 port=5432 dbname=x user=postgres"))
    assert keywords.args == {"dbname": "x", "host": "127.0.0.1", "port": "5432", "user": "postgres"}


# --- against a database -----------------------------------------------------------------------


@pytest.mark.integration
def test_migrations_give_exactly_the_reference_schema(pg_empty_dsn: str) -> None:
    ids = [p.stem for p in migration_files()]
    assert pending_migrations(pg_empty_dsn) == ids

    assert apply_migrations(pg_empty_dsn) == ids

    schema = snapshot(pg_empty_dsn)
    assert schema["tables"] == set(OUR_TABLES) | set(YOYO_TABLES)
    assert schema["columns"] == REFERENCE_COLUMNS
    assert schema["indexes"] == REFERENCE_INDEXES
    assert schema["constraints"] == REFERENCE_CONSTRAINTS
    assert pending_migrations(pg_empty_dsn) == []


@pytest.mark.integration
def test_applying_migrations_twice_is_a_no_op(pg_empty_dsn: str) -> None:
    apply_migrations(pg_empty_dsn)
    before = snapshot(pg_empty_dsn)

    assert apply_migrations(pg_empty_dsn) == []

    assert snapshot(pg_empty_dsn) == before


@pytest.mark.integration
def test_statements_are_idempotent_even_when_yoyo_forgot_them(pg_empty_dsn: str) -> None:
    """A crash between a DDL and yoyo's bookkeeping re-runs the DDL: IF NOT EXISTS absorbs it."""
    apply_migrations(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM _yoyo_migration")

    assert len(apply_migrations(pg_empty_dsn)) == len(migration_files())


@pytest.mark.integration
@pytest.mark.parametrize(
    ("statement", "error"),
    [
        (
            "INSERT INTO jobs (id, name, status) VALUES (gen_random_uuid(), 'j', 'bogus')",
            psycopg.errors.CheckViolation,
        ),
        (
            "INSERT INTO task_runs (task_id, attempt_number, worker_id, status)"
            " VALUES (gen_random_uuid(), 1, 'w', 'running')",
            psycopg.errors.ForeignKeyViolation,
        ),
    ],
)
def test_constraints_refuse_bad_rows(
    pg_empty_dsn: str, statement: str, error: type[Exception]
) -> None:
    apply_migrations(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn, pytest.raises(error):
        conn.execute(statement)


@pytest.mark.integration
def test_task_runs_accept_cancelled_and_still_refuse_an_unknown_status(pg_empty_dsn: str) -> None:
    """Migration 0021 widened ``task_runs_status_check`` by ``cancelled`` (issue 14 item 1)."""
    apply_migrations(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        job = conn.execute(
            "INSERT INTO jobs (id, name, status) VALUES (gen_random_uuid(), 'j', 'running')"
            " RETURNING id"
        ).fetchone()
        assert job is not None
        task = conn.execute(
            "INSERT INTO tasks (id, job_id, name, kind, payload, status)"
            " VALUES (gen_random_uuid(), %s, 't', 'k', 'null'::jsonb, 'cancelled') RETURNING id",
            (job[0],),
        ).fetchone()
        assert task is not None
        insert = (
            "INSERT INTO task_runs (task_id, attempt_number, worker_id, status)"
            " VALUES (%s, 1, 'w', %s)"
        )
        conn.execute(insert, (task[0], "cancelled"))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(insert, (task[0], "bogus"))


async def test_a_process_on_a_database_short_of_migrations_refuses_to_start(
    pg_empty_dsn: str,
) -> None:
    """An orchestrator or worker on a database ``dtq migrate`` never ran on (or one migration
    short) stops at start with one line saying so; it used to start, answer ``/healthz`` and
    answer every request with a 503 quoting "relation \\"jobs\\" does not exist"."""
    settings = Settings(crdb_dsn=pg_empty_dsn, redis_addr="127.0.0.1:1")

    with pytest.raises(ConfigError, match=r"lacks \d+ of this dtq's migrations .*dtq migrate"):
        async with open_services(settings, backend="real"):
            pass
    assert await _unapplied(pg_empty_dsn) == [p.stem for p in migration_files()]

    apply_migrations(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        last = migration_files()[-1].stem
        conn.execute("DELETE FROM _yoyo_migration WHERE migration_id = %s", (last,))
    with pytest.raises(ConfigError, match=f"lacks 1 of this dtq's migrations .*{last}"):
        async with open_services(settings, backend="real"):
            pass

    apply_migrations(pg_empty_dsn)
    assert await _unapplied(pg_empty_dsn) == []


async def _unapplied(dsn: str) -> list[str] | None:
    pool = await open_pool(dsn, min_size=1, max_size=1)
    try:
        return await unapplied_migrations(pool)
    finally:
        await pool.close()
