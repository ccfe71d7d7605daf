"""``dtq token create|list|revoke`` as subprocesses against a PostgreSQL test database, and the
printed secret used against the API on the same database (issue 15 item 3)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from dtq.adapters.cockroach.store import CockroachStore
from dtq.domain.tokens import SECRET_PREFIX, hash_secret
from dtq.entrypoints import cli
from dtq.entrypoints.cli import common as cli_common
from dtq.entrypoints.config import Settings
from tests.integration.wiring import api_client, services_on

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
JSON = {"Content-Type": "application/json"}


def dtq(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m dtq.entrypoints.cli token ...`` on this tree with ``CRDB_DSN=dsn``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CRDB_", "API_", "REDIS_"))
    }
    env.update(
        CRDB_DSN=dsn,
        LOG_FORMAT="json",
        PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("src", "")),
    )
    return subprocess.run(
        [sys.executable, "-m", "dtq.entrypoints.cli", "token", *args],
        env=env,
        cwd=ROOT / "tests",  # no .env there
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def cells(row: str) -> list[str]:
    """The cells of one row of a rich table as ``dtq`` prints it."""
    return [cell.strip() for cell in re.split("[│┃]", row)]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


async def test_a_created_token_works_against_the_api_until_it_is_revoked(
    pg_store: CockroachStore, pg_dsn: str
) -> None:
    created = dtq(pg_dsn, "create", "--name", "ci", "--scopes", "submit", "--expires", "90d")
    assert created.returncode == 0, created.stderr
    lines = created.stdout.strip().splitlines()
    secret = lines[-1]
    assert secret.startswith(SECRET_PREFIX) and len(secret) == 47
    assert "ci" in lines[0] and "submit" in lines[0]
    assert secret not in created.stderr

    services = services_on(pg_store, settings=Settings(api_auth="tokens"))
    async with api_client(services) as http:
        headers = {**JSON, "Authorization": f"Bearer {secret}"}
        submitted = await http.post("/v1/tasks", json={"kind": "echo"}, headers=headers)
        assert submitted.status_code == 201, submitted.text
        task_id = submitted.json()["task_id"]
        refused = await http.get(f"/v1/tasks/{task_id}", headers=headers)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "forbidden"

        listed = dtq(pg_dsn, "list")
        assert listed.returncode == 0, listed.stderr
        assert cells(listed.stdout.splitlines()[2])[:2] == ["ci", "submit"]
        assert secret not in listed.stdout

        revoked = dtq(pg_dsn, "revoke", "ci")
        assert revoked.returncode == 0, revoked.stderr
        assert "revoked 'ci'" in revoked.stdout
        await asyncio.sleep(1.1)  # past the API process's cache bound (1 s)

        after = await http.post("/v1/tasks", json={"kind": "echo"}, headers=headers)
        assert after.status_code == 401
        assert after.json()["error"]["code"] == "unauthenticated"
        assert after.headers["www-authenticate"] == "Bearer"


@pytest.fixture
def no_tokens(pg_dsn: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """``pg_dsn`` with ``api_tokens`` emptied, for ``dtq token`` run in this process (the
    subprocess path is covered above; in process saves an interpreter start per command)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE api_tokens")
    for name in list(os.environ):
        if name.startswith(("CRDB_", "API_", "REDIS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CRDB_DSN", pg_dsn)
    monkeypatch.chdir(tmp_path)  # no .env
    monkeypatch.setattr(cli_common, "configure_logging", lambda fmt, level: None)
    return pg_dsn


def token(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = cli.main(["token", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_list_shows_each_token_without_its_secret_or_hash(
    no_tokens: str, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = []
    for name, scopes in (("reader", "read"), ("ops", "admin,read")):
        status, out, err = token(capsys, "create", "--name", name, "--scopes", scopes)
        assert status == 0, err
        secrets.append(out.strip().splitlines()[-1])
    assert token(capsys, "revoke", "reader")[0] == 0

    status, out, err = token(capsys, "list")
    json_status, json_out, json_err = token(capsys, "list", "--json")

    assert status == 0, err
    header, _rule, *rows = out.strip().splitlines()
    assert cells(header) == ["name", "scopes", "created", "expires", "revoked"]
    assert [cells(row)[:2] for row in rows] == [["ops", "admin,read"], ["reader", "read"]]
    assert cells(rows[0])[3:] == ["", ""]  # never expires, not revoked
    assert cells(rows[1])[4] != ""  # revoked
    assert json_status == 0, json_err
    listed = json.loads(json_out)
    assert [(t["name"], t["scopes"]) for t in listed] == [
        ("ops", ["admin", "read"]),
        ("reader", ["read"]),
    ]
    assert set(listed[0]) == {"name", "scopes", "created_at", "expires_at", "revoked_at"}
    assert (listed[0]["expires_at"], listed[0]["revoked_at"]) == (None, None)
    assert listed[1]["revoked_at"].endswith("Z")
    for secret in secrets:
        for printed in (out, json_out):
            assert secret not in printed
            assert hash_secret(secret) not in printed


def test_a_taken_name_or_an_unknown_one_exits_2_in_one_line(
    no_tokens: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert token(capsys, "create", "--name", "ci", "--scopes", "read")[0] == 0

    taken = token(capsys, "create", "--name", "ci", "--scopes", "admin")
    unknown = token(capsys, "revoke", "nobody")
    bad_name = token(capsys, "create", "--name", "has space", "--scopes", "read")
    again = token(capsys, "revoke", "ci"), token(capsys, "revoke", "ci")

    assert taken[:2] == (2, "")
    assert one_line(taken[2]).startswith("dtq: --name: a token named 'ci' already exists")
    assert unknown[0] == 2
    assert one_line(unknown[2]) == "dtq: token revoke: no token is named 'nobody'"
    assert bad_name[0] == 2
    assert one_line(bad_name[2]).startswith("dtq: --name: ")
    assert [status for status, _, _ in again] == [0, 0]
    assert "already revoked" in again[1][1]
