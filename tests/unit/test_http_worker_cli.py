"""``dtq-worker --orchestrator URL`` (issue 15 item 1): no database or Redis settings needed,
one-line usage errors, ``DTQ_TOKEN`` handed to the HTTP backend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dtq.entrypoints import cli
from dtq.entrypoints.cli import common as cli_common
from dtq.entrypoints.cli import worker as cli_worker


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("CRDB_", "REDIS_", "WORKER_", "DTQ_TOKEN")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_common, "configure_logging", lambda fmt, level: None)


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    "url",
    ["ftp://host", "localhost:8080", "http://", "http://h?x=1", "http://[::1", "http://h:99999"],
)
def test_a_bad_orchestrator_url_exits_2_with_one_line(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(["worker", "--app", "tests.e2e.app:runtime", "--orchestrator", url])

    assert status == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("dtq: --orchestrator: must be an http(s)://host[:port] URL")


def test_over_http_no_crdb_dsn_is_required_but_the_app_still_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = cli.main(["worker", "--orchestrator", "http://127.0.0.1:8080"])

    assert status == 2
    assert one_error_line(capsys.readouterr().err).startswith("dtq: --app: required")


def test_the_worker_runs_over_http_with_the_token_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DTQ_TOKEN", "s3cret")
    monkeypatch.setenv("WORKER_ID", "h-1")
    called: dict[str, Any] = {}

    async def work_over_http(settings: Any, runtime: Any, url: str) -> int:
        called.update(url=url, token=settings.dtq_token, kinds=runtime.kinds, id=settings.worker_id)
        return 0

    monkeypatch.setattr(cli_worker, "work_over_http", work_over_http)

    status = cli.main(
        ["worker", "--app", "tests.e2e.app:runtime", "--orchestrator", "http://orch:8080/"]
    )

    assert status == 0
    assert called["url"] == "http://orch:8080"
    assert (called["token"], called["id"]) == ("s3cret", "h-1")
    assert "record" in called["kinds"]


def test_the_token_is_not_in_the_settings_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    from dtq.entrypoints.config import load_settings

    settings = load_settings({"DTQ_TOKEN": "s3cret"})

    assert settings.dtq_token == "s3cret"
    assert "s3cret" not in repr(settings)
