"""The CLI commands on the client (issue 15 item 5): ``dtq submit``, ``dtq job submit``,
``dtq watch``, ``dtq results``, run as ``cli.main([...])`` in a thread against the app under a
real uvicorn server; their output (table, ``--json``), exit statuses and one-line errors."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from dtq.entrypoints import cli
from tests.unit.api_harness import SETTINGS
from tests.unit.http_server import Server, serving


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    async with serving() as running:
        monkeypatch.setenv("DTQ_URL", running.url)
        monkeypatch.delenv("DTQ_TOKEN", raising=False)
        yield running


#: The CLI's refusal of an ``--idempotency-key`` of the wrong length (the count follows).
KEY_LENGTH = "--idempotency-key: must be 1 to 255 characters long"


async def dtq(*argv: str) -> int:
    return await asyncio.to_thread(cli.main, list(argv))


async def test_submit_prints_the_ids_as_a_table_and_as_json(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await dtq("submit", "echo", "--payload", '{"n": 1}') == 0
    table = capsys.readouterr().out
    assert await dtq("submit", "echo", "--priority", "high", "--json") == 0
    created = json.loads(capsys.readouterr().out)

    assert "task_id" in table and "job_id" in table
    task = await server.services.api.queries.get_task(UUID(created["task_id"]))
    assert task.task.priority == "high"


async def test_the_table_is_the_default_also_when_piped_as_the_readme_says(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())

    assert await dtq("submit", "echo") == 0  # capsys: stdout is not a terminal
    printed = capsys.readouterr().out

    assert "task_id" in printed and "│" in printed and not printed.startswith("{")
    assert "a table on a terminal" not in readme
    assert "a table by default, also when piped; `--json` prints JSON for scripts" in readme


async def test_submit_prints_its_warnings_on_stderr_one_line_each_in_table_mode(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"tasks": [{"name": "a", "kind": "nc.nobody"}]}))

    single = await dtq("submit", "nc.nobody")
    single_out = capsys.readouterr()
    from_file = await dtq("job", "submit", str(job))
    file_out = capsys.readouterr()
    as_json = await dtq("submit", "nc.nobody", "--json")
    json_out = capsys.readouterr()

    assert (single, from_file, as_json) == (0, 0, 0)
    assert "task_id" in single_out.out and "job_id" in file_out.out
    for err, task in ((single_out.err, "nc.nobody"), (file_out.err, "a")):
        lines = err.splitlines()
        assert lines and all(line.startswith("dtq: warning: no_worker_for_") for line in lines)
        assert any(
            line.startswith("dtq: warning: no_worker_for_kind: ") and f"task '{task}'" in line
            for line in lines
        ), err
    # --json keeps them in the JSON it prints, and stderr quiet
    assert json_out.err == ""
    assert json.loads(json_out.out)["warnings"]


async def test_submit_wait_follows_the_job_to_its_end(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    waiting = asyncio.ensure_future(dtq("submit", "echo", "--wait", "--json"))
    task_id = await _first_queued(server)
    await server.complete(task_id, {"ok": True})

    assert await waiting == 0
    final = json.loads(capsys.readouterr().out)
    assert final["status"] == "completed"
    assert final["counts"]["completed"] == 1


async def test_submit_wait_gives_up_after_its_timeout_with_exit_124(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    status = await dtq("submit", "echo", "--wait", "--timeout", "300ms", "--json")

    assert status == 124
    # no worker serves echo here: the submit's warnings say why, before the wait gives up
    *warnings, last = capsys.readouterr().err.splitlines()
    assert last.startswith("dtq: job ")
    assert warnings and all(line.startswith("dtq: warning: no_worker_for_") for line in warnings)


async def test_job_submit_reads_the_body_from_a_file(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"name": "j", "tasks": [{"name": "a", "kind": "echo"}, {"name": "b", "kind": "echo"}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(body))

    assert await dtq("job", "submit", str(path), "--json") == 0
    created = json.loads(capsys.readouterr().out)

    assert set(created["tasks"]) == {"a", "b"}


async def test_watch_exits_1_for_a_failed_job_and_shows_the_failure(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await dtq("submit", "flaky", "--json") == 0
    created = json.loads(capsys.readouterr().out)
    await server.fail(UUID(created["task_id"]), "boom: the disk is full")

    status = await dtq("watch", created["job_id"], "--interval", "50ms")
    view = capsys.readouterr().out
    assert await dtq("watch", created["job_id"], "--json") == 1
    final = json.loads(capsys.readouterr().out)

    assert status == 1
    assert "failed" in view and "boom: the disk is full" in view
    # Piped, the last line ends like any other (the shell prompt or the next command's
    # output was glued to the view's last row).
    assert view.endswith("\n")
    assert final["failures"][0]["error"] == "boom: the disk is full"


async def test_results_lists_every_task_result(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await dtq("submit", "echo", "--json") == 0
    created = json.loads(capsys.readouterr().out)
    await server.complete(UUID(created["task_id"]), {"words": 3})

    assert await dtq("results", created["job_id"], "--json") == 0
    results = json.loads(capsys.readouterr().out)
    assert await dtq("results", created["job_id"]) == 0
    table = capsys.readouterr().out

    assert results[0]["result"] == {"words": 3}
    assert '{"words":3}' in table


async def test_results_prints_null_for_a_null_result_and_nothing_for_an_unfinished_task(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"tasks": [{"name": "done", "kind": "echo"}, {"name": "later", "kind": "echo"}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(body))
    assert await dtq("job", "submit", str(path), "--json") == 0
    created = json.loads(capsys.readouterr().out)
    await server.complete(UUID(created["tasks"]["done"]), None)

    assert await dtq("results", created["job_id"]) == 0
    cells = [[c.strip() for c in line.split("│")] for line in capsys.readouterr().out.splitlines()]
    rows = {row[0]: row[1:] for row in cells}

    assert rows["done"] == [created["tasks"]["done"], "completed", "null"]
    assert rows["later"] == [created["tasks"]["later"], "queued", ""]  # no result yet: empty


async def listed_tasks(capsys: pytest.CaptureFixture[str]) -> list[Any]:
    """What ``dtq tasks list --json`` prints (it must exit 0)."""
    assert await dtq("tasks", "list", "--json") == 0
    listed: list[Any] = json.loads(capsys.readouterr().out)
    return listed


async def submit_given(
    monkeypatch: pytest.MonkeyPatch, given_as: str, option: str, variable: str, value: str
) -> int:
    """``dtq submit echo`` with ``value`` given as ``variable`` in the environment when
    ``given_as`` names it, else as ``option`` (the variable then unset)."""
    if given_as == variable:
        monkeypatch.setenv(variable, value)
        return await dtq("submit", "echo")
    monkeypatch.delenv(variable, raising=False)
    return await dtq("submit", "echo", option, value)


NO_JOB = "00000000-0000-4000-8000-000000000000"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "no spaces"], "dtq: validation_error: "),
        (["submit", "echo", "--payload", "{bad"], "dtq: --payload: not JSON"),
        (["submit", "echo", "--payload", "@/nonexistent/p.json"], "dtq: --payload: cannot read"),
        (["submit", "echo", "--delay", "soon"], "dtq: validation_error: "),
        (["submit", "echo", "--wait", "--timeout", "0s"], "dtq: --timeout: must be more than 0"),
        (["submit", "echo", "--wait", "--timeout", ""], "dtq: --timeout: not a duration"),
        (["watch", "not-a-uuid"], "dtq: validation_error: "),
        (["watch", NO_JOB], "dtq: job_not_found: "),
        (
            ["watch", NO_JOB, "--interval", "x"],
            "dtq: --interval: not a duration",
        ),
        (["job", "submit", "/nonexistent/job.json"], "dtq: /nonexistent/job.json: cannot read"),
    ],
)
async def test_bad_input_is_one_line_and_exit_2(
    server: Server, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status = await dtq(*argv)
    err = capsys.readouterr().err

    assert status == 2
    assert err.startswith(message)
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe{}", "dtq: --payload: cannot read"),  # not UTF-8: was a traceback
        (b"NaN", "dtq: --payload: not JSON: NaN"),  # was sent as a null payload
        (b'{"x": Infinity}', "dtq: --payload: not JSON: Infinity"),
    ],
)
async def test_a_payload_file_that_is_not_strict_json_is_one_line_and_exit_2(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    path = tmp_path / "payload.json"
    path.write_bytes(content)

    assert await dtq("submit", "echo", "--payload", f"@{path}") == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # each was a traceback (UnicodeEncodeError, RecursionError) or sent something else
        (["submit", "echo", "--payload", '{"a":"\\ud800"}'], "dtq: --payload: not JSON: a lone"),
        (["submit", "echo", "--payload", '{"a":1,"a":2}'], 'dtq: --payload: not JSON: key "a"'),
        (["submit", "echo", "--payload", "[1e999]"], "dtq: --payload: not JSON: 1e999"),
        (["submit", "echo", "--payload", ""], "dtq: --payload: not JSON"),
        (["submit", "echo", "--payload", "[" * 100_000], "dtq: --payload: not JSON: nested"),
        (["submit", "echo", "--idempotency-key", "caf\u00e9"], "dtq: --idempotency-key: "),
        (["submit", "echo", "--idempotency-key", "a\nb"], "dtq: --idempotency-key: "),
        (["submit", "echo", "--idempotency-key", "k" * 256], f"dtq: {KEY_LENGTH}, got 256\n"),
        (["submit", "echo", "--idempotency-key", ""], f"dtq: {KEY_LENGTH}, got 0\n"),
        (["submit", "echo", "--idempotency-key", "abc "], "dtq: --idempotency-key: no space at"),
        (["submit", "echo", "--idempotency-key", " abc"], "dtq: --idempotency-key: no space"),
        (["submit", "ec\udcffho"], "dtq: argument 2: not UTF-8"),
    ],
)
async def test_input_the_api_would_refuse_is_refused_by_the_cli_in_one_line(
    server: Server, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status = await dtq(*argv)
    err = capsys.readouterr().err

    assert (status, err[: len(message)]) == (2, message), err
    assert err.count("\n") == 1
    assert await listed_tasks(capsys) == []  # nothing was submitted


@pytest.mark.parametrize("command", [["submit", "echo"], ["job", "submit", "{job}"]])
async def test_a_timeout_without_wait_is_refused_in_one_line_before_anything_is_sent(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"tasks": [{"name": "a", "kind": "echo"}]}))

    status = await dtq(*(arg.format(job=job) for arg in command), "--timeout", "5m")
    err = capsys.readouterr().err

    assert (status, err) == (2, "dtq: --timeout: needs --wait (it is how long to wait)\n")
    assert await listed_tasks(capsys) == []  # nothing was submitted


@pytest.mark.parametrize("delay", [["--delay", "-1s"], ["--delay=-1s"]])
async def test_a_negative_delay_is_refused_in_one_line_however_it_is_spelt(
    server: Server, capsys: pytest.CaptureFixture[str], delay: list[str]
) -> None:
    status = await dtq("submit", "echo", *delay)
    err = capsys.readouterr().err

    assert (status, err) == (
        2,
        "dtq: validation_error: must be between 0s and 8784h, got '-1s' (field delay)\n",
    )
    assert await listed_tasks(capsys) == []  # nothing was submitted


async def test_option_values_starting_with_a_minus_and_a_digit_are_values(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    timeout = await dtq("submit", "echo", "--wait", "--timeout", "-5m")
    refused = capsys.readouterr().err
    submitted = await dtq("submit", "echo", "--payload", "-1.5e3", "--json")
    created = json.loads(capsys.readouterr().out)

    assert (timeout, refused) == (2, "dtq: --timeout: must be more than 0, got '-5m'\n")
    assert submitted == 0
    task = await server.services.api.queries.get_task(UUID(created["task_id"]))
    assert task.task.payload == -1500.0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[1, 2]", "must hold a JSON object"),
        (b"{bad", "not JSON"),
        (b"\xff{}", "cannot read: not UTF-8"),
    ],
)
async def test_a_bad_job_file_is_named_by_its_path(
    server: Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    message: str,
) -> None:
    path = tmp_path / "job.json"
    path.write_bytes(content)

    assert await dtq("job", "submit", str(path)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dtq: {path}: {message}"), err
    assert err.count("\n") == 1


@pytest.mark.parametrize("source", ["file", "stdin"])
async def test_a_job_the_api_refuses_is_named_by_its_file_in_one_line(
    server: Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
) -> None:
    content = json.dumps({"tasks": [{"name": "a", "kind": "no spaces"}]}).encode()
    path = tmp_path / "job.json"
    path.write_bytes(content)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(content)))
    named = str(path) if source == "file" else "stdin"

    status = await dtq("job", "submit", str(path) if source == "file" else "-")
    err = capsys.readouterr().err

    assert status == 2
    assert err.startswith(f"dtq: {named}: validation_error: "), err
    assert err.endswith(" (field tasks[0].kind)\n") and err.count("\n") == 1


async def test_a_refused_idempotency_key_of_a_job_file_is_not_blamed_on_the_file(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"tasks": [{"name": "a", "kind": "echo"}]}))

    status = await dtq("job", "submit", str(path), "--idempotency-key", "k" * 256)
    err = capsys.readouterr().err

    assert (status, err) == (2, f"dtq: {KEY_LENGTH}, got 256\n")
    assert await listed_tasks(capsys) == []  # nothing was submitted


async def test_a_255_character_printable_idempotency_key_is_sent(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    key = "A-z0~ !" + "k" * 248

    assert await dtq("submit", "echo", "--idempotency-key", key, "--json") == 0
    first = json.loads(capsys.readouterr().out)
    assert await dtq("submit", "echo", "--idempotency-key", key, "--json") == 0
    again = json.loads(capsys.readouterr().out)

    assert again["task_id"] == first["task_id"]  # the API saw the key


async def test_a_bad_job_on_stdin_is_named_stdin(
    server: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"{bad")))

    assert await dtq("job", "submit", "-") == 2
    assert capsys.readouterr().err.startswith("dtq: stdin: not JSON")


async def test_an_unreachable_orchestrator_is_one_line_naming_the_url_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = await dtq(
        "results", "00000000-0000-4000-8000-000000000000", "--url", "http://127.0.0.1:9"
    )

    assert status == 1
    err = capsys.readouterr().err
    assert err.startswith("dtq: cannot reach the orchestrator at http://127.0.0.1:9: GET "), err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "http://127.0.0.1:abc",
            "the port must be a number in 1..65535, got 'http://127.0.0.1:abc'",
        ),
        (
            "http://127.0.0.1:99999",
            "the port must be a number in 1..65535, got 'http://127.0.0.1:99999'",
        ),
        ("http://127.0.0.1:0", "the port must be a number in 1..65535, got 'http://127.0.0.1:0'"),
        ("http://[::1", "not a URL (Invalid IPv6 URL), got 'http://[::1'"),
        ("http://", "names no host, got 'http://'"),
        ("https:///v1", "names no host, got 'https:///v1'"),
        ("127.0.0.1:8080", "must start with http:// or https://, got '127.0.0.1:8080'"),
        (
            " http://127.0.0.1:8080",
            "must start with http:// or https://, got ' http://127.0.0.1:8080'",
        ),
    ],
)
@pytest.mark.parametrize("given_as", ["--url", "DTQ_URL"])
async def test_a_url_that_cannot_be_used_is_one_line_naming_the_setting_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    url: str,
    message: str,
    given_as: str,
) -> None:
    status = await submit_given(monkeypatch, given_as, "--url", "DTQ_URL", url)

    assert (status, capsys.readouterr().err) == (2, f"dtq: --url/DTQ_URL: {message}\n")


async def test_webhook_create_names_its_api_url_option_for_a_bad_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DTQ_URL", "http://")

    status = await dtq("webhook", "create", "--url", "http://hook", "--event", "job.completed")

    assert (status, capsys.readouterr().err) == (
        2,
        "dtq: --api-url/DTQ_URL: names no host, got 'http://'\n",
    )


async def test_an_empty_url_option_is_refused_but_an_empty_dtq_url_counts_as_unset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DTQ_URL", "")

    empty_option = await dtq("submit", "echo", "--url", "")
    refused = capsys.readouterr().err
    empty_variable = await dtq("tasks", "list", "--token", "x")
    unreachable = capsys.readouterr().err

    assert (empty_option, refused) == (2, "dtq: --url/DTQ_URL: must not be empty\n")
    # The default URL; nothing listens there in the tests (a failure here may mean something
    # does).
    assert empty_variable == 1
    assert unreachable.startswith("dtq: cannot reach the orchestrator at http://127.0.0.1:8080: ")


@pytest.mark.parametrize(
    "secret", ["dtq_SECRET\nx", "dtq_SECRET\x01x", "dtq_SECRET\u00e9", "dtq_SECRET x"]
)
@pytest.mark.parametrize("given_as", ["--token", "DTQ_TOKEN"])
async def test_a_token_http_cannot_carry_is_refused_locally_without_showing_it(
    server: Server,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    secret: str,
    given_as: str,
) -> None:
    status = await submit_given(monkeypatch, given_as, "--token", "DTQ_TOKEN", secret)
    err = capsys.readouterr().err
    monkeypatch.delenv("DTQ_TOKEN", raising=False)

    assert (status, err) == (
        2,
        "dtq: --token/DTQ_TOKEN: holds a character not allowed in a bearer token's HTTP header"
        " (printable ASCII without spaces only)\n",
    )
    assert await listed_tasks(capsys) == []  # nothing was submitted


async def test_an_empty_token_option_is_refused(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    status = await dtq("submit", "echo", "--token", "")

    assert (status, capsys.readouterr().err) == (2, "dtq: --token/DTQ_TOKEN: must not be empty\n")
    assert await listed_tasks(capsys) == []  # nothing was submitted


async def _first_queued(server: Server) -> UUID:
    """The first task submitted, taken off its ready list (waits up to 5 s for it)."""
    popped = await server.services.queue.pop_many(["default"], 5.0, 1)
    assert popped, "no task was submitted"
    return popped[0]


async def test_tasks_list_retry_cancel_and_explain(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await dtq("submit", "flaky", "--json") == 0
    created = json.loads(capsys.readouterr().out)
    task_id = created["task_id"]
    await server.fail(UUID(task_id), "boom: no route to host")

    assert await dtq("tasks", "list", "--status", "failed") == 0
    listed = capsys.readouterr().out
    assert await dtq("tasks", "list", "--status", "failed", "--kind", "flaky", "--json") == 0
    as_json = json.loads(capsys.readouterr().out)
    assert await dtq("explain", task_id) == 0
    explained = capsys.readouterr().out
    assert await dtq("retry", task_id, "--json") == 0
    retried = json.loads(capsys.readouterr().out)
    assert await dtq("retry", task_id) == 2
    refused = capsys.readouterr().err
    assert await dtq("cancel", created["job_id"], "--json") == 0
    cancelled = json.loads(capsys.readouterr().out)
    assert await dtq("cancel", task_id, "--task") == 0
    again = capsys.readouterr().out

    assert task_id in listed and "boom: no route to host" in listed
    assert [t["id"] for t in as_json] == [task_id]
    assert "terminal" in explained
    assert retried["status"] == "queued"
    assert refused.startswith("dtq: not_retryable: ")
    assert (cancelled["status"], cancelled["cancelled"]) == ("cancelled", 1)
    assert "cancelled" in again


async def test_explain_prints_the_reason_once_before_the_message(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await dtq("submit", "echo", "--delay", "1h", "--json") == 0
    task_id = json.loads(capsys.readouterr().out)["task_id"]

    assert await dtq("explain", task_id) == 0
    first = capsys.readouterr().out.splitlines()[0]

    # the message reads "scheduled: due at ...": its own label is not printed a second time
    assert first.startswith("scheduled (queued): due at "), first
    assert first.count("scheduled") == 1


async def test_explain_of_a_running_task_says_running_once(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """Status, code and message all start with "running": the line says it once."""
    assert await dtq("submit", "echo", "--json") == 0
    task_id = UUID(json.loads(capsys.readouterr().out)["task_id"])
    assert await _first_queued(server) == task_id
    claims = await server.services.worker.execution.claim_many([task_id], "w-client")
    assert len(claims) == 1

    assert await dtq("explain", str(task_id)) == 0
    first = capsys.readouterr().out.splitlines()[0]

    assert first.startswith("running: on worker w-client, lease until "), first
    assert first.count("running") == 1, first


async def test_field_value_tables_have_no_blank_header_and_nested_details_read_as_json(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await dtq("submit", "echo", "--max-attempts", "1", "--json") == 0
    task_id = json.loads(capsys.readouterr().out)["task_id"]
    await server.fail(UUID(task_id), "boom")

    assert await dtq("explain", task_id) == 0
    explained = capsys.readouterr().out
    assert await dtq("retry", task_id) == 0
    retried = capsys.readouterr().out

    # the last run is a JSON object, not a Python dict's repr
    assert '"status": "failed"' in explained and "'status'" not in explained, explained
    # a field/value table starts with its first field: no empty header and rule above it
    assert retried.splitlines()[0].split()[0] == "task_id", retried
    assert "━" not in retried, retried


async def test_a_401_without_a_token_says_how_to_give_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving(replace(SETTINGS, api_auth="tokens")) as running:
        monkeypatch.setenv("DTQ_URL", running.url)
        monkeypatch.delenv("DTQ_TOKEN", raising=False)
        without = await dtq("tasks", "list")
        told = capsys.readouterr().err
        wrong = await dtq("tasks", "list", "--token", "dtq_wrong")
        refused = capsys.readouterr().err

    assert (without, wrong) == (2, 2)
    assert told.startswith("dtq: unauthenticated: "), told
    assert told.endswith(" (no token was given: set DTQ_TOKEN or pass --token)\n"), told
    assert "DTQ_TOKEN" not in refused, refused  # a token was given: it was the wrong one


async def test_an_error_with_brackets_is_printed_as_it_is_not_as_markup(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """A handler's error text is data: ``[/tmp/x]`` (a closing tag to rich) and ``[bold]``
    reach the terminal as written, in ``dtq explain`` and in a table (``dtq tasks list``)."""
    assert await dtq("submit", "echo", "--max-attempts", "1", "--json") == 0
    created = json.loads(capsys.readouterr().out)
    error = "OSError: cannot open [/tmp/x] [bold]y"
    await server.fail(UUID(created["task_id"]), error)

    assert await dtq("explain", created["task_id"]) == 0
    explained = capsys.readouterr()
    assert error in " ".join(explained.out.split()), explained
    assert await dtq("tasks", "list", "--job", created["job_id"]) == 0
    listed = capsys.readouterr().out
    assert "[/tmp/x]" in listed and "[bold]" in listed, listed


async def test_tasks_list_refuses_an_unknown_status(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await dtq("tasks", "list", "--status", "broken") == 2
    assert capsys.readouterr().err.startswith("dtq: validation_error: ")


async def test_watch_follows_the_event_stream_instead_of_waiting_out_its_interval(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``--interval 1h`` only the job's event stream can make ``dtq watch`` look again
    before the test's timeout: it does, and the watch ends as soon as the task completed."""
    assert await dtq("submit", "echo", "--json") == 0
    created = json.loads(capsys.readouterr().out)
    server.services.api.events.policy = replace(server.services.api.events.policy, settle=0.01)
    watching = asyncio.ensure_future(dtq("watch", created["job_id"], "--interval", "1h", "--json"))
    await asyncio.sleep(0.3)
    await server.complete(UUID(created["task_id"]), None)

    async with asyncio.timeout(15):
        assert await watching == 0
    assert json.loads(capsys.readouterr().out)["status"] == "completed"
