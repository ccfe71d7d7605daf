"""The ``POST /v1/tasks`` fast path (issue 17 item 3): it serves plain requests itself with the
route's answers, and hands everything else, body replayed, to Litestar's route."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from dtq.domain.errors import BackendUnavailable
from dtq.domain.tokens import Scope
from dtq.entrypoints.api.fast_submit import SubmitFastPath
from tests.unit.api_harness import JSON, SETTINGS, Api, asgi_post, http_scope, running_api


class RouterCalls:
    """Wraps the fast path's router and counts the requests handed to it."""

    def __init__(self, fast: SubmitFastPath) -> None:
        self.count = 0
        self._router = fast._router
        fast._router = self

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.count += 1
        await self._router(scope, receive, send)


def fast_path(api: Api) -> SubmitFastPath:
    """The fast path inside the app's handler chain (metrics, body guard, exception handler)."""
    layer: Any = api.app.asgi_handler
    while not isinstance(layer, SubmitFastPath):
        layer = getattr(layer, "_app", None) or layer.app
    return layer


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        yield running


@pytest.fixture
def router(api: Api) -> RouterCalls:
    return RouterCalls(fast_path(api))


async def test_a_plain_submit_is_served_without_the_router_and_writes_the_task(
    api: Api, router: RouterCalls
) -> None:
    response = await api.client.post(
        "/v1/tasks", json={"kind": "echo", "payload": {"n": 1}, "priority": "high"}
    )

    assert response.status_code == 201, response.text
    assert response.headers["content-type"] == "application/json"
    assert router.count == 0
    body = response.json()
    detail = await api.client.get(f"/v1/tasks/{body['task_id']}")
    assert detail.status_code == 200
    assert detail.json()["job_id"] == body["job_id"]
    assert detail.json()["kind"] == "echo"
    assert detail.json()["payload"] == {"n": 1}
    assert detail.json()["priority"] == "high"
    assert api.sample("orchestrator_jobs_submitted_total") == 1
    assert (
        api.sample(
            "orchestrator_http_requests_total",
            {"method": "POST", "route": "/v1/tasks", "status": "201"},
        )
        == 1
    )


async def test_the_fast_path_answers_as_the_route_does(api: Api, router: RouterCalls) -> None:
    document = {"kind": "echo", "payload": [1, "two"], "max_attempts": 5, "delay": "1m"}

    fast = await api.client.post("/v1/tasks", json=document)
    routed = await api.client.post("/v1/tasks/", json=document)  # the router's own spelling

    assert router.count == 1
    assert fast.status_code == routed.status_code == 201
    assert fast.headers["content-type"] == routed.headers["content-type"]
    fast_body, routed_body = fast.json(), routed.json()
    assert set(fast_body) == set(routed_body) == {"task_id", "job_id", "warnings"}
    assert fast_body["warnings"] == routed_body["warnings"]


async def test_a_replayed_idempotency_key_answers_200_with_the_original_ids(
    api: Api, router: RouterCalls
) -> None:
    headers = {**JSON, "Idempotency-Key": "order-17"}
    body = json.dumps({"kind": "echo", "payload": {"n": 1}})

    first = await api.client.post("/v1/tasks", content=body, headers=headers)
    again = await api.client.post("/v1/tasks", content=body, headers=headers)
    other = await api.client.post(
        "/v1/tasks", content=json.dumps({"kind": "echo"}), headers=headers
    )

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_conflict"
    assert router.count == 0
    assert api.sample("orchestrator_jobs_submitted_total") == 1


@pytest.mark.parametrize(
    ("content", "headers", "status", "code", "field"),
    [
        ("{not json", JSON, 400, "invalid_json", None),
        ('{"kind": "echo", "colour": 1}', JSON, 400, "validation_error", "colour"),
        ('{"kind": 7}', JSON, 400, "validation_error", "kind"),
        ('{"kind": "echo", "kind": "other"}', JSON, 400, "invalid_json", "kind"),
        ("", JSON, 400, "validation_error", None),
        ('{"kind": "echo"}', {"Content-Type": "text/plain"}, 415, "unsupported_media_type", None),
        (
            '{"kind": "echo"}',
            {**JSON, "Idempotency-Key": "x" * 256},
            400,
            "validation_error",
            "Idempotency-Key",
        ),
        (
            '{"kind": "echo"}',
            {**JSON, "Idempotency-Key": "tab\tkey"},
            400,
            "validation_error",
            "Idempotency-Key",
        ),
    ],
)
async def test_input_the_route_refuses_goes_to_the_route_and_gets_its_error(
    api: Api,
    router: RouterCalls,
    content: str,
    headers: dict[str, str],
    status: int,
    code: str,
    field: str | None,
) -> None:
    response = await api.client.post("/v1/tasks", content=content, headers=headers)

    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert error.get("field") == field
    assert router.count == 1
    assert api.sample("orchestrator_jobs_submitted_total") == 0


async def test_a_body_over_the_limit_goes_to_the_route_and_gets_413(
    api: Api, router: RouterCalls
) -> None:
    big = json.dumps({"kind": "echo", "payload": "x" * SETTINGS.api_max_body_bytes})

    response = await api.client.post("/v1/tasks", content=big, headers=JSON)

    assert response.status_code == 413
    assert router.count == 1


async def test_a_query_string_or_a_repeated_header_goes_to_the_route(
    api: Api, router: RouterCalls
) -> None:
    with_query = await api.client.post("/v1/tasks?x=1", json={"kind": "echo"})
    json_type = (b"content-type", b"application/json")
    keys = [(b"idempotency-key", b"first"), (b"idempotency-key", b"second")]
    repeated, _ = await asgi_post(api, "/v1/tasks", [json_type, *keys], b'{"kind": "echo"}')
    plain, _ = await asgi_post(api, "/v1/tasks", [json_type], b'{"kind": "echo"}')

    assert with_query.status_code == 201
    assert repeated == 400  # the route refuses a repeated Idempotency-Key
    assert plain == 201
    assert router.count == 2


async def test_a_backend_outage_is_the_routes_503_with_retry_after() -> None:
    class Down:
        async def submit_job(self, cmd: object) -> None:
            raise BackendUnavailable("database unavailable")

    async with running_api(submit=Down()) as api:
        router = RouterCalls(fast_path(api))
        response = await api.client.post("/v1/tasks", json={"kind": "echo"})

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "backend_unavailable"
    assert "retry-after" in response.headers
    assert router.count == 0
    assert (
        api.sample(
            "orchestrator_http_requests_total",
            {"method": "POST", "route": "/v1/tasks", "status": "503"},
        )
        == 1
    )


async def test_with_tokens_the_fast_path_needs_a_submit_token() -> None:
    async with running_api(replace(SETTINGS, api_auth="tokens")) as api:
        router = RouterCalls(fast_path(api))
        tokens = api.services.api.tokens
        submit = (await tokens.create("submitter", {Scope.SUBMIT})).secret
        reader = (await tokens.create("reader", {Scope.READ})).secret
        document = {"kind": "echo"}

        anonymous = await api.client.post("/v1/tasks", json=document)
        wrong = await api.client.post(
            "/v1/tasks", json=document, headers={"Authorization": f"Bearer {reader}"}
        )
        good = await api.client.post(
            "/v1/tasks", json=document, headers={"Authorization": f"Bearer {submit}"}
        )

    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert wrong.status_code == 403
    assert wrong.json()["error"]["code"] == "forbidden"
    assert good.status_code == 201
    assert router.count == 0


# --- differential: the fast path and the route answer alike ------------------------------------

_VALUES: list[Any] = [
    None, True, 0, 1, -1, 7, 2**64, 1.5, "", "echo", "high", "normal", "5s", "1m", "-1s",
    "2026-12-02T10:00:00Z", "soon", [1], {"a": 1}, {"base": "1s"}, {"max_attempts": 2},
]  # fmt: skip
_VALID: list[dict[str, Any]] = [
    {"kind": "echo"},
    {"kind": "echo", "payload": {"n": [1, 2]}, "priority": "high", "max_attempts": 5},
    {"kind": "resize", "delay": "1m", "timeout": "30s", "payload": "x"},
    {"kind": "echo", "retry": {"backoff": "exponential", "delay": "1s", "jitter": True}},
    {"kind": "echo", "run_at": "2026-12-02T10:00:00Z", "priority": "low"},
]
_FIELDS = [
    "kind",
    "payload",
    "max_attempts",
    "priority",
    "run_at",
    "delay",
    "retry",
    "timeout",
    "x",
]
_TAILS = ["", " ", "x", ",", "}", "\n", '{"kind": "a"}']
_CONTENT_TYPES = [
    "application/json", "Application/JSON; charset=utf-8", "application/problem+json",
    "application/+json", "text/plain", "", "application/json;",
]  # fmt: skip
_KEYS: list[bytes | None] = [None, b"", b"k", b"k" * 255, b"k" * 256, b"caf\xe9", b"a\tb"]


def _cases(count: int, seed: int) -> list[tuple[bytes, dict[str, Any]]]:
    """``count`` pseudo-random bodies and headers: mostly a document of the route's fields with
    values of every JSON type, sometimes raw JSON with a tail, an odd media type or key."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        document: Any = dict(rng.choice(_VALID))
        for field in rng.sample(_FIELDS, rng.choice([0, 0, 1, 2])):
            document[field] = rng.choice(_VALUES)
        if rng.random() < 0.2:
            document["kind"] = rng.choice(["x" * 300, "", "a b", 5])
        if rng.random() < 0.1:
            document = rng.choice(_VALUES)
        text = json.dumps(document)
        if rng.random() < 0.15:
            text += rng.choice(_TAILS)
        if rng.random() < 0.1 and isinstance(document, dict) and document:
            name, value = next(iter(document.items()))
            text = f"{text[:-1]}, {json.dumps(name)}: {json.dumps(value)}}}"  # a repeated key
        headers: dict[str, Any] = {}
        content_type = rng.choice(_CONTENT_TYPES) if rng.random() < 0.2 else "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        key = rng.choice(_KEYS) if rng.random() < 0.3 else None
        if key is not None:
            headers["Idempotency-Key"] = key
        cases.append((text.encode(), headers))
    return cases


def _comparable(response: Any) -> tuple[Any, ...]:
    """What must match between the two: status, media type, and the error (or the body's keys
    and warnings; the ids differ by construction)."""
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    if error is not None:
        shown: Any = (error["code"], error.get("field"), error["message"])
    else:
        shown = (sorted(body), body.get("warnings"))
    return response.status_code, response.headers.get("content-type"), shown


async def test_the_fast_path_and_the_route_give_the_same_answers() -> None:
    """Two apps fed the same 300 requests, one at ``/v1/tasks`` (the fast path where it
    qualifies), one with a query string (always the route): every answer alike."""
    async with running_api() as fast_api, running_api() as routed_api:
        served = RouterCalls(fast_path(fast_api))
        for body, headers in _cases(300, seed=17):
            fast = await fast_api.client.post("/v1/tasks", content=body, headers=headers)
            routed = await routed_api.client.post(
                "/v1/tasks?via=route", content=body, headers=headers
            )
            assert fast.status_code < 500, fast.text
            assert _comparable(fast) == _comparable(routed), (body, headers)
        counted = {
            code: fast_api.sample(
                "orchestrator_http_requests_total",
                {"method": "POST", "route": "/v1/tasks", "status": str(code)},
            )
            for code in (201, 400, 415)
        }
    assert 0 < served.count < 300  # both halves were exercised
    assert 0.0 not in counted.values()


async def test_a_request_handed_back_to_the_route_is_not_authenticated_twice() -> None:
    """The token is checked once, before the body: revoked while a bad body is still arriving,
    the request gets the route's 400 for the body, as it would have without the fast path (a
    second check on hand-back gave 401, or 503 with the database down)."""
    async with running_api(replace(SETTINGS, api_auth="tokens")) as api:
        router = RouterCalls(fast_path(api))
        tokens = api.services.api.tokens
        secret = (await tokens.create("uploader", {Scope.SUBMIT})).secret
        body = b'{"kind": "echo", "max_attempts": 0}'
        messages = [
            {"type": "http.request", "body": body[:1], "more_body": True},
            {"type": "http.request", "body": body[1:], "more_body": False},
        ]
        statuses: list[int] = []
        sent: list[bytes] = []

        async def receive() -> dict[str, Any]:
            if len(messages) == 1:  # the rest of the body arrives after the revocation
                await tokens.revoke("uploader")
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])
            else:
                sent.append(message.get("body", b""))

        headers = [
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {secret}".encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        await api.app(http_scope("/v1/tasks", headers), receive, send)  # type: ignore[arg-type]

    assert router.count == 1
    assert statuses == [400]
    error = json.loads(b"".join(sent))["error"]
    assert (error["code"], error["field"]) == ("validation_error", "max_attempts")
