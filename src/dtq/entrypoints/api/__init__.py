"""The orchestrator's HTTP API (spec §7): :func:`create_app` builds the Litestar application.

``create_app`` is imported on first use, so ``import dtq.entrypoints.api.schemas`` (what the
Python client speaks) loads no server library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtq.entrypoints.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from dtq.entrypoints.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
