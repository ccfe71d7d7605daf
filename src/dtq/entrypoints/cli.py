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
``dtq dev [--app module:attr] [--port N]``
    API + reconciler + one worker in one process on the in-memory backend: nothing to install.

Configuration comes from the environment, with ``./.env`` (or ``--env-file``) underneath it
(spec §8). A configuration error prints one line, ``dtq: VARIABLE: message``, and exits with
status 2; so does an ``--app`` that cannot be loaded. Exit status 1 means a backend failed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import uvicorn

from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints import eventloop
from dtq.entrypoints.config import (
    ConfigError,
    Settings,
    listen_address,
    load_dotenv_file,
    load_settings,
)
from dtq.entrypoints.logging import configure_logging

if TYPE_CHECKING:
    from dtq.entrypoints.container import Backend
    from dtq.entrypoints.worker.runtime import Runtime

PROG = "dtq"
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Timings of ``dtq dev`` unless the environment sets them: fast feedback on one machine.
DEV_DEFAULTS: Mapping[str, str] = {
    "LEASE_DURATION": "10s",
    "RECONCILE_INTERVAL": "1s",
    "ORCHESTRATOR_LISTEN": "127.0.0.1:8080",
}

_DEFAULT_APP = "dtq.entrypoints.worker.runtime:demo_runtime"
_CURL_EXAMPLE = (
    "curl -sS -X POST http://{host}:{port}/v1/tasks -H 'Content-Type: application/json' "
    """-d '{{"kind":"echo","payload":{{"msg":"hi"}}}}'"""
)


class UsageError(Exception):
    """A command-line problem reported as one line with exit status 2.

    Args:
        subject: what the problem is about, e.g. ``--app``.
        message: what is wrong.
    """

    def __init__(self, subject: str, message: str) -> None:
        self.subject = subject
        self.message = message
        super().__init__(f"{subject}: {message}")


# --- entry points --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dtq``.

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status: 0 done, 1 a backend failed, 2 bad configuration or usage,
        130 interrupted before the command could install its signal handlers.
    """
    args = _parser().parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.command
    try:
        return command(args)
    except (ConfigError, UsageError) as exc:
        _fail(str(exc))
        return EXIT_USAGE
    except BackendUnavailable as exc:
        _fail(exc.detail)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def orchestrator_main() -> int:
    """Console entry point ``dtq-orchestrator`` (same as ``dtq orchestrator``)."""
    return main(["orchestrator", *sys.argv[1:]])


def worker_main() -> int:
    """Console entry point ``dtq-worker`` (same as ``dtq worker``)."""
    return main(["worker", *sys.argv[1:]])


def _fail(line: str) -> None:
    sys.stderr.write(f"{PROG}: {' '.join(line.split())}\n")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _parser() -> argparse.ArgumentParser:
    env_help = "dotenv file read under the real environment (default: .env; missing is fine)"
    parser = argparse.ArgumentParser(
        prog=PROG, description="dtq: distributed task orchestrator (CockroachDB + Redis)."
    )
    parser.add_argument("--env-file", default=".env", metavar="PATH", help=env_help)
    # Accepted after the command too (``dtq-worker --env-file x``); SUPPRESS keeps the default
    # above when it is not given there.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--env-file", default=argparse.SUPPRESS, metavar="PATH", help=env_help)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help_text, parents=[common])

    orchestrator = command("orchestrator", "HTTP API + reconciler")
    orchestrator.set_defaults(command=_cmd_orchestrator)

    worker = command("worker", "run a worker runtime")
    _add_app_option(worker, required=True)
    worker.add_argument(
        "--concurrency", type=_positive_int, metavar="N", help="poll loops (WORKER_CONCURRENCY)"
    )
    worker.set_defaults(command=_cmd_worker)

    migrate = command("migrate", "apply SQL migrations to CRDB_DSN")
    migrate.set_defaults(command=_cmd_migrate)

    dev = command("dev", "API + reconciler + worker in memory, one process")
    _add_app_option(dev)
    dev.add_argument(
        "--port", type=_port, metavar="N", help="HTTP port (default 8080, 0 = any free port)"
    )
    dev.set_defaults(command=_cmd_dev)
    return parser


def _add_app_option(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "--app",
        default=None,
        metavar="MODULE:ATTR",
        help=(
            "the Runtime (or a factory of one) with your handlers (required)"
            if required
            else "the Runtime (or a factory of one) to run; default: the demo echo runtime"
        ),
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value


# --- settings and the runtime to run -------------------------------------------------------------


def _settings(args: argparse.Namespace, *, defaults: Mapping[str, str] | None = None) -> Settings:
    """Load settings (``.env`` under the environment, ``defaults`` under both) and configure
    logging from them.

    Raises:
        ConfigError: a variable has an unusable value.
        UsageError: ``--env-file`` names a file that does not exist (the default ``.env`` may
            be absent).
    """
    if args.env_file != ".env" and not os.path.isfile(args.env_file):
        raise UsageError("--env-file", f"no such file: {args.env_file!r}")
    environ = load_dotenv_file(args.env_file, environ=os.environ)
    settings = load_settings({**(defaults or {}), **environ})
    configure_logging(settings.log_format, settings.log_level)
    return settings


def load_runtime(spec: str | None) -> Runtime:
    """Import the runtime named by ``--app``.

    Args:
        spec: ``package.module:attribute``; the attribute is a ``Runtime`` or a zero-argument
            callable returning one. None loads the demo runtime.

    Returns:
        The runtime.

    Raises:
        UsageError: the spec is malformed, the module cannot be imported (or raised while being
            imported), the attribute is missing, or it is not a runtime.
    """
    from dtq.entrypoints.worker.runtime import Runtime

    text = spec or _DEFAULT_APP
    module_name, sep, attr_path = text.partition(":")
    if not sep or not module_name or not attr_path:
        raise UsageError("--app", f"expected 'module:attribute', got {text!r}")
    # Like uvicorn: the working directory is importable, so `--app myapp.tasks:runtime` works
    # from the folder that holds `myapp/` without setting PYTHONPATH.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name or module_name.startswith(f"{exc.name}."):
            raise UsageError("--app", f"no module named {module_name!r}") from None
        raise UsageError("--app", f"importing {module_name!r} failed: {_describe(exc)}") from None
    except Exception as exc:
        raise UsageError("--app", f"importing {module_name!r} failed: {_describe(exc)}") from None
    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(
                "--app", f"module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    if isinstance(target, Runtime):
        return target
    if callable(target):
        try:
            made = target()
        except Exception as exc:
            raise UsageError("--app", f"calling {text!r} failed: {_describe(exc)}") from None
        if isinstance(made, Runtime):
            return made
        raise UsageError("--app", f"{text!r} returned {type(made).__name__}, not a Runtime")
    raise UsageError("--app", f"{text!r} is a {type(target).__name__}, not a Runtime")


def _describe(exc: BaseException) -> str:
    """``Type: message (at file:line)`` of the innermost frame, on one line."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})"
    elif isinstance(exc, SyntaxError) and exc.filename:
        where = f" (at {exc.filename}:{exc.lineno})"
    return f"{type(exc).__name__}: {exc}{where}"


# --- commands -----------------------------------------------------------------------------------


def _cmd_orchestrator(args: argparse.Namespace) -> int:
    settings = _settings(args)
    settings.require_dsn()
    return _run(_serve(settings, backend="real", runtime=None))


def _cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.concurrency is not None:
        settings = dataclasses.replace(settings, worker_concurrency=args.concurrency)
    settings.require_dsn()
    if args.app is None:
        # Checked here, not by argparse, so configuration errors are still reported first.
        raise UsageError(
            "--app",
            "required: the Runtime with your handlers, e.g. --app myapp.tasks:runtime (a worker "
            "without them would fail every task it pops; the demo echo runtime is for dtq dev)",
        )
    runtime = load_runtime(args.app)
    return _exit_without_lingering_threads(_run(_work(settings, runtime)))


def _exit_without_lingering_threads(code: int) -> int:
    """Return ``code``, or end the process at once if handler threads are still running.

    A plain ``def`` handler cannot be interrupted; at shutdown its task was already handed back
    (or its outcome recorded), but Python would wait at exit for its thread to return. Logs are
    flushed first; nothing else is left to do by then.
    """
    lingering = [
        t
        for t in threading.enumerate()
        if t.is_alive() and not t.daemon and t is not threading.main_thread()
    ]
    if not lingering:
        return code
    _say(f"dtq: {len(lingering)} handler thread(s) still running; exiting without waiting")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _cmd_migrate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    dsn = settings.require_dsn()
    from dtq.adapters.cockroach import apply_migrations

    applied = apply_migrations(dsn)
    if not applied:
        _say("migrate: schema is up to date (nothing applied)")
    for migration in applied:
        _say(f"migrate: applied {migration}")
    return EXIT_OK


def _cmd_dev(args: argparse.Namespace) -> int:
    settings = _settings(args, defaults=DEV_DEFAULTS)
    if args.port is not None:
        host, _ = listen_address(settings.orchestrator_listen)
        settings = dataclasses.replace(settings, orchestrator_listen=f"[{host}]:{args.port}")
    runtime = load_runtime(args.app)
    return _exit_without_lingering_threads(
        _run(_serve(settings, backend="memory", runtime=runtime))
    )


#: Seconds the API keeps an idle keep-alive connection open. Longer than the idle expiry of
#: common clients (httpx 5 s, urllib3 none, Go 90 s behind most proxies' 60 s), so a client
#: normally drops an idle connection before the server does. At uvicorn's default of 5 s, a
#: client with the same 5 s expiry could send a request on a connection the server was closing
#: that instant and get "connection reset by peer" (seen in ``make bench``).
HTTP_KEEP_ALIVE = 65

#: Seconds the API waits for in-flight requests when stopping; then they are cancelled.
HTTP_SHUTDOWN_GRACE = 5


def _run(coro: Coroutine[Any, Any, int]) -> int:
    """Run ``coro`` in a new event loop; a lone backend or config error leaves its task group
    as itself, so :func:`main` reports it as one line."""
    try:
        return eventloop.run(coro)
    except ExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1 and isinstance(
            leaves[0], BackendUnavailable | ConfigError | UsageError
        ):
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(_leaves(exc))
        else:
            found.append(exc)
    return found


# --- processes ----------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to ``stop_on_signals``, which stops the API,
    the reconciler and the dev worker together."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install nothing (uvicorn would otherwise take SIGINT/SIGTERM for itself)."""
        yield


async def _work(settings: Settings, runtime: Runtime) -> int:
    from dtq.entrypoints.container import open_services
    from dtq.entrypoints.worker.runtime import serve

    await serve(runtime, settings, lambda: open_services(settings, backend="real"))
    return EXIT_OK


async def _serve(settings: Settings, *, backend: Backend, runtime: Runtime | None) -> int:
    """Serve the API and run the reconciler (and, for ``dev``, a worker) until a signal."""
    from dtq.entrypoints.api import create_app
    from dtq.entrypoints.container import open_services
    from dtq.entrypoints.metrics import OrchestratorMetrics, new_registry
    from dtq.entrypoints.reconciler import Reconciler
    from dtq.entrypoints.worker.runtime import stop_on_signals

    host, port = listen_address(settings.orchestrator_listen)
    metrics = OrchestratorMetrics(new_registry())
    stop, stop_now = asyncio.Event(), asyncio.Event()

    def count_retry(reason: str) -> None:
        metrics.store_retries.labels(reason=reason).inc()

    async with open_services(settings, backend=backend, on_store_retry=count_retry) as services:
        app = create_app(services, settings, metrics, metrics.registry)
        server = _Server(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_config=None,
                lifespan="on",
                timeout_keep_alive=HTTP_KEEP_ALIVE,
                timeout_graceful_shutdown=HTTP_SHUTDOWN_GRACE,
            )
        )
        reconciler = Reconciler(
            services.reconcile,
            interval=settings.reconcile_interval,
            promote_interval=settings.promote_interval,
            batch=settings.reconcile_batch,
            metrics=metrics,
        )

        def stop_gracefully() -> None:
            stop.set()
            server.should_exit = True

        def stop_at_once() -> None:
            # Not uvicorn's force_exit: it skips the app's lifespan shutdown, whose pending
            # receive() is then cancelled at loop teardown and logged as an error traceback.
            # In-flight requests are bounded by HTTP_SHUTDOWN_GRACE instead.
            stop_gracefully()
            stop_now.set()

        with stop_on_signals(stop_gracefully, stop_at_once):
            async with asyncio.TaskGroup() as group:
                group.create_task(_serve_http(server, stop), name="dtq-http")
                group.create_task(reconciler.run(stop), name="dtq-reconciler")
                if runtime is not None:
                    group.create_task(
                        runtime.run(
                            services, runtime.configure(settings), stop=stop, stop_now=stop_now
                        ),
                        name="dtq-worker",
                    )
                    group.create_task(_announce(server), name="dtq-announce")
    return EXIT_OK


async def _serve_http(server: uvicorn.Server, stop: asyncio.Event) -> None:
    """Run uvicorn until it exits; then stop the other loops too.

    Raises:
        BackendUnavailable: the server could not start (port in use, app startup failed).
    """
    try:
        await server.serve()
    except SystemExit:  # uvicorn exits this way when it cannot bind or start the app
        raise BackendUnavailable(
            f"the HTTP server could not start on {server.config.host}:{server.config.port}"
        ) from None
    finally:
        stop.set()


async def _announce(server: uvicorn.Server) -> None:
    """Once the dev server listens, print where and a request to try."""
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    host, port = server.config.host, server.config.port
    for listener in getattr(server, "servers", []):
        for sock in listener.sockets:
            port = sock.getsockname()[1]
            break
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    _say(f"dtq dev: API on http://{shown}:{port} (in-memory backend; worker in this process)")
    _say("try:")
    _say("  " + _CURL_EXAMPLE.format(host=shown, port=port))
    _say(f"then: curl -sS http://{shown}:{port}/v1/tasks/<task_id>")
