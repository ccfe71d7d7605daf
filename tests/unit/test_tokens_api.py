"""Bearer-token authentication of the HTTP API (issue 15 item 3), on the memory adapters:
the scope rule over every registered route, 401/403 in the error shape, no secret in any log,
metric or body, the OpenAPI scheme, and ``API_AUTH=none``."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from uuid import uuid4

import pytest
from litestar.routes import HTTPRoute

from dtq.domain.tokens import Scope, hash_secret
from dtq.entrypoints.api.auth import required_scope
from tests.unit.api_harness import JSON, SETTINGS, Api, running_api

TOKENS = replace(SETTINGS, api_auth="tokens")

#: The routes of this tree and the scope each must need (other helpers add routes: they get a
#: scope from the rule, which test_every_registered_route_needs_the_scope_the_rule_gives checks).
EXPECTED: dict[tuple[str, str], Scope | None] = {
    ("GET", "/healthz"): None,
    ("HEAD", "/healthz"): None,
    ("GET", "/metrics"): None,
    ("POST", "/v1/tasks"): Scope.SUBMIT,
    ("POST", "/v1/jobs"): Scope.SUBMIT,
    ("POST", "/v1/artifacts"): Scope.SUBMIT,
    ("GET", "/v1/tasks/{id}"): Scope.READ,
    ("GET", "/v1/jobs/{id}"): Scope.READ,
    ("GET", "/v1/jobs/{id}/results"): Scope.READ,
    ("GET", "/v1/workers"): Scope.READ,
    ("GET", "/v1/artifacts/{id}"): Scope.READ,
    ("HEAD", "/v1/artifacts/{id}"): Scope.READ,
    ("OPTIONS", "/v1/tasks"): Scope.READ,
    ("GET", "/schema/openapi.json"): None,
}


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api(TOKENS) as running:
        yield running


async def secret_for(api: Api, *scopes: Scope, name: str | None = None) -> str:
    created = await api.services.api.tokens.create(name or f"t-{uuid4().hex[:8]}", set(scopes))
    return created.secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def http_routes(api: Api) -> list[tuple[str, str]]:
    return [
        (method, route.path_format)
        for route in api.app.routes
        if isinstance(route, HTTPRoute)
        for method in sorted(route.route_handler_map)
    ]


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", str(uuid4()), path)


# --- the rule -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("POST", "/v1/tasks/{id}/cancel", Scope.ADMIN),
        ("POST", "/v1/tasks/{id}/retry", Scope.ADMIN),
        ("POST", "/v1/jobs/{id}/cancel", Scope.ADMIN),
        ("POST", "/v1/tasks/cancel", Scope.ADMIN),
        ("DELETE", "/v1/tokens/{name}", Scope.ADMIN),
        ("POST", "/v1/webhooks", Scope.ADMIN),
        ("GET", "/v1/tasks", Scope.READ),
        ("POST", "/v1/worker/claim", Scope.WORKER),
        ("POST", "/v1/worker/runs/{run_id}/heartbeat", Scope.WORKER),
        ("GET", "/v1/worker/whatever", Scope.WORKER),
        ("GET", "/v1", Scope.READ),
        ("GET", "/v1workers", None),
        ("GET", "/healthz", None),
        ("POST", "/schema/openapi.json", None),
    ],
)
def test_the_rule_gives_routes_added_later_their_scope(
    method: str, path: str, scope: Scope | None
) -> None:
    assert required_scope(method, path) == scope


def test_metrics_needs_read_only_with_metrics_auth() -> None:
    assert required_scope("GET", "/metrics") is None
    assert required_scope("GET", "/metrics", metrics_auth=True) == Scope.READ


async def test_every_registered_route_needs_the_scope_the_rule_gives(api: Api) -> None:
    routes = http_routes(api)
    assert set(EXPECTED) <= set(routes)  # the table names real routes

    for method, path in routes:
        scope = required_scope(method, path)
        if (method, path) in EXPECTED:
            assert scope == EXPECTED[(method, path)], (method, path)
        if path == "/v1" or path.startswith("/v1/"):
            assert scope is not None, (method, path)


async def test_every_v1_route_refuses_no_token_and_every_other_scope(api: Api) -> None:
    tokens = {
        scope: await secret_for(api, *(s for s in Scope if s is not scope)) for scope in Scope
    }
    checked = 0
    for method, path in http_routes(api):
        scope = required_scope(method, path)
        if scope is None:
            continue
        url = concrete(path)

        anonymous = await api.client.request(method, url)
        wrong = await api.client.request(method, url, headers=bearer(tokens[scope]))

        assert anonymous.status_code == 401, (method, path)
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert wrong.status_code == 403, (method, path)
        if method != "HEAD":
            assert wrong.json()["error"]["code"] == "forbidden"
            assert repr(scope.value) in wrong.json()["error"]["message"]
        checked += 1
    assert checked >= 10


async def test_open_routes_need_no_token(api: Api) -> None:
    assert (await api.client.get("/healthz")).status_code == 200
    assert (await api.client.get("/metrics")).status_code == 200
    assert (await api.client.get("/schema/openapi.json")).status_code == 200


# --- 401 and 403 ----------------------------------------------------------------------------------


async def test_no_token_is_a_401_in_the_error_shape_with_a_bearer_challenge(api: Api) -> None:
    response = await api.client.get(f"/v1/tasks/{uuid4()}")

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "unauthenticated"
    assert error["field"] == "Authorization"
    assert "Bearer" in error["message"]


@pytest.mark.parametrize(
    "header",
    ["Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "dtq_abc", "Bearer dtq_" + "a" * 43],
)
async def test_a_bad_authorization_header_is_a_401(api: Api, header: str) -> None:
    response = await api.client.get("/v1/workers", headers={"Authorization": header})

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
    assert response.headers["www-authenticate"] == "Bearer"


async def test_expired_and_revoked_tokens_are_401(api: Api) -> None:
    short = await api.services.api.tokens.create("short", {Scope.READ}, expires_in=5)
    revoked = await secret_for(api, Scope.READ, name="gone")
    assert (await api.client.get("/v1/workers", headers=bearer(short.secret))).status_code == 200

    api.clock.advance(6)
    await api.services.api.tokens.revoke("gone")

    for secret, reason in ((short.secret, "expired"), (revoked, "revoked")):
        response = await api.client.get("/v1/workers", headers=bearer(secret))
        assert response.status_code == 401
        assert reason in response.json()["error"]["message"]


async def test_the_right_scope_is_accepted(api: Api) -> None:
    submitter = await secret_for(api, Scope.SUBMIT)
    reader = await secret_for(api, Scope.READ)

    created = await api.client.post(
        "/v1/tasks", json={"kind": "echo"}, headers={**JSON, **bearer(submitter)}
    )
    assert created.status_code == 201
    task_id = created.json()["task_id"]
    read = await api.client.get(f"/v1/tasks/{task_id}", headers=bearer(reader))
    assert read.status_code == 200
    refused = await api.client.get(f"/v1/tasks/{task_id}", headers=bearer(submitter))
    assert refused.status_code == 403
    assert refused.headers["www-authenticate"] == 'Bearer error="insufficient_scope"'


async def test_the_scope_is_checked_before_the_body_is_judged(api: Api) -> None:
    reader = await secret_for(api, Scope.READ)

    response = await api.client.post(
        "/v1/jobs", content=b"{not json", headers={**JSON, **bearer(reader)}
    )

    assert response.status_code == 403


async def test_metrics_auth_makes_metrics_need_read() -> None:
    async with running_api(replace(TOKENS, metrics_auth=True)) as api:
        reader = await secret_for(api, Scope.READ)
        submitter = await secret_for(api, Scope.SUBMIT)

        assert (await api.client.get("/metrics")).status_code == 401
        assert (await api.client.get("/metrics", headers=bearer(submitter))).status_code == 403
        assert (await api.client.get("/metrics", headers=bearer(reader))).status_code == 200
        assert (await api.client.get("/healthz")).status_code == 200


# --- secrets stay secret --------------------------------------------------------------------------


async def test_no_secret_or_hash_in_logs_metrics_or_bodies(
    api: Api, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    good = await secret_for(api, Scope.SUBMIT)
    bad = "dtq_" + "Z" * 43
    bodies: list[str] = []
    with caplog.at_level(logging.DEBUG):
        for secret in (good, bad, "not-even-a-dtq-token-but-secret"):
            for request in (
                api.client.get("/v1/workers", headers=bearer(secret)),
                api.client.post("/v1/jobs", json={}, headers={**JSON, **bearer(secret)}),
            ):
                response = await request
                assert response.status_code in (400, 401, 403)
                bodies.append(response.text + str(response.headers))
    exposition = (await api.client.get("/metrics")).text
    captured = capsys.readouterr()

    assert any(r.name == "dtq.api" for r in caplog.records)  # the refusals were logged
    seen = caplog.text + exposition + captured.out + captured.err + "".join(bodies)
    for secret in (good, bad, "not-even-a-dtq-token-but-secret"):
        assert secret not in seen
        assert hash_secret(secret) not in seen
        assert secret[4:20] not in seen


# --- OpenAPI and API_AUTH=none --------------------------------------------------------------------


async def test_the_schema_declares_the_bearer_scheme_and_each_operations_scope(api: Api) -> None:
    schema = (await api.client.get("/schema/openapi.json")).json()

    scheme = schema["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert schema["paths"]["/v1/tasks"]["post"]["security"] == [{"bearer": ["submit"]}]
    assert schema["paths"]["/v1/tasks/{id}"]["get"]["security"] == [{"bearer": ["read"]}]
    assert {"401", "403"} <= set(schema["paths"]["/v1/jobs"]["post"]["responses"])
    assert "security" not in schema["paths"]["/healthz"]["get"]
    assert "security" not in schema["paths"]["/metrics"]["get"]


async def test_api_auth_none_checks_nothing_and_declares_no_scheme() -> None:
    async with running_api(replace(SETTINGS, api_auth="none")) as api:
        created = await api.client.post("/v1/tasks", json={"kind": "echo"}, headers=JSON)
        schema = (await api.client.get("/schema/openapi.json")).json()

    assert created.status_code == 201
    assert "securitySchemes" not in schema.get("components", {})
    assert "security" not in schema["paths"]["/v1/tasks"]["post"]


async def test_a_database_outage_during_authentication_is_a_503(api: Api) -> None:
    reader = await secret_for(api, Scope.READ)
    api.store.available = False

    response = await api.client.get("/v1/workers", headers=bearer(reader))

    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert reader not in response.text


async def test_an_authorization_header_given_twice_is_a_400_naming_it() -> None:
    """Two credentials are ambiguous: the first one was taken silently (a read token first
    gave 403, the submit token first 201). Over real HTTP: the test client would merge them."""
    import httpx

    from tests.unit.http_server import serving

    async with serving(replace(SETTINGS, api_auth="tokens")) as server:
        tokens = server.services.api.tokens
        submit = (await tokens.create("submitter", {Scope.SUBMIT, Scope.READ})).secret
        reader = (await tokens.create("reader", {Scope.READ})).secret
        twice = [("Authorization", f"Bearer {submit}"), ("Authorization", f"Bearer {reader}")]
        async with httpx.AsyncClient(base_url=server.url) as client:
            posted = await client.post("/v1/tasks", json={"kind": "echo"}, headers=twice)
            listed = await client.get("/v1/jobs", headers=twice)
            once = await client.get("/v1/jobs", headers=twice[:1])

    for answer in (posted, listed):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["field"] == "Authorization"
    assert once.status_code == 200
