"""The ``dtq`` command line: one-line errors with exit status 2, ``--app`` loading, dev mode."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import tempfile
import textwrap
from pathlib import Path

import httpx
import pytest

from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints import cli, gctuning
from dtq.entrypoints import config as dtq_config
from dtq.entrypoints.cli import common as cli_common
from dtq.entrypoints.cli import worker as cli_worker
from dtq.entrypoints.cli.orchestrator import serve
from dtq.entrypoints.config import Settings
from dtq.entrypoints.worker.runtime import Runtime, demo_runtime


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No dtq variable leaks in from the machine, no ./.env is read, logging is left alone."""
    for name in list(os.environ):
        if name.startswith(("CRDB_", "REDIS_", "WORKER_", "LOG_", "API_")) or name in {
            "LEASE_DURATION",
            "RECONCILE_INTERVAL",
            "STALE_RUNNING_AFTER",
            "ORCHESTRATOR_LISTEN",
            "RETRY_BACKOFF",
        }:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_common, "configure_logging", lambda fmt, level: None)


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- configuration errors ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["orchestrator", "worker", "migrate", "dev"])
def test_a_bad_variable_exits_2_with_one_line_naming_it(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LEASE_DURATION", "forever")

    status = cli.main([command])

    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("dtq: LEASE_DURATION: not a duration: 'forever'")


@pytest.mark.parametrize("command", ["orchestrator", "worker", "migrate"])
def test_commands_on_the_real_backend_require_crdb_dsn(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main([command])

    assert status == 2
    assert one_error_line(capsys.readouterr().err).startswith("dtq: CRDB_DSN: required")


@pytest.mark.parametrize(
    "argv", [["--env-file", "custom.env", "dev"], ["dev", "--env-file", "custom.env"]]
)
def test_a_bad_value_in_the_env_file_is_reported_the_same_way(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "custom.env").write_text("WORKER_HEARTBEAT_INTERVAL=100ms\n", encoding="utf-8")

    status = cli.main(argv)

    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == "dtq: WORKER_HEARTBEAT_INTERVAL: must be at least 1s, got '100ms'"


def test_the_real_environment_wins_over_the_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".env").write_text("LOG_LEVEL=loud\n", encoding="utf-8")
    monkeypatch.setenv("LOG_LEVEL", "chatty")

    assert cli.main(["dev"]) == 2
    assert "'chatty'" in one_error_line(capsys.readouterr().err)


def test_worker_main_and_orchestrator_main_are_the_subcommands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RETRY_BACKOFF", "-1s")
    monkeypatch.setattr(sys, "argv", ["dtq-worker", "--app", "x:y"])
    assert cli.worker_main() == 2
    monkeypatch.setattr(sys, "argv", ["dtq-orchestrator"])
    assert cli.orchestrator_main() == 2

    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "dtq: RETRY_BACKOFF: must be a positive duration, got '-1s'",
        "dtq: RETRY_BACKOFF: must be a positive duration, got '-1s'",
    ]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["worker", "--concurrency", "0"])

    assert caught.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["submit", "echo", "--max-attempts", "0"],
            "dtq submit: --max-attempts: must be at least 1, got 0",
        ),
        (
            ["submit", "echo", "--max-attempts", "abc"],
            "dtq submit: --max-attempts: not an integer: 'abc'",
        ),
        (
            ["submit", "echo", "--max-attempts", "-1"],
            "dtq submit: --max-attempts: must be at least 1, got -1",
        ),
        (["tasks", "list", "--limit", "0"], "dtq tasks list: --limit: must be at least 1, got 0"),
        (
            ["tasks", "list", "--limit", "9223372036854775808"],
            "dtq tasks list: --limit: must be at most 9223372036854775807, got 9223372036854775808",
        ),
        (["submit"], "dtq submit: the following arguments are required: KIND"),
        (["submit", "echo", "--bogus"], "dtq: unrecognized arguments: --bogus"),
        (["tasks", "lst"], "dtq tasks: COMMAND: invalid choice: 'lst' (choose from 'list')"),
    ],
)
def test_an_argument_error_is_one_line_naming_the_command_and_option_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)

    assert caught.value.code == 2
    assert capsys.readouterr().err == line + "\n"


def test_a_worker_without_app_is_refused_instead_of_running_the_demo(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --app a worker would run the demo echo runtime on the production backend and
    fail every other kind it pops, permanently."""
    monkeypatch.setenv("CRDB_DSN", "postgresql://nobody@127.0.0.1:1/none")

    status = cli.main(["worker"])

    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("dtq: --app: required")


@pytest.mark.parametrize("app", ["", "   ", "\t"])
@pytest.mark.parametrize("over_http", [False, True])
def test_a_worker_with_a_blank_app_is_refused_like_a_missing_one(
    app: str, over_http: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--app ''`` ran the demo echo runtime on the production backend (load_runtime took the
    empty text for "not given")."""
    monkeypatch.setenv("CRDB_DSN", "postgresql://nobody@127.0.0.1:1/none")
    served: list[Runtime] = []

    async def serve(settings: Settings, runtime: Runtime, *url: str) -> int:
        served.append(runtime)
        return 0

    monkeypatch.setattr(cli_worker, "work", serve)
    monkeypatch.setattr(cli_worker, "work_over_http", serve)
    orchestrator = ["--orchestrator", "http://127.0.0.1:1"] if over_http else []
    monkeypatch.setattr(sys, "argv", ["dtq-worker", "--app", app, *orchestrator])

    status = cli.worker_main()

    assert served == []
    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("dtq: --app: required")


@pytest.mark.parametrize("spec", ["", "  "])
def test_load_runtime_refuses_a_blank_spec_instead_of_loading_the_demo(spec: str) -> None:
    with pytest.raises(cli.UsageError, match="expected 'module:attribute'"):
        cli.load_runtime(spec)


# --- --app loading ------------------------------------------------------------------------------


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on sys.path where tests write handler modules."""
    folder = tmp_path / "apps"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


def write_module(folder: Path, name: str, source: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon_here", "--app: expected 'module:attribute', got 'no_colon_here'"),
        (":runtime", "--app: expected 'module:attribute', got ':runtime'"),
        ("mod:", "--app: expected 'module:attribute', got 'mod:'"),
        ("dtq_no_such_module:runtime", "--app: no module named 'dtq_no_such_module'"),
        ("dtq.no_such_sub:runtime", "--app: no module named 'dtq.no_such_sub'"),
        ("dtq.worker:no_such_attr", "--app: module 'dtq.worker' has no attribute 'no_such_attr'"),
    ],
)
def test_bad_app_specs_are_one_clear_line(
    spec: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(["dev", "--app", spec])

    assert status == 2
    assert one_error_line(capsys.readouterr().err) == f"dtq: {message}"


def test_dtq_dev_keeps_everything_in_memory_as_the_readme_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dtq.entrypoints.cli import orchestrator

    backends: list[str] = []

    async def serve_nothing(settings: Settings, *, backend: str, runtime: Runtime | None) -> int:
        backends.append(backend)
        return 0

    monkeypatch.setattr(orchestrator, "serve", serve_nothing)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its artifact directory goes here
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())

    assert cli.main(["dev"]) == 0
    assert backends == ["memory"]  # jobs, tasks, results: the process's memory, nothing else
    assert "stopping it loses every job" in readme


def test_a_bad_app_leaves_no_artifact_directory_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes its directories

    assert cli.main(["dev", "--app", "dtq_no_such_module:runtime"]) == 2

    assert list(tmp_path.iterdir()) == []
    assert "artifacts in" not in capsys.readouterr().out


def test_an_app_module_that_raises_on_import_is_one_line_with_its_location(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_module(app_dir, "dtq_boom_app", "x = 1\nraise RuntimeError('no config for you')\n")

    status = cli.main(["dev", "--app", "dtq_boom_app:runtime"])

    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        "dtq: --app: importing 'dtq_boom_app' failed: RuntimeError: no config for you (at "
    )
    assert line.endswith("dtq_boom_app.py:2)")


def test_a_missing_dependency_of_the_app_is_not_reported_as_the_app_missing(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_module(app_dir, "dtq_needs_dep", "import dtq_dependency_not_installed\n")

    assert cli.main(["dev", "--app", "dtq_needs_dep:runtime"]) == 2

    line = one_error_line(capsys.readouterr().err)
    assert "importing 'dtq_needs_dep' failed: ModuleNotFoundError" in line
    assert "dtq_dependency_not_installed" in line


def test_a_syntax_error_in_the_app_is_one_line(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_module(app_dir, "dtq_syntax_app", "def broken(:\n    pass\n")

    assert cli.main(["dev", "--app", "dtq_syntax_app:runtime"]) == 2

    line = one_error_line(capsys.readouterr().err)
    assert "importing 'dtq_syntax_app' failed: SyntaxError" in line


def test_an_attribute_that_is_not_a_runtime_is_refused(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_module(app_dir, "dtq_not_rt", "runtime = 42\ndef factory():\n    return 'nope'\n")

    assert cli.main(["dev", "--app", "dtq_not_rt:runtime"]) == 2
    assert cli.main(["dev", "--app", "dtq_not_rt:factory"]) == 2

    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "dtq: --app: 'dtq_not_rt:runtime' is a int, not a Runtime",
        "dtq: --app: 'dtq_not_rt:factory' returned str, not a Runtime",
    ]


def test_a_handler_named_by_app_is_one_line_saying_what_app_must_name(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_module(
        app_dir,
        "dtq_handler_app",
        """
        from dtq.worker import Runtime

        runtime = Runtime()

        @runtime.handler("echo")
        async def echo(task):
            return task.payload

        async def ping():
            return None
        """,
    )

    assert cli.main(["dev", "--app", "dtq_handler_app:echo"]) == 2
    assert cli.main(["dev", "--app", "dtq_handler_app:ping"]) == 2

    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines() == [
        "dtq: --app: 'dtq_handler_app:echo' is async function echo(task), which takes arguments;"
        " --app names a Runtime, or a callable that returns one when called with none",
        "dtq: --app: 'dtq_handler_app:ping' is async function ping(), which returns a"
        " coroutine; --app names a Runtime, or a callable that returns one when called with none",
    ]


def test_a_factory_that_raises_is_one_line(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_module(app_dir, "dtq_bad_factory", "def make():\n    raise ValueError('bad handler')\n")

    assert cli.main(["dev", "--app", "dtq_bad_factory:make"]) == 2

    line = one_error_line(capsys.readouterr().err)
    assert "calling 'dtq_bad_factory:make' failed: ValueError: bad handler" in line


def test_an_app_is_loaded_from_an_instance_or_a_factory(app_dir: Path) -> None:
    write_module(
        app_dir,
        "dtq_good_app",
        """
        from dtq.worker import Runtime

        runtime = Runtime()

        @runtime.handler("greet")
        async def greet(task):
            return None

        def make():
            return runtime

        class Holder:
            runtime = runtime
        """,
    )

    by_instance = cli.load_runtime("dtq_good_app:runtime")
    by_factory = cli.load_runtime("dtq_good_app:make")
    by_path = cli.load_runtime("dtq_good_app:Holder.runtime")

    assert by_instance is by_factory is by_path
    assert by_instance.kinds == ("greet",)


def test_without_app_the_demo_echo_runtime_is_loaded() -> None:
    runtime = cli.load_runtime(None)

    assert isinstance(runtime, Runtime)
    assert runtime.kinds == ("echo",)


# --- dev mode, in process -----------------------------------------------------------------------


async def test_dev_serves_runs_a_task_and_stops_on_sigterm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(
        orchestrator_listen="127.0.0.1:0",
        api_auth="none",  # what dtq dev runs with (DEV_DEFAULTS)
        lease_duration=10.0,
        reconcile_interval=1.0,
        promote_interval=0.05,
    )
    server = asyncio.create_task(serve(settings, backend="memory", runtime=demo_runtime()))

    async with asyncio.timeout(10.0):
        out = ""
        while "curl" not in out:
            if server.done():  # it failed to start: show why
                await server
            await asyncio.sleep(0.05)
            out += capsys.readouterr().out
        match = re.search(r"http://127\.0\.0\.1:(\d+)", out)
        assert match is not None
        base = f"http://127.0.0.1:{match.group(1)}"
        assert f"curl -sS -X POST {base}/v1/tasks" in out

        async with httpx.AsyncClient(base_url=base) as client:
            created = await client.post("/v1/tasks", json={"kind": "echo", "payload": {"n": 1}})
            assert created.status_code == 201
            task_id = created.json()["task_id"]
            status = ""
            while status != "completed":
                await asyncio.sleep(0.02)
                status = (await client.get(f"/v1/tasks/{task_id}")).json()["status"]

        os.kill(os.getpid(), signal.SIGTERM)
        assert await server == 0


def test_worker_exit_does_not_wait_for_a_lingering_handler_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="sync-handler")
    thread.start()
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    try:
        cli_common.exit_without_lingering_threads(0)
    finally:
        release.set()
        thread.join()
    assert exits == [0]
    assert cli_common.exit_without_lingering_threads(3) == 3  # nothing lingers now: a normal return


def test_a_missing_env_file_named_on_the_command_line_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = cli.main(["--env-file", "nowhere.env", "dev"])

    assert status == 2
    assert one_error_line(capsys.readouterr().err) == "dtq: --env-file: no such file: 'nowhere.env'"


@pytest.mark.parametrize("command", [["migrate"], ["token", "list"], ["tasks", "list"]])
def test_an_env_file_that_is_a_directory_is_one_line_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """It said "no such file: '/etc'" though /etc exists (and an API command read no file)."""
    status = cli.main(["--env-file", str(tmp_path), *command])

    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"dtq: --env-file: {str(tmp_path)!r} is a directory, not a file"


def test_a_default_env_that_is_a_directory_is_ignored_as_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``./.env`` is a common name for a virtualenv: only a named ``--env-file`` must be a file."""
    (tmp_path / ".env").mkdir()

    status = cli.main(["migrate"])

    assert status == 2
    assert one_error_line(capsys.readouterr().err).startswith("dtq: CRDB_DSN: required")


@pytest.mark.parametrize("command", [["migrate"], ["tasks", "list"]])
@pytest.mark.parametrize("default", [True, False])
def test_an_env_file_with_a_line_dotenv_cannot_parse_is_one_line_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], default: bool
) -> None:
    """python-dotenv logged 'could not parse statement starting at line 2' without the file,
    and the command went on without that line's variable. The line itself is not shown: it may
    hold a secret."""
    env_file = tmp_path / (".env" if default else "bad.env")
    env_file.write_text("LOG_LEVEL=info\nDTQ_TOKEN s3cret\n# fine\n", encoding="utf-8")
    option = [] if default else ["--env-file", str(env_file)]

    status = cli.main([*option, *command])

    assert status == 2
    err = capsys.readouterr().err
    line = one_error_line(err)
    shown = ".env" if default else str(env_file)
    assert line == (
        f"dtq: {shown}: line 2 is not a NAME=value line, a comment or blank (python-dotenv"
        " cannot parse it)"
    )
    assert "s3cret" not in err


def test_migrate_with_the_database_down_is_one_line_naming_the_host_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CRDB_DSN", "postgresql://postgres@127.0.0.1:1/postgres")  # nothing there

    status = cli.main(["migrate"])

    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == "dtq: CRDB_DSN: cannot connect: connection refused at 127.0.0.1:1"


def test_a_port_in_use_is_one_line_saying_so(capsys: pytest.CaptureFixture[str]) -> None:
    """The line names the reason (it said only "could not start", the errno being in an
    earlier JSON log line)."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        status = cli.main(["dev", "--port", str(port)])

    assert status == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"dtq: the HTTP server could not start on 127.0.0.1:{port}: ")
    assert "in use" in last


@pytest.mark.parametrize("taken", [True, False])
def test_a_worker_metrics_address_that_cannot_be_bound_is_one_line_saying_so(
    taken: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the orchestrator's own listen address: one line and exit 1 (it was a 48-line
    traceback ending in ``OSError: [Errno 98] Address already in use``, exit 1)."""
    from dtq.entrypoints import container

    real_open = container.open_worker_services
    monkeypatch.setattr(  # the worker's bundle on the memory backend: nothing else to reach
        container,
        "open_worker_services",
        lambda settings, backend: real_open(settings, backend="memory"),
    )
    monkeypatch.setenv("CRDB_DSN", "postgresql://nobody@127.0.0.1:1/none")
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        host = "127.0.0.1" if taken else "192.0.2.1"  # TEST-NET-1: no interface has it
        monkeypatch.setenv("WORKER_METRICS_LISTEN", f"{host}:{port}")

        status = cli.main(["worker", "--app", "tests.e2e.app:runtime"])

    assert status == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        f"dtq: WORKER_METRICS_LISTEN: the metrics server could not start on {host}:{port}: "
    )
    assert ("in use" if taken else "assign") in line


async def test_the_orchestrator_tunes_its_garbage_collector_once_its_app_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tuned: list[bool] = []

    def tune() -> bool:
        tuned.append(True)
        return True

    monkeypatch.setattr(gctuning, "tune", tune)
    with socket.create_server(("127.0.0.1", 0)) as taken:  # serve() then stops at the bind
        port = taken.getsockname()[1]
        settings = Settings(orchestrator_listen=f"127.0.0.1:{port}", api_auth="none")
        with pytest.RaisesGroup(BackendUnavailable):
            await serve(settings, backend="memory", runtime=None)

    assert tuned == [True]


@pytest.mark.parametrize("command", [["migrate"], ["tasks", "list"]])
def test_an_env_file_that_is_not_utf8_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    env_file = tmp_path / "bad.env"
    env_file.write_bytes(b"\xff\xfe=1\n")

    status = cli.main(["--env-file", str(env_file), *command])

    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"dtq: {env_file}: not UTF-8 text")


def test_an_env_file_that_cannot_be_read_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env_file = tmp_path / "locked.env"
    env_file.write_text("LOG_LEVEL=info\n")

    def refuse(path: object, **_: object) -> dict[str, str | None]:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(dtq_config, "dotenv_values", refuse)  # root reads any file here

    status = cli.main(["--env-file", str(env_file), "migrate"])

    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"dtq: {env_file}: cannot read: Permission denied"
