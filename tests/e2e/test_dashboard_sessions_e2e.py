"""Two real ``dtq orchestrator`` processes on one database, as behind a load balancer (issue 16
item 3): a dashboard login made on one is honoured by the other, survives a restart of the
first, and a logout on either ends it on both. One httpx client stands for the browser (cookies
do not tell ports apart, so its jar goes to both, as a load balancer's single address would)."""

from __future__ import annotations

import re
import signal
import time

import httpx
import pytest

from tests.e2e.conftest import Cluster, _free_port

pytestmark = pytest.mark.e2e

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def wait_healthy(url: str, cluster: Cluster, name: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{name} not healthy; log:\n{cluster.log(name)}")


def csrf_of(browser: httpx.Client, url: str) -> str:
    page = browser.get(url)
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found is not None
    return found.group(1)


def test_a_login_is_honoured_by_every_orchestrator_and_survives_a_restart(
    cluster: Cluster,
) -> None:
    secret = cluster.run("token", "create", "--name", "ops", "--scopes", "read,admin")
    secret = secret.splitlines()[-1]
    cluster.env["API_AUTH"] = "tokens"
    cluster.start_orchestrator()
    a = cluster.url
    b = f"http://127.0.0.1:{_free_port()}"
    cluster.start("orchestrator-b", "orchestrator", ORCHESTRATOR_LISTEN=b.removeprefix("http://"))
    wait_healthy(b, cluster, "orchestrator-b")

    with httpx.Client(timeout=10, follow_redirects=False) as browser:
        form = csrf_of(browser, f"{a}/ui/login")  # the form from A, posted to B
        response = browser.post(f"{b}/ui/login", data={"csrf": form, "token": secret})
        assert response.status_code == 303, response.text
        assert browser.get(f"{a}/ui/workers").status_code == 200
        assert browser.get(f"{b}/ui/workers").status_code == 200

        cluster.signal("orchestrator", signal.SIGTERM)
        assert cluster.wait_exit("orchestrator") == 0
        cluster.start_orchestrator()  # a restart (a deploy) of A
        assert browser.get(f"{a}/ui/workers").status_code == 200

        csrf = csrf_of(browser, f"{a}/ui/workers")
        cookie = browser.cookies.get("dtq_session")
        assert cookie
        assert browser.post(f"{b}/ui/logout", data={"csrf": csrf}).status_code == 303
        browser.cookies.clear()
        browser.cookies.set("dtq_session", cookie, path="/ui")  # replayed: it must be dead
        time.sleep(1.1)  # past A's one-second lookup cache (a wait, not a timed assertion)
        for url in (a, b):
            refused = browser.get(f"{url}/ui/workers")
            assert refused.status_code == 303
            assert refused.headers["location"].startswith("/ui/login")
    cluster.stop_all()
    for name in ("orchestrator", "orchestrator-b"):
        assert secret not in cluster.log(name)
