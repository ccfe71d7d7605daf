"""The dashboard on the memory adapters (issue 16 item 3): every ``/ui`` route behind a session
with ``API_AUTH=tokens``, the cookie's attributes, scopes and CSRF on the actions, the pages'
reads (bounded job graph, overview counts and throughput) and bad input as 4xx pages."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from litestar.routes import HTTPRoute

from dtq.domain.entities import Worker
from dtq.domain.tokens import Scope
from dtq.entrypoints.dashboard import pages, reads
from dtq.entrypoints.dashboard.csrf import LoginTokens
from dtq.entrypoints.dashboard.gate import safe_next
from tests.unit.api_harness import SETTINGS, Api, running_api

TOKENS = replace(SETTINGS, api_auth="tokens")
OPEN = ("/ui/login", "/ui/static")
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with running_api() as running:
        running.client.follow_redirects = False
        yield running


@pytest.fixture
async def secured() -> AsyncIterator[Api]:
    async with running_api(TOKENS) as running:
        running.client.follow_redirects = False
        yield running


async def token(api: Api, name: str, *scopes: Scope) -> str:
    created = await api.services.api.tokens.create(name, frozenset(scopes))
    return created.secret


async def post_login(api: Api, **form: str) -> Any:
    """POST /ui/login with ``form`` and the CSRF token of a login form just fetched."""
    csrf = await csrf_of(api, "/ui/login")
    return await api.client.post("/ui/login", data={"csrf": csrf, **form})


async def login(api: Api, secret: str) -> None:
    response = await post_login(api, token=secret, next="/ui/jobs")
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/ui/jobs"


async def submit(api: Api, *, auth: str | None = None, **body: Any) -> dict[str, Any]:
    """POST /v1/tasks (with ``auth``: as a bearer token, for the API_AUTH=tokens app)."""
    headers = {"Authorization": f"Bearer {auth}"} if auth else {}
    response = await api.client.post("/v1/tasks", json={"kind": "echo", **body}, headers=headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def fail_for_good(api: Api, task_id: str) -> None:
    execution = api.services.worker.execution
    [claim] = await execution.claim_many([UUID(task_id)], "w1")
    await execution.fail(claim, "boom", permanent=True)


async def csrf_of(api: Api, path: str) -> str:
    page = await api.client.get(path)
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found is not None
    return found.group(1)


def ui_routes(api: Api) -> list[tuple[str, str]]:
    """Every (method, path) under /ui that is not open, with ids filled in."""
    found: list[tuple[str, str]] = []
    for route in api.app.routes:
        if not isinstance(route, HTTPRoute) or not route.path.startswith("/ui"):
            continue
        if route.path.startswith(OPEN):
            continue
        path = re.sub(r"\{[^}]+\}", str(uuid4()), route.path)
        found += [(m, path) for m in sorted(route.methods) if m not in ("HEAD", "OPTIONS")]
    return found


# -- access ------------------------------------------------------------------------------------


async def test_every_ui_route_needs_a_session_when_tokens_are_on(secured: Api) -> None:
    routes = ui_routes(secured)
    assert {p for _, p in routes} >= {"/ui", "/ui/jobs", "/ui/workers", "/ui/failures"}
    assert {m for m, _ in routes} == {"GET", "POST"}
    for method, path in routes:
        for cookies in ({}, {"dtq_session": "forged"}):
            secured.client.cookies.clear()
            secured.client.cookies.update(cookies)
            response = await secured.client.request(method, path, data={"csrf": "x"})
            if method == "GET" and path.endswith("/events"):  # EventSource: no redirect
                assert response.status_code == 401, (method, path)
            elif method == "GET":
                assert response.status_code == 303, (method, path)
                assert response.headers["location"].startswith("/ui/login?next=/ui")
            else:
                assert response.status_code == 401, (method, path)


async def test_login_sets_a_strict_http_only_session_cookie(secured: Api) -> None:
    secret = await token(secured, "operator", Scope.READ)

    response = await post_login(secured, token=secret, next="/ui")

    assert response.status_code == 303
    cookies = response.headers.get_list("set-cookie")
    [cookie] = [c for c in cookies if c.startswith("dtq_session=")]
    assert all(secret not in c for c in cookies)
    attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/ui"} <= attributes
    assert "secure" not in attributes  # served over http here
    assert (await secured.client.get("/ui")).status_code == 200


async def test_a_wrong_token_or_one_without_read_does_not_log_in(secured: Api) -> None:
    writer = await token(secured, "writer", Scope.SUBMIT)

    wrong = await post_login(secured, token="dtq_" + "x" * 43)
    no_read = await post_login(secured, token=writer)

    assert wrong.status_code == 401
    assert "does not authenticate" in wrong.text
    assert no_read.status_code == 403
    for refused in (wrong, no_read):
        assert "dtq_session" not in refused.headers.get("set-cookie", "")


async def test_an_action_needs_the_admin_scope(secured: Api) -> None:
    submitter = await token(secured, "submitter", Scope.SUBMIT)
    created = await submit(secured, auth=submitter, max_attempts=1)
    await fail_for_good(secured, created["task_id"])
    await login(secured, await token(secured, "reader", Scope.READ))
    csrf = await csrf_of(secured, f"/ui/tasks/{created['task_id']}")

    response = await secured.client.post(
        f"/ui/tasks/{created['task_id']}/retry", data={"csrf": csrf}
    )

    assert response.status_code == 403
    view = await secured.services.api.queries.get_task(UUID(created["task_id"]))
    assert view.task.status.value == "failed"


async def test_an_action_without_the_sessions_csrf_token_is_refused(secured: Api) -> None:
    submitter = await token(secured, "submitter", Scope.SUBMIT)
    created = await submit(secured, auth=submitter, max_attempts=1)
    await fail_for_good(secured, created["task_id"])
    await login(secured, await token(secured, "admin", Scope.READ, Scope.ADMIN))
    url = f"/ui/tasks/{created['task_id']}/retry"

    missing = await secured.client.post(url, data={})
    forged = await secured.client.post(url, data={"csrf": "not-the-token"})
    view = await secured.services.api.queries.get_task(UUID(created["task_id"]))

    assert missing.status_code == forged.status_code == 403
    assert "CSRF token" in forged.text and "Nothing was changed" in forged.text
    assert view.task.status.value == "failed"
    assert (await secured.client.get("/ui/failures")).status_code == 200  # still logged in
    csrf = await csrf_of(secured, f"/ui/tasks/{created['task_id']}")
    done = await secured.client.post(url, data={"csrf": csrf, "next": "/ui/failures"})
    assert done.status_code == 303
    assert done.headers["location"] == "/ui/failures"
    view = await secured.services.api.queries.get_task(UUID(created["task_id"]))
    assert view.task.status.value == "queued"


async def test_an_htmx_request_may_send_the_csrf_token_as_a_header(secured: Api) -> None:
    submitter = await token(secured, "submitter", Scope.SUBMIT)
    created = await submit(secured, auth=submitter)
    await login(secured, await token(secured, "admin", Scope.READ, Scope.ADMIN))
    page = await secured.client.get(f"/ui/tasks/{created['task_id']}")
    csrf = CSRF.search(page.text)
    assert csrf is not None
    assert f'hx-headers=\'{{"X-CSRF-Token": "{csrf[1]}"}}\'' in page.text
    url = f"/ui/tasks/{created['task_id']}/cancel"

    wrong = await secured.client.post(url, headers={"X-CSRF-Token": "stale"}, data={"x": "1"})
    state = (await secured.services.api.queries.get_task(UUID(created["task_id"]))).task.status
    done = await secured.client.post(url, headers={"X-CSRF-Token": csrf[1]}, data={"x": "1"})

    assert wrong.status_code == 403 and state.value == "queued"
    assert done.status_code == 303
    view = await secured.services.api.queries.get_task(UUID(created["task_id"]))
    assert view.task.status.value == "cancelled"


async def test_the_login_form_needs_its_own_signed_csrf_token(secured: Api) -> None:
    secret = await token(secured, "operator", Scope.READ)
    login_url = "/ui/login"

    bare = await secured.client.post(login_url, data={"token": secret})
    form = await csrf_of(secured, login_url)  # sets the dtq_login_csrf cookie too
    mismatched = await secured.client.post(login_url, data={"token": secret, "csrf": form + "x"})
    alien = LoginTokens(b"another process").issue()  # equal in cookie and field, not ours
    secured.client.cookies.set("dtq_login_csrf", alien, path="/ui/login")
    planted = await secured.client.post(login_url, data={"token": secret, "csrf": alien})

    for refused in (bare, mismatched, planted):
        assert refused.status_code == 403
        assert "CSRF token" in refused.text
        assert "dtq_session" not in refused.headers.get("set-cookie", "")
        fresh = CSRF.search(refused.text)  # the form again, with a token that works
        assert fresh is not None and fresh[1] != alien
    assert (await secured.client.get("/ui")).status_code == 303  # not logged in
    secured.client.cookies.clear()  # the planted cookie sits beside the server's in the jar
    good = await csrf_of(secured, login_url)
    response = await secured.client.post(login_url, data={"token": secret, "csrf": good})
    assert response.status_code == 303
    assert (await secured.client.get("/ui")).status_code == 200


async def test_a_revoked_token_ends_its_session(secured: Api) -> None:
    await login(secured, await token(secured, "leaver", Scope.READ))
    assert (await secured.client.get("/ui/workers")).status_code == 200

    await secured.services.api.tokens.revoke("leaver")
    secured.clock.advance(5.0)  # past the token cache's TTL

    response = await secured.client.get("/ui/workers")
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login?next=/ui/workers"


async def test_an_htmx_poll_without_a_session_is_told_where_to_log_in(secured: Api) -> None:
    response = await secured.client.get(f"/ui/jobs/{uuid4()}/graph", headers={"HX-Request": "true"})
    assert response.status_code == 401
    assert response.headers["hx-redirect"].startswith("/ui/login?next=/ui/jobs/")


async def test_logout_ends_the_session(secured: Api) -> None:
    await login(secured, await token(secured, "operator", Scope.READ))
    csrf = await csrf_of(secured, "/ui/workers")

    response = await secured.client.post("/ui/logout", data={"csrf": csrf})

    assert response.status_code == 303
    assert (
        'dtq_session=""' in response.headers["set-cookie"]
        or "Max-Age=0" in (response.headers["set-cookie"])
    )
    assert (await secured.client.get("/ui")).status_code == 303


async def test_logging_in_again_ends_the_browsers_previous_session(secured: Api) -> None:
    secret = await token(secured, "operator", Scope.READ)
    await login(secured, secret)
    first = secured.client.cookies.get("dtq_session")

    await login(secured, secret)
    second = secured.client.cookies.get("dtq_session")
    secured.client.cookies.set("dtq_session", first or "", path="/ui")

    assert first and second and first != second  # a new id at every login (no fixation)
    assert (await secured.client.get("/ui")).status_code == 303
    assert len(secured.store._tables.dashboard.sessions) == 1


def test_a_redirect_target_stays_inside_the_dashboard() -> None:
    assert safe_next("/ui/jobs?status=failed") == "/ui/jobs?status=failed"
    for hostile in ("//evil.example/ui", "https://evil.example", "/ui//evil", "/uix", None, 3):
        assert safe_next(hostile) == "/ui"
    assert safe_next("/ui/\\evil") == "/ui"


# -- without tokens ----------------------------------------------------------------------------


async def test_without_tokens_every_page_opens_and_actions_still_need_the_csrf_token(
    api: Api,
) -> None:
    created = await submit(api, max_attempts=1)
    await fail_for_good(api, created["task_id"])
    for path in ("/ui", "/ui/jobs", "/ui/workers", "/ui/failures", "/ui/overview/panel"):
        assert (await api.client.get(path)).status_code == 200, path
    url = f"/ui/tasks/{created['task_id']}/retry"

    assert (await api.client.post(url, data={"csrf": "guess"})).status_code == 403
    csrf = await csrf_of(api, "/ui/failures")
    assert (await api.client.post(url, data={"csrf": csrf})).status_code == 303
    view = await api.services.api.queries.get_task(UUID(created["task_id"]))
    assert view.task.status.value == "queued"


async def test_a_refused_action_is_its_4xx_as_a_page(api: Api) -> None:
    created = await submit(api)
    csrf = await csrf_of(api, f"/ui/tasks/{created['task_id']}")  # its cancel form

    response = await api.client.post(f"/ui/tasks/{created['task_id']}/retry", data={"csrf": csrf})

    assert response.status_code == 409
    assert response.headers["content-type"].startswith("text/html")
    assert "not failed" in response.text or "retry" in response.text.lower()


async def test_bad_input_is_a_4xx_page_naming_the_field(api: Api) -> None:
    bad_id = await api.client.get("/ui/jobs/not-a-uuid")
    unknown = await api.client.get(f"/ui/tasks/{uuid4()}")
    bad_status = await api.client.get("/ui/jobs?status=bogus")
    bad_cursor = await api.client.get("/ui/failures?cursor=zzz")

    assert bad_id.status_code == 400 and "field id" in bad_id.text
    assert unknown.status_code == 404
    assert bad_status.status_code == 400 and "field status" in bad_status.text
    assert bad_cursor.status_code == 400 and "field cursor" in bad_cursor.text


# -- pages -------------------------------------------------------------------------------------


def diamond() -> list[dict[str, Any]]:
    return [
        {"name": "a", "kind": "echo"},
        {"name": "b", "kind": "echo", "depends_on": ["a"]},
        {"name": "c", "kind": "echo", "depends_on": ["a"]},
        {"name": "d", "kind": "echo", "depends_on": ["b", "c"]},
    ]


async def test_the_job_page_draws_every_task_of_a_small_job_by_layer(api: Api) -> None:
    created = (await api.client.post("/v1/jobs", json={"tasks": diamond()})).json()

    page = await api.client.get(f"/ui/jobs/{created['job_id']}")

    assert page.status_code == 200
    nodes = re.findall(r'data-task="(\w)" data-status="(\w+)"', page.text)
    assert sorted(nodes) == [("a", "queued"), ("b", "pending"), ("c", "pending"), ("d", "pending")]
    assert page.text.count('class="edge"') == 4
    assert "3 layers" in page.text
    assert 'data-finished="false"' in page.text
    assert f'data-stream="/ui/jobs/{created["job_id"]}/events?after=' in page.text
    assert "hx-trigger" not in page.text  # no poll: live.js follows the stream
    assert "/ui/static/live.js" in page.text


async def test_a_finished_job_page_is_not_followed(api: Api) -> None:
    created = await submit(api, max_attempts=1)
    await fail_for_good(api, created["task_id"])

    fragment = await api.client.get(f"/ui/jobs/{created['job_id']}/graph")

    assert 'data-job-status="failed"' in fragment.text
    assert 'data-finished="true"' in fragment.text  # live.js opens no stream
    assert "hx-trigger" not in fragment.text


async def test_a_large_job_is_paged_not_drawn(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages, "MAX_DRAWN_TASKS", 3)
    monkeypatch.setattr(pages, "JOB_TASK_PAGE", 2)
    tasks = [{"name": f"t{i}", "kind": "echo"} for i in range(5)]
    created = (await api.client.post("/v1/jobs", json={"tasks": tasks})).json()

    first = await api.client.get(f"/ui/jobs/{created['job_id']}")
    cursor = re.search(r"graph\?cursor=([^\"&]+)", first.text)
    assert cursor is not None
    second = await api.client.get(f"/ui/jobs/{created['job_id']}/graph?cursor={cursor[1]}")

    assert 'class="node' not in first.text
    assert re.findall(r">(t\d)</a>", first.text) == ["t0", "t1"]
    assert re.findall(r">(t\d)</a>", second.text) == ["t2", "t3"]
    assert re.search(r'data-count="queued">queued <span class="n">5<', first.text)


async def test_the_task_page_shows_payload_runs_error_and_explain(api: Api) -> None:
    created = await submit(api, payload={"n": 41}, max_attempts=1)
    await fail_for_good(api, created["task_id"])

    page = await api.client.get(f"/ui/tasks/{created['task_id']}")

    assert page.status_code == 200
    assert "&#34;n&#34;: 41" in page.text or '"n": 41' in page.text
    assert "boom" in page.text
    assert "<code>terminal</code>" in page.text
    assert page.text.count('class="badge run-failed"') == 1
    assert f'action="/ui/tasks/{created["task_id"]}/retry"' in page.text


async def test_the_jobs_page_filters_by_status_and_pages(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "PAGE_SIZE", 2)
    queued = []
    for _ in range(3):
        queued.append((await submit(api))["job_id"])
        api.clock.advance(1.0)  # newest first by created_at
    failed = await submit(api, max_attempts=1)
    await fail_for_good(api, failed["task_id"])

    only_failed = await api.client.get("/ui/jobs?status=failed")
    first = await api.client.get("/ui/jobs?status=pending&status=running")
    cursor = re.search(r"cursor=([0-9a-f.]+)", first.text)
    assert cursor is not None
    second = await api.client.get(f"/ui/jobs?status=pending&status=running&cursor={cursor[1]}")

    listed = re.compile(r'href="/ui/jobs/([0-9a-f-]{36})"')
    assert listed.findall(only_failed.text) == [failed["job_id"]]
    assert listed.findall(first.text) == [queued[2], queued[1]]
    assert listed.findall(second.text) == [queued[0]]
    assert "cursor=" not in second.text


async def test_the_failures_page_lists_failed_tasks_with_retry_and_cancel(api: Api) -> None:
    ok = await submit(api)
    bad = await submit(api, max_attempts=1)
    await fail_for_good(api, bad["task_id"])

    page = await api.client.get("/ui/failures")

    assert bad["task_id"] in page.text and ok["task_id"] not in page.text
    assert f'action="/ui/tasks/{bad["task_id"]}/retry"' in page.text
    assert f'action="/ui/jobs/{bad["job_id"]}/cancel"' in page.text


# -- overview ----------------------------------------------------------------------------------


async def test_the_overview_counts_recent_tasks_per_status_up_to_a_cap(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(3):
        await submit(api)
    failed = await submit(api, max_attempts=1)
    await fail_for_good(api, failed["task_id"])
    queries, inspector = api.services.api.queries, api.services.api.inspector

    view = await reads.read_overview(queries, inspector, now=api.clock.now())
    monkeypatch.setattr(reads, "COUNT_CAP", 2)
    capped = await reads.read_overview(queries, inspector, now=api.clock.now())
    later = await reads.read_overview(queries, inspector, now=api.clock.now() + timedelta(hours=1))

    counts = {c.status.value: (c.count, c.capped) for c in view.counts}
    assert counts["queued"] == (3, False) and counts["failed"] == (1, False)
    assert {c.status.value: (c.count, c.capped) for c in capped.counts}["queued"] == (2, True)
    assert all(c.count == 0 for c in later.counts)  # outside the window
    assert view.depths == [("default", len(api.queue.ready_ids("default")))]
    assert (view.depths[0][1] or 0) >= 3


async def test_the_overview_buckets_completions_per_minute(api: Api) -> None:
    execution = api.services.worker.execution
    ids = [UUID((await submit(api))["task_id"]) for _ in range(3)]
    claims = await execution.claim_many(ids, "w1")
    await execution.complete_many(claims[:2])
    api.clock.advance(60.0)
    await execution.complete_many(claims[2:])

    view = await reads.read_overview(
        api.services.api.queries, api.services.api.inspector, now=api.clock.now()
    )

    assert [n for _, n in view.throughput][-2:] == [2, 1]
    assert sum(n for _, n in view.throughput) == 3
    assert len(view.throughput) == reads.THROUGHPUT_MINUTES
    assert view.sampled is False


def test_the_ready_depths_cover_default_and_every_advertised_priority() -> None:
    now = datetime.now(UTC)
    workers = [
        Worker("w1", None, now, {"priorities": ["high", "default"]}),
        Worker("w2", None, now, {"priorities": ["batch"]}),
        Worker("w3", None, now, {"priorities": "not-a-list"}),
        Worker("w4", None, now),
    ]
    assert reads.advertised_priorities(workers) == ["batch", "default", "high"]
    assert reads.advertised_priorities([]) == ["default"]


async def test_the_webhooks_page_shows_each_delivery_state_never_a_secret(api: Api) -> None:
    hooks = api.services.api.webhooks
    healthy = await hooks.create(url="https://a.example/h", events=["job.failed"], secret="s" * 20)
    failing = await hooks.create(
        url="https://ci:pw@b.example/h", events=["task.failed"], secret="t" * 20
    )
    at = datetime.now(UTC)
    broken = replace(
        failing,
        attempts=3,
        last_status=503,
        last_error="HTTP 503",
        last_attempt_at=at,
        next_attempt_at=at + timedelta(seconds=8),
    )
    assert await api.store.run(lambda tx: tx.webhooks.replace(failing, broken))

    page = await api.client.get("/ui/webhooks")

    assert page.status_code == 200
    rows = dict(re.findall(r'<tr data-webhook="([^"]+)">(.*?)</tr>', page.text, re.S))
    assert "waiting" in rows[str(healthy.id)] and "https://a.example/h" in rows[str(healthy.id)]
    assert "failing · 3 in a row" in rows[str(failing.id)]
    assert "https://ci:***@b.example/h" in rows[str(failing.id)] and "pw@" not in page.text
    assert "HTTP 503" in rows[str(failing.id)]
    assert "s" * 20 not in page.text and "t" * 20 not in page.text
