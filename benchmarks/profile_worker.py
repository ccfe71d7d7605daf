"""``dtq-worker`` with round-trip counters: ``python -m benchmarks.profile_worker --app ...``.

Counts, without changing behaviour, every SQL statement the worker sends (by the name of its
constant in ``dtq.adapters.cockroach.sql``), every store transaction and try (so conflict
re-runs show), and every Redis command and pipeline. At exit the counts are written as JSON to
``$PROFILE_COUNTS``. Used by ``benchmarks.profile_drain``; not a part of dtq.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from redis.asyncio.client import Pipeline, Redis

from dtq.adapters.cockroach import sql
from dtq.adapters.cockroach.store import CockroachStore

SQL: collections.Counter[str] = collections.Counter()
SQL_ERRORS: collections.Counter[str] = collections.Counter()
REDIS: collections.Counter[str] = collections.Counter()
STORE: collections.Counter[str] = collections.Counter()

_NAMES = {
    " ".join(value.split()): name
    for name, value in vars(sql).items()
    if isinstance(value, str) and name.isupper()
}


def _label(query: Any) -> str:
    text = query if isinstance(query, str) else str(getattr(query, "as_string", lambda: query)())
    text = " ".join(text.split())
    return _NAMES.get(text) or text[:60]


def _patch_psycopg() -> None:
    original = psycopg.AsyncCursor.execute

    async def execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        label = _label(query)
        SQL[label] += 1
        try:
            return await original(self, query, params, **kw)
        except psycopg.Error as exc:
            SQL_ERRORS[f"{label} {exc.sqlstate}"] += 1
            raise

    psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]

    original_many = psycopg.AsyncCursor.executemany

    async def executemany(self: Any, query: Any, params_seq: Any, **kw: Any) -> Any:
        SQL[f"executemany {_label(query)}"] += 1
        return await original_many(self, query, params_seq, **kw)

    psycopg.AsyncCursor.executemany = executemany  # type: ignore[method-assign]


def _patch_store() -> None:
    run, try_once = CockroachStore.run, CockroachStore._try_once

    async def counted_run(self: Any, fn: Callable[..., Any]) -> Any:
        STORE["transactions"] += 1
        return await run(self, fn)

    async def counted_try(self: Any, fn: Callable[..., Any]) -> Any:
        STORE["tries"] += 1
        try:
            return await try_once(self, fn)
        except Exception as exc:
            STORE[f"try failed: {type(exc).__name__} {getattr(exc, 'reason', '')}".strip()] += 1
            caller = getattr(fn, "__qualname__", "?").split(".<locals>")[0]
            STORE[f"try failed in {caller}"] += 1
            raise

    CockroachStore.run = counted_run  # type: ignore[method-assign]
    CockroachStore._try_once = counted_try  # type: ignore[method-assign]


def _patch_redis() -> None:
    command = Redis.execute_command

    async def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        REDIS[str(args[0]).upper()] += 1
        return await command(self, *args, **options)

    Redis.execute_command = execute_command  # type: ignore[method-assign]
    pipe_execute = Pipeline.execute

    async def execute(self: Any, raise_on_error: bool = True) -> Any:
        names = [str(c[0][0]).upper() for c in self.command_stack]
        kinds = "+".join(dict.fromkeys(names))
        REDIS[f"pipeline[{kinds}] round trips"] += 1
        REDIS[f"pipeline[{kinds}] commands"] += len(names)
        return await pipe_execute(self, raise_on_error)

    Pipeline.execute = execute  # type: ignore[method-assign]


def _dump() -> None:
    target = os.environ.get("PROFILE_COUNTS")
    if not target:
        return
    Path(target).write_text(
        json.dumps({"sql": SQL, "sql_errors": SQL_ERRORS, "redis": REDIS, "store": STORE}, indent=2)
    )


def main() -> int:
    _patch_psycopg()
    _patch_store()
    _patch_redis()
    from dtq.entrypoints.cli import worker_main

    try:
        return worker_main()
    finally:
        _dump()


if __name__ == "__main__":
    sys.exit(main())
