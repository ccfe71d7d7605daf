"""The orchestrator's HTTP API (spec §7): :func:`create_app` builds the Litestar application."""

from dtq.entrypoints.api.app import create_app

__all__ = ["create_app"]
