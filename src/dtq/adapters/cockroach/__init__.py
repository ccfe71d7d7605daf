"""CockroachDB / PostgreSQL adapter (psycopg 3): the ``Store`` port and schema migrations."""

from dtq.adapters.cockroach.migrate import (
    apply_migrations,
    pending_migrations,
    unapplied_migrations,
)
from dtq.adapters.cockroach.store import CockroachStore, open_pool

__all__ = [
    "CockroachStore",
    "apply_migrations",
    "open_pool",
    "pending_migrations",
    "unapplied_migrations",
]
