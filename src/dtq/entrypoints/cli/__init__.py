"""The ``dtq`` command line: orchestrator, worker, migrate and an all-in-one dev server.

``dtq orchestrator``
    HTTP API (spec §7) and the reconciler (spec §2, §5) in one event loop, on CockroachDB/PostgreSQL
    and Redis. SIGTERM/SIGINT stop both gracefully; a second signal stops at once.
``dtq worker --app module:attr [--concurrency N]``
    A worker runtime (spec §6): ``--app`` names a :class:`~dtq.worker.Runtime` (or a
    zero-argument factory returning one) as ``package.module:attribute``, like uvicorn. It is
    required: a worker without the application's handlers would fail every task it pops
    permanently (unknown kind), so the demo ``echo`` runtime runs only in ``dtq dev``.
``dtq migrate``
    Apply the SQL migrations to ``CRDB_DSN`` and print what was applied.
``dtq token create|list|revoke``
    API tokens in ``CRDB_DSN`` (:mod:`.token`); ``create`` prints the secret once, last.
``dtq webhook create|list|delete|deliveries``
    The webhooks of a running orchestrator, through its API (:mod:`.webhook`).
``dtq dev [--app module:attr] [--port N]``
    API + reconciler + one worker in one process on the in-memory backend: nothing to install.

Configuration comes from the environment, with ``./.env`` (or ``--env-file``) underneath it
(spec §8). A configuration error prints one line, ``dtq: VARIABLE: message``, and exits with
status 2; so does an ``--app`` that cannot be loaded, and a database that cannot be reached at
start, and an option or argument the parser refuses (``dtq submit: --max-attempts: must be
at least 1, got 0``). Exit status 1 means a backend failed while running.

One module per command group: :mod:`.orchestrator`, :mod:`.worker`, :mod:`.migrate`,
:mod:`.token`, :mod:`.dev`; :mod:`.entry` builds the parser and holds the console entry points
(``dtq``, ``dtq-worker``, ``dtq-orchestrator``); :mod:`.common` the shared helpers (settings,
exit codes, the event loop runner) and :mod:`.apps` the ``--app`` loader. A new command group is
a new module with an ``add_parser(commands, parents)`` function, registered in :mod:`.entry`.
No module here names an adapter: backends come from :mod:`dtq.entrypoints.container`.
"""

from dtq.entrypoints.cli.apps import load_runtime
from dtq.entrypoints.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    UsageError,
)
from dtq.entrypoints.cli.entry import main, orchestrator_main, worker_main

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "PROG",
    "UsageError",
    "load_runtime",
    "main",
    "orchestrator_main",
    "worker_main",
]
