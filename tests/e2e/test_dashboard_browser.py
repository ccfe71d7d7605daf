"""The dashboard in a real browser (issue 16 item 4): Playwright driving Debian's Chromium
(``/usr/bin/chromium``, through ``executable_path``: Playwright's own download is not reachable
here) against a real ``dtq orchestrator`` and ``dtq-worker`` with real jobs.

Each page loads without a console error; retry on a failed task makes it complete; a job page
turns green from its event stream alone (no poll, no reload) while its job runs; with
``API_AUTH=tokens`` the dashboard asks for a token and keeps the session in an HttpOnly,
SameSite=Strict cookie.

Screenshots of every page go to the test's temporary directory, or to ``docs/screenshots/``
when ``DTQ_UPDATE_SCREENSHOTS=1`` (how the committed ones were made). Without Chromium these
tests skip on a laptop and fail under ``CI``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module's tests."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where this test's screenshots go."""
    if os.environ.get("DTQ_UPDATE_SCREENSHOTS") == "1":
        folder = ROOT / "docs" / "screenshots"
    else:
        folder = tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Tab:
    """A page that collects its console errors and uncaught exceptions."""

    def __init__(self, browser: Any, base: str, viewport: dict[str, int] = LAPTOP) -> None:
        self.context = browser.new_context(viewport=viewport)
        self.page = self.context.new_page()
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, path: str) -> Any:
        response = self.page.goto(f"{self.base}{path}", wait_until="networkidle")
        assert response is not None
        return response

    def close(self) -> None:
        self.context.close()


def wait_until(check: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def diamond(sleep: float) -> list[dict[str, Any]]:
    def task(name: str, *deps: str) -> dict[str, Any]:
        return {
            "name": name,
            "kind": "record",
            "payload": {"name": name, "sleep": sleep},
            "depends_on": list(deps),
        }

    return [
        task("extract"),
        task("clean", "extract"),
        task("features", "extract"),
        task("train", "clean", "features"),
        task("report", "train"),
    ]


def test_every_page_loads_without_console_errors(
    cluster: Cluster, browser: Any, shots: Path
) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    # nothing listens on port 9 (discard) here: its deliveries fail, the page shows how
    hook = {"url": "http://127.0.0.1:9/dtq", "events": ["job.completed"], "secret": "s" * 32}
    cluster.post("/v1/webhooks", hook)
    done = cluster.post("/v1/jobs", {"name": "nightly-etl", "tasks": diamond(0.0)})
    failed = cluster.post(
        "/v1/tasks", {"kind": "always_fail", "payload": {"n": 1}, "max_attempts": 1}
    )
    cluster.wait_job(done["job_id"])
    cluster.wait_job(failed["job_id"])
    pages = {
        "overview": "/ui",
        "jobs": "/ui/jobs",
        "job": f"/ui/jobs/{done['job_id']}",
        "task": f"/ui/tasks/{done['tasks']['train']}",
        "task-failed": f"/ui/tasks/{failed['task_id']}",
        "workers": "/ui/workers",
        "webhooks": "/ui/webhooks",
        "failures": "/ui/failures",  # last: its Retry buttons are looked at below
    }
    tab = Tab(browser, cluster.url)
    try:
        for name, path in pages.items():
            response = tab.open(path)
            assert response.status == 200, (name, response.status)
            assert tab.page.locator("main h1").count() == 1, name
            tab.page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
        assert tab.page.locator("tr[data-task] button", has_text="Retry").count() >= 1
        tab.open(pages["webhooks"])
        assert tab.page.locator("tr[data-webhook]").count() == 1
        tab.open(pages["workers"])
        assert "no live worker" not in tab.page.inner_text("main")
        assert tab.page.locator("main tbody tr").count() == 1  # w1
    finally:
        tab.close()
    phone = Tab(browser, cluster.url, PHONE)
    try:
        for name in ("overview", "job"):
            phone.open(pages[name])
            width = phone.page.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"], (name, width)  # no sideways page scroll
            phone.page.screenshot(path=str(shots / f"{name}-phone.png"), full_page=True)
    finally:
        phone.close()
    assert tab.errors == [] and phone.errors == []


def test_retry_on_a_failed_task_makes_it_complete(cluster: Cluster, browser: Any) -> None:
    cluster.start_orchestrator()
    cluster.start_worker("w1")
    submitted = cluster.post("/v1/tasks", {"kind": "fail_first", "payload": {}})
    cluster.wait_job(submitted["job_id"])
    task_id = submitted["task_id"]
    assert cluster.get(f"/v1/tasks/{task_id}")["status"] == "failed"
    tab = Tab(browser, cluster.url)
    try:
        tab.open("/ui/failures")
        row = tab.page.locator(
            "tr[data-task]", has=tab.page.locator(f"a[href='/ui/tasks/{task_id}']")
        )
        with tab.page.expect_navigation():
            row.locator("button", has_text="Retry").click()
        assert tab.page.url.endswith(f"/ui/tasks/{task_id}")

        def completed() -> bool:
            tab.page.reload(wait_until="networkidle")
            return bool(tab.page.inner_text("#task-status") == "completed")

        wait_until(completed, what="the retried task to complete")
        runs = tab.page.locator("main table tbody tr")
        assert runs.count() == 2  # the failed first run and the retried one
    finally:
        tab.close()
    assert tab.errors == []
    assert cluster.get(f"/v1/jobs/{submitted['job_id']}")["status"] == "completed"


def test_a_job_page_turns_green_as_its_job_runs(
    cluster: Cluster, browser: Any, shots: Path
) -> None:
    cluster.start_orchestrator()
    submitted = cluster.post("/v1/jobs", {"name": "diamond", "tasks": diamond(0.4)})
    job_path = f"/ui/jobs/{submitted['job_id']}"
    tab = Tab(browser, cluster.url)
    requests: list[str] = []
    tab.page.on("request", lambda r: requests.append(r.url.removeprefix(cluster.url)))
    try:
        tab.open(job_path)
        nodes = tab.page.locator("#graph a.node")
        assert nodes.count() == 5
        seen_before = {nodes.nth(i).get_attribute("data-status") for i in range(5)}
        # the section is the one the page rendered: a poll would have swapped it (outerHTML)
        tab.page.evaluate("document.getElementById('graph').dataset.rendered = 'first'")
        cluster.start_worker("w1")  # the job runs only now; the page is never reloaded
        tab.page.wait_for_selector('#graph[data-job-status="completed"]', timeout=60_000)
        statuses = {nodes.nth(i).get_attribute("data-status") for i in range(5)}
        counts = tab.page.inner_text("[data-count=completed] .n")
        colour = tab.page.eval_on_selector("#graph a.node rect", "r => getComputedStyle(r).fill")
        rendered = tab.page.eval_on_selector("#graph", "g => g.dataset.rendered")
        live = tab.page.locator("#live").count()
        tab.page.screenshot(path=str(shots / "job-completed.png"), full_page=True)
    finally:
        tab.close()
    assert seen_before == {"queued", "pending"}
    assert statuses == {"completed"}
    assert counts == "5"
    assert colour == "rgb(22, 163, 74)"  # --completed
    # the update came through the stream: one stream request, no fragment poll, no reload
    assert [r for r in requests if r.startswith(f"{job_path}/events?after=")] != []
    assert [r for r in requests if r.startswith(f"{job_path}/graph")] == []
    assert [r for r in requests if r == job_path] == [job_path]
    assert rendered == "first"
    assert live == 0  # the finished job's stream was closed
    assert tab.errors == []


def test_without_its_stream_a_job_page_falls_back_to_a_slow_poll(
    cluster: Cluster, browser: Any
) -> None:
    cluster.start_orchestrator()
    submitted = cluster.post("/v1/jobs", {"name": "diamond", "tasks": diamond(0.0)})
    job_path = f"/ui/jobs/{submitted['job_id']}"
    tab = Tab(browser, cluster.url)
    requests: list[str] = []
    tab.page.on("request", lambda r: requests.append(r.url.removeprefix(cluster.url)))
    # a proxy that refuses the stream: EventSource gives up (CLOSED) on a 503
    tab.page.route("**/events?*", lambda route: route.fulfill(status=503, body="no streams"))
    try:
        tab.open(job_path)
        cluster.start_worker("w1")
        tab.page.wait_for_selector('#graph[data-job-status="completed"]', timeout=60_000)
    finally:
        tab.close()
    assert [r for r in requests if r.startswith(f"{job_path}/graph")] != []  # the poll
    assert all("503" in e for e in tab.errors), tab.errors  # the refused stream, nothing else


def create_token(cluster: Cluster, name: str, scopes: str) -> str:
    return cluster.run("token", "create", "--name", name, "--scopes", scopes).splitlines()[-1]


def test_with_tokens_the_dashboard_asks_for_one_and_keeps_a_strict_cookie(
    cluster: Cluster, browser: Any, shots: Path
) -> None:
    operator = create_token(cluster, "operator", "read,admin")
    cluster.env.pop("API_AUTH")  # the orchestrator's default: tokens
    cluster.start_orchestrator()
    tab = Tab(browser, cluster.url)
    try:
        tab.open("/ui/jobs")
        assert "/ui/login" in tab.page.url
        tab.page.screenshot(path=str(shots / "login.png"), full_page=True)
        tab.page.fill("#token", "dtq_" + "x" * 43)
        with tab.page.expect_navigation():
            tab.page.click("button[type=submit]")
        assert "does not authenticate" in tab.page.inner_text("main")
        tab.page.fill("#token", operator)
        with tab.page.expect_navigation():
            tab.page.click("button[type=submit]")
        assert tab.page.url == f"{cluster.url}/ui/jobs"
        assert tab.page.inner_text(".who") == "operator"
        (cookie,) = tab.context.cookies()  # the login form's CSRF cookie is gone
        with tab.page.expect_navigation():
            tab.page.click("text=Log out")
        assert "/ui/login" in tab.page.url
        tab.open("/ui")
        assert "/ui/login" in tab.page.url  # the session ended with the logout
    finally:
        tab.close()
    assert cookie["name"] == "dtq_session"
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert operator not in cookie["value"]
    # the 401 of the wrong token is the only console error: the browser logs a failed load
    assert all("401" in e for e in tab.errors), tab.errors
