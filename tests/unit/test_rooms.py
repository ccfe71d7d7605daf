"""The rooms outside the layers load only what they promise."""

from __future__ import annotations

import subprocess
import sys

SERVER_LIBRARIES = ("litestar", "psycopg", "redis", "uvicorn", "dependency_injector", "structlog")


def modules_loaded_by(statement: str) -> set[str]:
    """Top-level module names loaded by ``statement`` in a fresh interpreter."""
    names = "{m.split('.')[0] for m in sys.modules}"
    probe = f"{statement}; import sys; print(' '.join(sorted({names})))"
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    return set(out.split())


def test_the_api_schemas_the_client_speaks_load_no_server_library() -> None:
    loaded = modules_loaded_by("import dtq.client, dtq.entrypoints.api.schemas")

    assert "msgspec" in loaded
    assert loaded.isdisjoint(SERVER_LIBRARIES), sorted(loaded & set(SERVER_LIBRARIES))
