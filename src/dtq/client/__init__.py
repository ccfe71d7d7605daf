"""The Python client of the orchestrator API (spec §7): room reserved, empty until its issue.

What goes here: a small ``httpx``-based client (sync and async) that submits jobs and tasks,
reads them back and lists workers, speaking the request and response structs of
:mod:`dtq.entrypoints.api.schemas` (decoded with msgspec, so a client and the server agree on
one schema). Errors map the API's JSON error body (status, ``detail``, field) to exceptions.

Like :mod:`dtq.worker`, this package sits outside the layers: it imports only
``dtq.entrypoints.api.schemas``, ``httpx`` and ``msgspec`` — never the services, the adapters,
the container or the server (an import-linter contract in ``pyproject.toml`` enforces it), so a
program that only submits work installs no database or Redis driver.
"""
