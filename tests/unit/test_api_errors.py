"""The HTTP API's error paths: every 4xx names the field in one JSON shape; nothing is a 500
unless the server is at fault (spec §7, DESIGN §5)."""

from __future__ import annotations

import json
import logging
import re
import sys
import unicodedata
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.application.commands import TaskView
from dtq.application.queries import QueryService
from dtq.domain.errors import ConcurrentUpdate, DuplicateKind, InvalidTransition
from dtq.entrypoints.api.errors import status_for
from dtq.entrypoints.api.schemas import FORMAT_CHARACTERS, JOB_NAME_PATTERN
from tests.unit.api_harness import JSON, Api, asgi_post, running_api


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """Assert the status and the one error shape; return the inner ``error`` object."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "field"}
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


def task(name: str, *deps: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "echo", "depends_on": list(deps), **extra}


# --- DAG validation ---------------------------------------------------------------------------


async def test_cycle_is_a_400_naming_the_cycle_path(api: Api) -> None:
    body = {"tasks": [task("a", "c"), task("b", "a"), task("c", "b"), task("d")]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert error["code"] == "dependency_cycle"
    assert error["field"] == "tasks"
    # a depends on c, c on b, b on a: the arrows follow depends_on
    assert "a -> c -> b -> a" in error["message"]
    assert "depends on" in error["message"]


async def test_duplicate_task_names_are_a_400_naming_the_second_task(api: Api) -> None:
    body = {"tasks": [task("a"), task("b"), task("a")]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("duplicate_task_name", "tasks[2].name")


async def test_unknown_dependency_is_a_400_naming_the_entry(api: Api) -> None:
    body = {"tasks": [task("a"), task("b", "a", "zz")]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("unknown_dependency", "tasks[1].depends_on[1]")
    assert "'zz'" in error["message"]


async def test_self_dependency_is_a_400_naming_the_entry(api: Api) -> None:
    error = error_of(await api.client.post("/v1/jobs", json={"tasks": [task("a", "a")]}), 400)

    assert (error["code"], error["field"]) == ("self_dependency", "tasks[0].depends_on[0]")


async def test_duplicate_dependency_is_a_400_naming_the_field_and_the_id(api: Api) -> None:
    body = {"tasks": [task("a"), task("b", "a", "a")]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("duplicate_dependency", "tasks[1].depends_on[1]")
    assert "'a'" in error["message"]
    assert api.sample("orchestrator_jobs_submitted_total") == 0


async def test_rejected_job_writes_nothing(api: Api) -> None:
    await api.client.post("/v1/jobs", json={"tasks": [task("a", "b"), task("b", "a")]})

    assert api.queue.ready_ids("default") == []
    assert api.sample("orchestrator_jobs_submitted_total") == 0


# --- decoding: malformed JSON, wrong types, missing and unknown fields -----------------------


@pytest.mark.parametrize(
    "raw",
    [
        b'{"kind":',
        b"{'kind': 'echo'}",
        b'{"kind":"echo",}',
        b"\xff\xfe",
        b'{"kind":"echo","payload":NaN}',
        b'{"kind":"echo","payload":1e999}',
    ],
)
async def test_malformed_json_is_a_400_not_a_500(api: Api, raw: bytes) -> None:
    error = error_of(await api.client.post("/v1/tasks", content=raw, headers=JSON), 400)

    assert error["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("path", "raw", "field", "words"),
    [
        ("/v1/tasks", rb'{"kind":"x","payload":{"s":"\ud800"}}', "payload.s", "surrogate"),
        ("/v1/tasks", rb'{"kind":"x","payload":{"s":"ab\ud800cd"}}', "payload.s", "surrogate"),
        ("/v1/tasks", rb'{"kind":"x","payload":["ok","\udc00"]}', "payload[1]", "surrogate"),
        # in a key: the key's own path, the surrogate shown as its escape
        ("/v1/tasks", rb'{"kind":"x","payload":{"\ud800":1}}', "payload.\\ud800", "surrogate"),
        (
            "/v1/tasks",
            rb'{"kind":"x","payload":{"o":{"k\udc00":{"s":1}}}}',
            "payload.o.k\\udc00",
            "surrogate",
        ),
        (
            "/v1/jobs",
            rb'{"tasks":[{"name":"a","kind":"x"}],"metadata":{"ok":1,"\ud800x":2}}',
            "metadata.\\ud800x",
            "surrogate",
        ),
        (
            "/v1/jobs",
            rb'{"tasks":[{"name":"a","kind":"x","payload":"\ud800"}]}',
            "tasks[0].payload",
            "surrogate",
        ),
        # a repeated key does not hide the string
        ("/v1/tasks", rb'{"kind":"x","payload":{"a":"\ud800","a":1}}', "payload.a", "surrogate"),
        ("/v1/tasks", b'{"kind":"x","payload":{"x":1e999}}', "payload.x", "out of range"),
        ("/v1/tasks", b'{"kind":"x","payload":-1e999}', "payload", "out of range"),
        ("/v1/tasks", b'{"kind":"x","max_attempts":1e999}', "max_attempts", "out of range"),
        (
            "/v1/jobs",
            b'{"tasks":[{"name":"a","kind":"x","payload":{"x":[1,-2.5E400]}}]}',
            "tasks[0].payload.x[1]",
            "out of range",
        ),
        (
            "/v1/jobs",
            b'{"tasks":[{"name":"a","kind":"x"}],"metadata":{"m":1e999}}',
            "metadata.m",
            "out of range",
        ),
        # a repeated key must not hide the value, and the first value at fault is named
        ("/v1/tasks", b'{"kind":"x","payload":{"x":1e999,"x":1}}', "payload.x", "out of range"),
        ("/v1/tasks", b'{"kind":"x","payload":{"a":1e999,"b":NaN}}', "payload.a", "out of range"),
        # NaN and the infinities are not JSON: named by their path, as 1e999 is
        ("/v1/tasks", b'{"kind":"x","payload":{"x":NaN}}', "payload.x", "NaN is not a JSON"),
        ("/v1/tasks", b'{"kind":"x","payload":[1,-Infinity]}', "payload[1]", "-Infinity is not"),
        (
            "/v1/jobs",
            b'{"tasks":[{"name":"a","kind":"x","payload":{"p":Infinity}}]}',
            "tasks[0].payload.p",
            "Infinity is not a JSON",
        ),
        (
            "/v1/tasks",
            b'{"kind":"x","payload":{"a":1,"b":[2,1e999],"c":1e999}}',
            "payload.b[1]",
            "out of range",
        ),
    ],
)
async def test_a_value_msgspec_reports_vaguely_is_named(
    api: Api, path: str, raw: bytes, field: str, words: str
) -> None:
    """A lone surrogate escape (msgspec: "truncated") or a number beyond a float (msgspec:
    "Number out of range" at `$[...]`) is named by its path and called what it is."""
    status, answer = await asgi_post(api, path, [(b"content-type", b"application/json")], raw)

    assert status == 400, answer
    error = json.loads(answer)["error"]
    assert (error["code"], error["field"]) == ("invalid_json", field)
    assert words in error["message"]
    assert "truncated" not in error["message"]
    assert "$" not in error["message"]
    assert api.sample("orchestrator_jobs_submitted_total") == 0


TRUNCATED = "request body is not valid JSON: it ends before the JSON value is complete"
NOT_UTF8 = (
    "request body is not valid JSON: a string holds bytes that are not UTF-8"
    " (JSON text must be UTF-8)"
)


@pytest.mark.parametrize(
    ("path", "raw", "message"),
    [
        ("/v1/tasks", b'{"kind":"echo","payl', TRUNCATED),
        ("/v1/tasks", b'{"kind":"echo","payload":[1,', TRUNCATED),
        ("/v1/jobs", b'{"tasks":[{"name":"a","kind":"echo"}', TRUNCATED),
        ("/v1/tasks", b'{"kind":"ech\xff"}', NOT_UTF8),
        ("/v1/tasks", b'{"kind":"echo","payload":{"k\xc3":1}}', NOT_UTF8),
        ("/v1/jobs", b'{"tasks":[{"name":"a","kind":"echo","payload":"\xed\xa0\x80"}]}', NOT_UTF8),
    ],
)
async def test_a_truncated_or_non_utf8_body_is_refused_in_the_apis_words(
    api: Api, path: str, raw: bytes, message: str
) -> None:
    error = error_of(await api.client.post(path, content=raw, headers=JSON), 400)

    assert (error["code"], error["field"], error["message"]) == ("invalid_json", None, message)


async def test_a_surrogate_pair_escape_is_accepted(api: Api) -> None:
    raw = rb'{"kind":"x","payload":{"s":"\ud83d\ude00"}}'

    status, answer = await asgi_post(
        api, "/v1/tasks", [(b"content-type", b"application/json")], raw
    )

    assert status == 201, answer


@pytest.mark.parametrize("body", [b"", b"  \r\n"])
async def test_empty_body_is_a_400_that_asks_for_one(api: Api, body: bytes) -> None:
    error = error_of(await api.client.post("/v1/tasks", content=body, headers=JSON), 400)

    assert error["field"] is None
    assert error["message"] == "a JSON request body is required (the body is empty)"


async def test_a_byte_order_mark_is_named(api: Api) -> None:
    raw = b'\xef\xbb\xbf{"kind":"echo"}'
    error = error_of(await api.client.post("/v1/tasks", content=raw, headers=JSON), 400)

    assert (error["code"], error["field"]) == ("invalid_json", None)
    assert "byte order mark" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "field", "message"),
    [
        (
            "/v1/worker/results",
            {"reports": [{"run_id": "x"}]},
            "reports[0].run_id",
            "must be a UUID",
        ),
        ("/v1/tasks", {"kind": "echo", "run_at": 5}, "run_at", "must be a string, got an integer"),
    ],
)
async def test_a_uuid_or_time_field_is_explained_in_words(
    api: Api, path: str, body: dict[str, Any], field: str, message: str
) -> None:
    response = await api.client.post(path, json=body, headers={"X-Worker-Id": "w1"})

    error = error_of(response, 400)
    assert (error["field"], error["message"]) == (field, message)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/tasks", {"kind": 5}, "kind"),
        ("/v1/tasks", {"kind": "echo", "max_attempts": "three"}, "max_attempts"),
        ("/v1/tasks", {"kind": "echo", "max_attempts": True}, "max_attempts"),
        ("/v1/tasks", {"kind": "echo", "max_attempts": 3.5}, "max_attempts"),
        # msgspec's lax mode (Litestar's) would coerce these; the API documents integers
        ("/v1/tasks", {"kind": "echo", "max_attempts": "3"}, "max_attempts"),
        ("/v1/tasks", {"kind": "echo", "max_attempts": 3.0}, "max_attempts"),
        (
            "/v1/jobs",
            {"tasks": [task("a"), {**task("b"), "max_attempts": "7"}]},
            "tasks[1].max_attempts",
        ),
        ("/v1/tasks", ["echo"], None),
        ("/v1/jobs", {"tasks": {"a": {}}}, "tasks"),
        ("/v1/jobs", {"tasks": [{"name": "a", "kind": 1}]}, "tasks[0].kind"),
        (
            "/v1/jobs",
            {"tasks": [task("a"), {"name": "b", "kind": "k", "depends_on": "a"}]},
            "tasks[1].depends_on",
        ),
        ("/v1/jobs", {"tasks": [task("a")], "metadata": [1]}, "metadata"),
        ("/v1/jobs", {"tasks": [task("a")], "name": 7}, "name"),
    ],
)
async def test_wrong_types_are_a_400_naming_the_field(
    api: Api, path: str, body: Any, field: str | None
) -> None:
    error = error_of(await api.client.post(path, json=body), 400)

    assert (error["code"], error["field"]) == ("validation_error", field)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/tasks", {"payload": 1}, "kind"),
        ("/v1/jobs", {}, "tasks"),
        ("/v1/jobs", {"tasks": [{"kind": "k"}]}, "tasks[0].name"),
        ("/v1/jobs", {"tasks": [task("a"), {"name": "b"}]}, "tasks[1].kind"),
    ],
)
async def test_missing_fields_are_a_400_naming_the_field(
    api: Api, path: str, body: Any, field: str
) -> None:
    error = error_of(await api.client.post(path, json=body), 400)

    assert error["field"] == field
    assert "missing" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "field", "message"),
    [
        ("/v1/tasks", {"kind": ""}, "kind", "must be a non-empty string"),
        ("/v1/jobs", {"tasks": [task("")]}, "tasks[0].name", "must be a non-empty string"),
        ("/v1/tasks", {"kind": "k" * 201}, "kind", "must be at most 200 characters long"),
        (
            "/v1/tasks",
            {"kind": "k", "delay": "1" * 65},
            "delay",
            "must be at most 64 characters long",
        ),
        ("/v1/jobs", {"tasks": []}, "tasks", "must be a non-empty array"),
        ("/v1/tasks", {"kind": "k", "max_attempts": 0}, "max_attempts", "must be at least 1"),
        ("/v1/tasks", {"kind": "k", "max_attempts": 101}, "max_attempts", "must be at most 100"),
        (
            "/v1/tasks",
            {"kind": "k", "max_attempts": "3"},
            "max_attempts",
            "must be an integer, got a string",
        ),
        (
            "/v1/tasks",
            {"kind": "k", "retry": {"jitter": 1}},
            "retry.jitter",
            "must be a boolean, got an integer",
        ),
        ("/v1/tasks", ["k"], None, "the request body must be an object, got an array"),
        (
            "/v1/tasks",
            {"kind": "k", "priority": "HIGH"},
            "priority",
            "must be a string with 1 to 32 characters of a-z, 0-9, '_' or '-'",
        ),
        (
            "/v1/tasks",
            {"kind": "k", "retry": {"backoff": "linear"}},
            "retry.backoff",
            "must be 'exponential' or 'fixed', got 'linear'",
        ),
        (
            "/v1/jobs",
            {"tasks": [{**task("a"), "retry": {"backoff": "linear"}}]},
            "tasks[0].retry.backoff",
            "must be 'exponential' or 'fixed', got 'linear'",
        ),
        ("/v1/tasks", {"payload": 1}, "kind", "required field 'kind' is missing"),
        (
            "/v1/tasks",
            {"kind": "k", "retry": {"delay": "1s", "jiter": True}},
            "retry.jiter",
            "unknown field 'jiter'; accepted: backoff, delay, max_delay, jitter",
        ),
        (
            "/v1/tasks/cancel",
            {"status": 5},
            "status",
            "must be a string, an array or null, got an integer",
        ),
        ("/v1/tasks/cancel", {"dry_run": 1}, "dry_run", "must be a boolean, got an integer"),
    ],
)
async def test_decoding_errors_are_in_the_apis_words(
    api: Api, path: str, body: Any, field: str | None, message: str
) -> None:
    error = error_of(await api.client.post(path, json=body), 400)

    assert (error["code"], error["field"], error["message"]) == (
        "validation_error",
        field,
        message,
    )
    assert api.sample("orchestrator_jobs_submitted_total") == 0


async def test_a_header_out_of_range_is_in_the_apis_words(api: Api) -> None:
    headers = {**JSON, "Idempotency-Key": "k" * 256}

    error = error_of(await api.client.post("/v1/tasks", json={"kind": "k"}, headers=headers), 400)

    assert (error["field"], error["message"]) == (
        "Idempotency-Key",
        "must be at most 255 characters long",
    )


async def test_unknown_fields_are_refused_so_typos_do_not_drop_dependencies(api: Api) -> None:
    body = {"tasks": [task("a"), {"name": "b", "kind": "k", "depend_on": ["a"]}]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert error["field"] == "tasks[1].depend_on"


# --- identifier rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": ""}, "kind"),
        ({"kind": "has space"}, "kind"),
        ({"kind": "echo\n"}, "kind"),
        ({"kind": "k" * 201}, "kind"),
        ({"kind": "é"}, "kind"),
        ({"kind": "nul\u0000"}, "kind"),
        ({"kind": "echo", "priority": "HIGH"}, "priority"),
        ({"kind": "echo", "priority": ""}, "priority"),
        ({"kind": "echo", "priority": "p" * 33}, "priority"),
        ({"kind": "echo", "max_attempts": 0}, "max_attempts"),
        ({"kind": "echo", "max_attempts": 101}, "max_attempts"),
        ({"kind": "echo", "max_attempts": 2**70}, "max_attempts"),
    ],
)
async def test_task_identifiers_and_options_are_validated(
    api: Api, body: dict[str, Any], field: str
) -> None:
    error = error_of(await api.client.post("/v1/tasks", json=body), 400)

    assert error["field"] == field


async def test_kind_of_200_characters_is_accepted(api: Api) -> None:
    response = await api.client.post("/v1/tasks", json={"kind": "k" * 200})

    assert response.status_code == 201


@pytest.mark.parametrize("name", ["", "a b", "x" * 201, "tab\t"])
async def test_task_names_follow_the_kind_rules(api: Api, name: str) -> None:
    error = error_of(await api.client.post("/v1/jobs", json={"tasks": [task(name)]}), 400)

    assert error["field"] == "tasks[0].name"


@pytest.mark.parametrize(
    "name",
    # every Unicode control character (category Cc): C0, DEL and C1 (NEL, CSI a terminal obeys)
    ["nightly\u0000", "a\u001b[31mRED", "del\u007f", "a\u0080b", "a\u0085b", "a\u009b31mRED"],
)
async def test_job_name_refuses_control_characters(api: Api, name: str) -> None:
    body = {"name": name, "tasks": [task("a")]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert error["field"] == "name"
    assert "control characters" in error["message"]


def test_the_control_rule_refuses_every_control_character_and_nothing_else() -> None:
    every = "".join(map(chr, range(0x250)))
    refused = {c for c in every if not re.match(JOB_NAME_PATTERN, f"a{c}b")}

    assert refused == {c for c in every if unicodedata.category(c) == "Cc"}


@pytest.mark.parametrize(
    "name",
    # a line or paragraph separator, a right-to-left override and an isolate inside a name
    ["a\u2028b", "a\u2029b", "abc\u202edcba", "a\u2067b\u2069"],
)
async def test_job_name_refuses_line_separators_and_bidirectional_overrides(
    api: Api, name: str
) -> None:
    body = {"name": name, "tasks": [task("a")]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("validation_error", "name")


@pytest.mark.parametrize(
    "name",
    [
        " ",
        "   ",
        "\u00a0",
        " \u3000 ",
        # invisible format characters (Unicode category Cf) are as blank as spaces
        "\u200b",
        "\u2060",
        "\ufeff",
        " \u200b\u00ad ",
        "\U000e0041\U000e007f",
    ],
)
async def test_a_blank_job_name_is_refused(api: Api, name: str) -> None:
    body = {"name": name, "tasks": [task("a")]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("validation_error", "name")
    assert "blank" in error["message"]
    assert api.sample("orchestrator_jobs_submitted_total") == 0


def _listed_and_format_characters() -> tuple[set[str], set[str]]:
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    listed = set(re.findall(f"[{FORMAT_CHARACTERS}]", every))
    return listed, {c for c in every if unicodedata.category(c) == "Cf"}


def test_the_blank_rule_lists_format_characters_only() -> None:
    listed, format_characters = _listed_and_format_characters()

    assert listed <= format_characters


@pytest.mark.skipif(
    unicodedata.unidata_version != "14.0.0",
    reason="FORMAT_CHARACTERS is Unicode 14.0's Cf (Python 3.11); a later Unicode adds some",
)
def test_the_blank_rule_lists_every_format_character_of_unicode_14() -> None:
    listed, format_characters = _listed_and_format_characters()

    assert listed == format_characters


@pytest.mark.parametrize("name", ["", "nightly report", " padded ", "a\u200bb", "\u200dx"])
async def test_an_empty_or_spaced_job_name_is_accepted(api: Api, name: str) -> None:
    body = {"name": name, "tasks": [task("a")]}

    response = await api.client.post("/v1/jobs", json=body)

    assert response.status_code == 201, response.text
    job = (await api.client.get(f"/v1/jobs/{response.json()['job_id']}")).json()
    assert job["name"] == name


# --- payloads: NUL, int64, nesting, size ------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"msg": "hi\u0000"}, "payload.msg"),
        # in a key: the key's own path, the NUL shown as its escape
        ({"k\u0000ey": 1}, "payload.k\\u0000ey"),
        ({"o": {"\u0000": {"s": 1}}}, "payload.o.\\u0000"),
        (["ok", ["\u0000"]], "payload[1][0]"),
        (2**63, "payload"),
        ({"n": -(2**63) - 1}, "payload.n"),
    ],
)
async def test_unstorable_task_payload_is_a_400_naming_the_field(
    api: Api, payload: Any, field: str
) -> None:
    error = error_of(
        await api.client.post("/v1/tasks", json={"kind": "k", "payload": payload}), 400
    )

    assert (error["code"], error["field"]) == ("invalid_payload", field)


async def test_int64_bounds_themselves_are_accepted(api: Api) -> None:
    payload = [2**63 - 1, -(2**63)]

    response = await api.client.post("/v1/tasks", json={"kind": "k", "payload": payload})

    assert response.status_code == 201


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"s": "\u0000"}, "tasks[1].payload.s"),
        ({"\u0000": 1}, "tasks[1].payload.\\u0000"),
        (2**64, "tasks[1].payload"),
    ],
)
async def test_unstorable_job_payload_names_the_task(api: Api, payload: Any, field: str) -> None:
    body = {"tasks": [task("a"), task("b", payload=payload)]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("invalid_payload", field)


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"owner": "x\u0000"}, "metadata.owner"),
        ({"n": [2**63]}, "metadata.n[0]"),
        ({"k\u0000": 1}, "metadata.k\\u0000"),
    ],
)
async def test_unstorable_job_metadata_is_invalid_metadata(
    api: Api, metadata: dict[str, Any], field: str
) -> None:
    body = {"tasks": [task("a")], "metadata": metadata}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("invalid_metadata", field)
    assert api.sample("orchestrator_jobs_submitted_total") == 0


async def test_escaped_nul_in_raw_json_is_refused_too(api: Api) -> None:
    raw = b'{"kind":"k","payload":{"a":"\\u0000"}}'

    error = error_of(await api.client.post("/v1/tasks", content=raw, headers=JSON), 400)

    assert error["field"] == "payload.a"


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def test_payload_nested_far_deeper_than_64_levels_is_a_400(api: Api) -> None:
    raw = b'{"kind":"k","payload":' + nested(100) + b"}"

    error = error_of(await api.client.post("/v1/tasks", content=raw, headers=JSON), 400)

    assert error["code"] == "invalid_payload"
    assert error["field"].startswith("payload[0]")


async def test_payload_nested_64_levels_is_accepted(api: Api) -> None:
    raw = b'{"kind":"k","payload":' + nested(64) + b"}"

    response = await api.client.post("/v1/tasks", content=raw, headers=JSON)

    assert response.status_code == 201


async def test_body_nested_beyond_the_decoders_recursion_limit_is_a_400(api: Api) -> None:
    raw = b'{"kind":"k","payload":' + nested(20_000) + b"}"

    error = error_of(await api.client.post("/v1/tasks", content=raw, headers=JSON), 400)

    assert error["code"] == "invalid_json"


async def test_oversized_task_payload_is_a_400_naming_it(api: Api) -> None:
    payload = {"blob": "x" * 2000}  # limit: 1024 bytes encoded

    error = error_of(
        await api.client.post("/v1/tasks", json={"kind": "k", "payload": payload}), 400
    )

    assert (error["code"], error["field"]) == ("invalid_payload", "payload")
    # the limit is named by the setting that raises it
    assert error["message"].endswith("the limit is 1024 (API_MAX_PAYLOAD_BYTES)"), error


async def test_too_many_tasks_names_the_limit_and_its_setting(api: Api) -> None:
    body = {"tasks": [task(f"t{i}") for i in range(21)]}  # limit: 20 tasks

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("validation_error", "tasks")
    assert error["message"] == "a job has at most 20 tasks (API_MAX_TASKS_PER_JOB), got 21"


async def test_oversized_payload_in_a_job_names_the_task(api: Api) -> None:
    body = {"tasks": [task("a"), task("b", payload="y" * 2000)]}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("invalid_payload", "tasks[1].payload")


async def test_oversized_metadata_is_a_400(api: Api) -> None:
    body = {"tasks": [task("a")], "metadata": {"blob": "z" * 2000}}

    error = error_of(await api.client.post("/v1/jobs", json=body), 400)

    assert (error["code"], error["field"]) == ("invalid_metadata", "metadata")


# --- limits on the request as a whole ---------------------------------------------------------


async def test_more_tasks_than_the_limit_is_a_400_on_tasks(api: Api) -> None:
    tasks = [task(f"t{i}") for i in range(21)]  # limit: 20

    error = error_of(await api.client.post("/v1/jobs", json={"tasks": tasks}), 400)

    assert error["field"] == "tasks"
    assert "20" in error["message"]


async def test_a_job_without_tasks_is_a_400(api: Api) -> None:
    error = error_of(await api.client.post("/v1/jobs", json={"tasks": []}), 400)

    assert error["field"] == "tasks"


@pytest.mark.parametrize("content_length", [True, False])
async def test_body_larger_than_the_limit_is_a_413_that_states_the_limit(
    api: Api, content_length: bool
) -> None:
    raw = b'{"kind":"k","payload":"' + b"x" * (64 * 1024) + b'"}'
    json_type = [(b"content-type", b"application/json")]

    status, answer = await asgi_post(
        api, "/v1/tasks", json_type, raw, content_length=content_length
    )

    assert status == 413
    error = json.loads(answer)["error"]
    assert error["code"] == "request_too_large"
    assert error["message"] == "request body larger than API_MAX_BODY_BYTES (65536 bytes)"


# --- Idempotency-Key header -------------------------------------------------------------------


@pytest.mark.parametrize("key", ["k" * 256, "tab\tkey"])
async def test_invalid_idempotency_keys_are_a_400_naming_the_header(api: Api, key: str) -> None:
    response = await api.client.post(
        "/v1/tasks", json={"kind": "k"}, headers={"Idempotency-Key": key}
    )

    error = error_of(response, 400)
    assert error["field"] == "Idempotency-Key"
    assert "\\" not in error["message"]  # said in words, not as msgspec's quoted pattern


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/tasks", b'{"kind": "k"}'), ("/v1/jobs", b'{"tasks": [{"name": "a", "kind": "k"}]}')],
)
async def test_a_repeated_idempotency_key_is_a_400_and_stores_nothing(
    api: Api, path: str, body: bytes
) -> None:
    json_type = (b"content-type", b"application/json")
    twice = [json_type, (b"idempotency-key", b"a"), (b"idempotency-key", b"b")]

    status, answer = await asgi_post(api, path, twice, body)  # the test client would merge them

    assert status == 400
    error = json.loads(answer)["error"]
    assert (error["code"], error["field"]) == ("validation_error", "Idempotency-Key")
    assert error["message"] == "Idempotency-Key given more than once"
    again = await api.client.post(path, content=body, headers={**JSON, "Idempotency-Key": "a"})
    assert again.status_code == 201  # a new job: the refused request stored nothing under "a"


async def test_a_255_character_printable_key_is_accepted(api: Api) -> None:
    key = "A-z0~ !" + "k" * 248

    response = await api.client.post(
        "/v1/tasks", json={"kind": "k"}, headers={"Idempotency-Key": key}
    )

    assert response.status_code == 201


# --- ids, routes, methods ---------------------------------------------------------------------


@pytest.mark.parametrize("resource", ["tasks", "jobs"])
@pytest.mark.parametrize("bad_id", ["nope", "123", "00000000-0000-0000-0000-00000000000g", "%00"])
async def test_malformed_id_is_a_400_naming_id(api: Api, resource: str, bad_id: str) -> None:
    error = error_of(await api.client.get(f"/v1/{resource}/{bad_id}"), 400)

    assert (error["code"], error["field"]) == ("validation_error", "id")


async def test_unknown_task_is_a_404(api: Api) -> None:
    error = error_of(await api.client.get(f"/v1/tasks/{uuid4()}"), 404)

    assert (error["code"], error["field"]) == ("task_not_found", "id")


async def test_unknown_job_is_a_404(api: Api) -> None:
    error = error_of(await api.client.get(f"/v1/jobs/{uuid4()}"), 404)

    assert error["code"] == "job_not_found"


async def test_a_task_id_is_not_a_job_id(api: Api) -> None:
    created = await api.client.post("/v1/tasks", json={"kind": "k"})

    response = await api.client.get(f"/v1/jobs/{created.json()['task_id']}")

    assert response.status_code == 404


async def test_unknown_route_is_a_404_in_the_error_shape(api: Api) -> None:
    error = error_of(await api.client.get("/v2/tasks"), 404)

    assert error["code"] == "route_not_found"
    assert error["message"] == "no route GET /v2/tasks"


async def test_wrong_method_is_a_405_with_allow(api: Api) -> None:
    task_id = uuid4()
    response = await api.client.delete(f"/v1/tasks/{task_id}")

    error = error_of(response, 405)
    assert error["code"] == "method_not_allowed"
    assert "GET" in response.headers["allow"]
    assert error["message"] == (
        f"DELETE is not allowed on /v1/tasks/{task_id} (allowed: {response.headers['allow']})"
    )


# --- server-side failures ---------------------------------------------------------------------


class ExplodingQueries(QueryService):
    """A query service with a bug in it."""

    async def get_task(self, task_id: UUID) -> TaskView:
        raise RuntimeError("secret internal detail")


async def test_unexpected_exception_is_a_generic_500_with_the_traceback_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queries = ExplodingQueries(store=InMemoryStore(FakeClock()))
    async with running_api(queries=queries) as api:
        with caplog.at_level(logging.INFO, logger="dtq.api"):
            response = await api.client.get(f"/v1/tasks/{uuid4()}")

    error = error_of(response, 500)
    assert error["code"] == "internal_error"
    assert "secret" not in response.text
    [record] = [r for r in caplog.records if r.name == "dtq.api"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    labels = {"method": "GET", "route": "/v1/tasks/{id}", "status": "500"}
    assert api.sample("orchestrator_http_requests_total", labels) == 1


async def test_client_errors_are_logged_without_traceback(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="dtq.api"):
        await api.client.get(f"/v1/tasks/{uuid4()}")
        await api.client.post("/v1/tasks", content=b"{", headers=JSON)

    records = [r for r in caplog.records if r.name == "dtq.api"]
    assert len(records) == 2
    assert all(r.exc_info is None and r.levelno < logging.WARNING for r in records)


async def test_backend_down_is_a_503(api: Api) -> None:
    api.store.available = False

    error = error_of(await api.client.post("/v1/tasks", json={"kind": "k"}), 503)

    assert error["code"] == "backend_unavailable"


def test_error_table_maps_families_and_defaults_to_500() -> None:
    assert status_for(InvalidTransition()) == 409
    assert status_for(ConcurrentUpdate()) == 503
    assert status_for(DuplicateKind()) == 500


# --- duplicate keys and out-of-range durations (issue 12) ---------------------------------------


@pytest.mark.parametrize(
    ("path", "raw", "field"),
    [
        ("/v1/tasks", '{"kind":"a","kind":"b"}', "kind"),
        ("/v1/tasks", '{"kind":"a","payload":{"x":1,"y":2,"x":3}}', "payload.x"),
        ("/v1/jobs", '{"tasks":[{"name":"a","kind":"k","name":"b"}]}', "tasks[0].name"),
    ],
)
async def test_duplicate_json_keys_are_a_400_naming_the_key(
    api: Api, path: str, raw: str, field: str
) -> None:
    error = error_of(await api.client.post(path, content=raw, headers=JSON), 400)

    assert (error["code"], error["field"]) == ("invalid_json", field)
    assert "duplicate" in error["message"]
    assert api.queue.ready_ids("default") == []


async def test_the_same_key_in_sibling_objects_is_not_a_duplicate(api: Api) -> None:
    raw = '{"tasks":[{"name":"a","kind":"k"},{"name":"b","kind":"k","depends_on":["a"]}]}'

    response = await api.client.post("/v1/jobs", content=raw, headers=JSON)

    assert response.status_code == 201, response.text


@pytest.mark.parametrize("window", ["999999999h", "2562048h", "9999999999999999h"])
async def test_active_since_beyond_the_longest_window_is_a_400(api: Api, window: str) -> None:
    response = await api.client.get("/v1/workers", params={"active_since": window})

    error = error_of(response, 400)
    assert (error["code"], error["field"]) == ("validation_error", "active_since")
    assert "2562047h47m16s" in error["message"]


async def test_a_repeated_key_under_an_unknown_tasks_field_of_a_single_task_is_named_in_full(
    api: Api,
) -> None:
    raw = '{"kind":"k","tasks":[{"a":1,"a":2}]}'

    error = error_of(await api.client.post("/v1/tasks", content=raw, headers=JSON), 400)

    assert error["field"] == "tasks"


async def test_a_query_parameter_on_a_route_that_takes_none_says_so(api: Api) -> None:
    response = await api.client.get(f"/v1/tasks/{uuid4()}", params={"x": "1"})

    error = error_of(response, 400)
    assert error["field"] == "x"
    assert error["message"] == "unknown query parameter 'x'; this route takes none"


async def test_an_unknown_query_parameter_lists_the_accepted_ones(api: Api) -> None:
    response = await api.client.get("/v1/tasks", params={"limt": "1"})

    error = error_of(response, 400)
    assert error["field"] == "limt"
    assert error["message"].startswith("unknown query parameter 'limt'; accepted: ")
    assert "limit" in error["message"].split("accepted: ")[1].split(", ")


@pytest.mark.parametrize(
    ("method", "route"),
    [
        ("GET", "/v1/webhooks"),
        ("GET", "/v1/webhooks/{id}/deliveries"),
        ("DELETE", "/v1/webhooks/{id}"),
        ("GET", "/v1/operations/{id}"),
    ],
)
async def test_a_route_that_takes_no_query_parameter_refuses_one(
    api: Api, method: str, route: str
) -> None:
    """As every read does: ``?x=1`` is a 400 naming it, before the id is looked up."""
    response = await api.client.request(method, route.format(id=uuid4()) + "?x=1")

    error = error_of(response, 400)
    assert (error["code"], error["field"]) == ("validation_error", "x")
