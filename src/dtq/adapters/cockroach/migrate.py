"""Schema migrations with yoyo-migrations (spec §9 Migrations, CRDB.md "Migrations").

The canonical SQL lives in ``migrations/`` at the repository root: numbered files, one DDL
statement each, ``IF NOT EXISTS`` everywhere, and a ``-- transactional: false`` header so each
statement runs in autocommit (CockroachDB schema changes are not transactional).

Where the files are found (in this order):

1. the ``directory`` argument, when given;
2. ``dtq/adapters/cockroach/migrations`` inside the installed package, when a build step has
   copied the files there (``importlib.resources``; a wheel must ship them there);
3. ``<repository root>/migrations``, found as ``Path(__file__).parents[4]``: the source checkout
   that our editable install (``pip install -e .``) runs from.

yoyo 9 reaches psycopg 3 through its ``postgresql+psycopg`` scheme. We build that URL from any
libpq DSN (URL or ``key=value`` form) by moving every connection parameter into the query
string, so multi-host CockroachDB DSNs and TLS options survive unchanged. yoyo serialises
concurrent runs with a row in its ``yoyo_lock`` table (not advisory locks, which are no-ops on
CockroachDB), so two deployers racing is safe.

The functions are synchronous (yoyo is); call them from a thread in async code.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool
from yoyo import read_migrations
from yoyo.backends.base import DatabaseBackend
from yoyo.backends.core.postgresql import PostgresqlPsycopgBackend
from yoyo.connections import parse_uri
from yoyo.exceptions import LockTimeout

from dtq.domain.errors import BackendUnavailable

#: yoyo's backend name for psycopg 3 (``postgresql`` alone means psycopg2).
YOYO_SCHEME = "postgresql+psycopg"

#: Seconds to wait for another process's migration lock before giving up.
LOCK_TIMEOUT = 60.0


class _DtqPsycopgBackend(PostgresqlPsycopgBackend):  # type: ignore[misc]
    """yoyo's psycopg 3 backend with two CockroachDB-safe adjustments.

    * No prepared statements on migration connections (``prepare_threshold=None``, CRDB.md):
      a statement prepared before a schema change must not be reused after it.
    * ``ROLLBACK`` is sent only inside a transaction. yoyo issues a bare ``ROLLBACK`` before
      every ``transactional: false`` migration; PostgreSQL answers it with a warning but
      CockroachDB with an error (SQLSTATE 25P01, cockroachdb/cockroach#126003).
    """

    def connect(self, dburi: Any) -> Any:
        connection = super().connect(dburi)
        connection.prepare_threshold = None
        return connection

    def rollback(self) -> None:
        if self.connection.info.transaction_status != TransactionStatus.IDLE:
            self.execute("ROLLBACK")
        DatabaseBackend.rollback(self)


def yoyo_url(dsn: str) -> str:
    """Convert a libpq DSN into the URL yoyo 9 needs for psycopg 3.

    Args:
        dsn: ``postgresql://user@host:5432/db?sslmode=...`` or ``host=... dbname=...``.

    Returns:
        ``postgresql+psycopg:///?dbname=...&host=...&user=...`` carrying every parameter.

    Raises:
        BackendUnavailable: the DSN cannot be parsed.
    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise BackendUnavailable(f"invalid database DSN: {exc}") from exc
    # yoyo does not unquote the URL path, so even dbname travels in the query string (yoyo
    # passes every query parameter to psycopg.connect as a keyword, overriding the path).
    query = urlencode({k: str(v) for k, v in params.items() if v is not None})
    return f"{YOYO_SCHEME}:///" + (f"?{query}" if query else "")


def default_migrations_dir() -> Path:
    """The migrations folder: packaged copy if present, else ``<repo root>/migrations``.

    Raises:
        FileNotFoundError: neither location holds a migrations folder.
    """
    packaged = resources.files("dtq.adapters.cockroach").joinpath("migrations")
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[4] / "migrations"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"no migrations folder (looked in the package and {checkout})")


def _backend(dsn: str) -> Any:
    backend = _DtqPsycopgBackend(parse_uri(yoyo_url(dsn)), "_yoyo_migration")
    backend.init_database()
    return backend


def apply_migrations(dsn: str, *, directory: Path | str | None = None) -> list[str]:
    """Apply every migration not yet applied, in file-name order, under yoyo's lock.

    Safe to run twice and from several processes at once: applied migrations are skipped.

    Args:
        dsn: libpq DSN of the target database (PostgreSQL >= 15 or CockroachDB >= 23.2).
        directory: folder of ``NNNN_name.sql`` files; defaults to ``default_migrations_dir()``.

    Returns:
        The ids (file names without ``.sql``) applied by this call, in order; empty when the
        schema was already current.

    Raises:
        BackendUnavailable: the database refused a statement, could not be reached, or another
            process held the migration lock for longer than ``LOCK_TIMEOUT`` seconds.
    """
    migrations = read_migrations(str(directory or default_migrations_dir()))
    try:
        backend = _backend(dsn)
        try:
            with backend.lock(timeout=LOCK_TIMEOUT):
                todo = backend.to_apply(migrations)
                backend.apply_migrations(todo)
                return [m.id for m in todo]
        finally:
            backend.connection.close()
    except (psycopg.Error, LockTimeout) as exc:
        raise BackendUnavailable(f"migration failed: {exc}") from exc


def pending_migrations(dsn: str, *, directory: Path | str | None = None) -> list[str]:
    """The ids of the migrations not yet applied, in the order they would run.

    Args:
        dsn: libpq DSN of the target database.
        directory: folder of migration files; defaults to ``default_migrations_dir()``.

    Raises:
        BackendUnavailable: the database could not be reached.
    """
    migrations = read_migrations(str(directory or default_migrations_dir()))
    try:
        backend = _backend(dsn)
        try:
            return [m.id for m in backend.to_apply(migrations)]
        finally:
            backend.connection.close()
    except psycopg.Error as exc:
        raise BackendUnavailable(f"cannot read migration state: {exc}") from exc


#: What an unmigrated database answers when its tables are read.
_UNDEFINED_TABLE = "42P01"


async def unapplied_migrations(
    pool: AsyncConnectionPool, *, directory: Path | str | None = None
) -> list[str] | None:
    """The shipped migrations the database has not applied (their ids, in file order), read
    without writing anything: every id when yoyo's table is absent (a database never migrated).

    Unlike :func:`pending_migrations` it creates no yoyo table, so a role that may only read
    and write dtq's own tables can run it at start.

    Returns:
        The ids, empty when the schema is current (or newer), None when the state could not be
        read (e.g. no privilege on yoyo's table): the caller goes on without the check.
    """
    shipped = [m.id for m in read_migrations(str(directory or default_migrations_dir()))]
    try:
        async with pool.connection() as conn:
            try:
                cur = await conn.execute("SELECT migration_id FROM _yoyo_migration")
                applied = {str(row[0]) for row in await cur.fetchall()}
            finally:
                await conn.rollback()
    except psycopg.Error as exc:
        if exc.sqlstate == _UNDEFINED_TABLE:
            return shipped
        return None
    return [m for m in shipped if m not in applied]
