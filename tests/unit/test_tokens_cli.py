"""``dtq token`` input checks and the ``API_AUTH`` rules of ``dtq dev`` and ``dtq orchestrator``
(issue 15 item 3); the commands against a database are in tests/integration/test_tokens_real.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dtq.entrypoints import cli
from dtq.entrypoints.cli import common as cli_common
from dtq.entrypoints.cli.dev import check_dev_auth
from dtq.entrypoints.cli.orchestrator import is_loopback, warn_unauthenticated_bind
from dtq.entrypoints.cli.token import parse_lifetime
from dtq.entrypoints.config import ConfigError, Settings, load_settings


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No dtq variable from the machine, no ./.env, logging left alone."""
    for name in list(os.environ):
        if name.startswith(("CRDB_", "REDIS_", "API_", "METRICS_", "ORCHESTRATOR_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_common, "configure_logging", lambda fmt, level: None)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


BOUNDS = "dtq: --expires: must be at least 1s and at most 3650d"


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["--scopes", "read,root"], "dtq: --scopes: unknown scope 'root'"),
        (["--scopes", ","], "dtq: --scopes: at least one scope"),
        (["--scopes", "read", "--expires", "soon"], "dtq: --expires: not a duration: 'soon'"),
        (["--scopes", "read", "--expires", "0s"], "dtq: --expires: "),
        (["--scopes", "read", "--expires", "99999999d"], f"{BOUNDS}, got '99999999d'"),
        (["--scopes", "read", "--expires", "3651d"], f"{BOUNDS}, got '3651d'"),
        (["--scopes", "read", "--expires", "9" * 30 + "h"], f"{BOUNDS}, got '{'9' * 30}h'"),
        (["--scopes", "read", "--expires", "9" * 5000 + "d"], BOUNDS),
        (["--scopes", "read", "--expires", "1ms"], f"{BOUNDS}, got '1ms'"),
        (["--scopes", "read", "--expires", "0.999s"], f"{BOUNDS}, got '0.999s'"),
        (["--scopes", "read", "--expires", "-1h"], f"{BOUNDS}, got '-1h'"),
    ],
)
def test_bad_scopes_or_lifetimes_exit_2_in_one_line(
    argv: list[str],
    starts: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A port nothing listens on: the input is judged before the database is needed.
    monkeypatch.setenv("CRDB_DSN", "postgresql://postgres@127.0.0.1:1/postgres")
    monkeypatch.setenv("DB_ACQUIRE_TIMEOUT", "1s")

    status = cli.main(["token", "create", "--name", "ci", *argv])

    assert status == 2
    assert one_line(capsys.readouterr().err).startswith(starts)


@pytest.mark.parametrize(
    "action", [["list"], ["revoke", "ci"], ["create", "--name", "ci", "--scopes", "read"]]
)
def test_token_commands_need_crdb_dsn(
    action: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(["token", *action])

    assert status == 2
    assert one_line(capsys.readouterr().err).startswith("dtq: CRDB_DSN: required")


def test_lifetimes_take_days_and_go_durations() -> None:
    assert parse_lifetime("90d") == 90 * 86400
    assert parse_lifetime("1h30m") == 5400
    assert parse_lifetime("1s") == 1
    assert parse_lifetime("3650d") == parse_lifetime("87600h") == 3650 * 86400


def test_api_auth_defaults_to_tokens_and_is_a_checked_choice() -> None:
    assert load_settings({}).api_auth == "tokens"
    assert load_settings({}).metrics_auth is False
    assert load_settings({"API_AUTH": "NONE", "METRICS_AUTH": "true"}).api_auth == "none"
    with pytest.raises(ConfigError, match=r"^API_AUTH: must be one of tokens\|none"):
        load_settings({"API_AUTH": "off"})
    with pytest.raises(ConfigError, match=r"^METRICS_AUTH: must be one of true\|false"):
        load_settings({"METRICS_AUTH": "maybe"})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("example.com", False)],
)  # fmt: skip
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_dev_refuses_tokens_and_non_loopback_binds() -> None:
    check_dev_auth(Settings(api_auth="none", orchestrator_listen="127.0.0.1:8080"))
    with pytest.raises(ConfigError, match=r"^API_AUTH: "):
        check_dev_auth(Settings(api_auth="tokens", orchestrator_listen="127.0.0.1:8080"))
    with pytest.raises(ConfigError, match=r"^ORCHESTRATOR_LISTEN: .*loopback"):
        check_dev_auth(Settings(api_auth="none", orchestrator_listen=":8080"))


@pytest.mark.parametrize(
    ("env", "variable"),
    [({"API_AUTH": "tokens"}, "API_AUTH"), ({"ORCHESTRATOR_LISTEN": ":0"}, "ORCHESTRATOR_LISTEN")],
)
def test_dtq_dev_exits_2_in_one_line_for_tokens_or_a_public_bind(
    env: dict[str, str],
    variable: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    assert cli.main(["dev"]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"dtq: {variable}: ")


def test_the_orchestrator_warns_loudly_for_no_auth_beyond_loopback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    warn_unauthenticated_bind(Settings(api_auth="none", orchestrator_listen="127.0.0.1:8080"))
    warn_unauthenticated_bind(Settings(api_auth="tokens", orchestrator_listen=":8080"))
    assert capsys.readouterr().err == ""

    warn_unauthenticated_bind(Settings(api_auth="none", orchestrator_listen=":8080"))

    assert one_line(capsys.readouterr().err).startswith("dtq: WARNING: API_AUTH=none on :8080")
