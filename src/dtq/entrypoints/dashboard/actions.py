"""The dashboard's writes (issue 16 item 3): retry and cancel (``admin`` scope, CSRF-checked
by the gate), and the login and logout of ``API_AUTH=tokens``.

The gate has checked the session's CSRF token before an action runs; the login form carries
its own (a signed double-submit cookie, :mod:`~dtq.entrypoints.dashboard.csrf`).

Each action is a ``POST`` of an HTML form and answers ``303`` to the form's ``next`` field
(a ``/ui`` path; anything else falls back to the task's or job's page). A refusal of the
control service (retry of a task that is not failed, cancel of a finished one) is its usual
4xx, rendered as the dashboard's error page.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromQuery as Query
from litestar.response import Redirect, Template

from dtq.application.control import ControlService
from dtq.application.sessions import SessionService
from dtq.domain.tokens import Forbidden, Scope, Unauthenticated
from dtq.entrypoints.api.params import ResourceId, parse_id
from dtq.entrypoints.dashboard.csrf import LOGIN_COOKIE, LOGIN_COOKIE_AGE, LoginTokens
from dtq.entrypoints.dashboard.gate import CSRF_REFUSED, LOGIN_PATH, safe_next
from dtq.entrypoints.dashboard.sessions import COOKIE, LOGIN_KEY


async def _next(request: Request[Any, Any, Any], default: str) -> Redirect:
    form = await request.form()
    return Redirect(safe_next(form.get("next"), default), status_code=303)


class ActionsController(Controller):
    """``POST /ui/tasks/{id}/retry|cancel``, ``POST /ui/jobs/{id}/cancel``."""

    path = "/ui"
    include_in_schema = False

    @post("/tasks/{id:str}/retry", status_code=303)
    async def retry_task(
        self,
        request: Request[Any, Any, Any],
        control: NamedDependency[ControlService],
        id: ResourceId,
    ) -> Redirect:
        """Retry a failed task with a fresh budget (``ControlService.retry_task``)."""
        task_id = parse_id(id)
        await control.retry_task(task_id)
        return await _next(request, f"/ui/tasks/{task_id}")

    @post("/tasks/{id:str}/cancel", status_code=303)
    async def cancel_task(
        self,
        request: Request[Any, Any, Any],
        control: NamedDependency[ControlService],
        id: ResourceId,
    ) -> Redirect:
        """Cancel a task (``ControlService.cancel_task``)."""
        task_id = parse_id(id)
        await control.cancel_task(task_id)
        return await _next(request, f"/ui/tasks/{task_id}")

    @post("/jobs/{id:str}/cancel", status_code=303)
    async def cancel_job(
        self,
        request: Request[Any, Any, Any],
        control: NamedDependency[ControlService],
        id: ResourceId,
    ) -> Redirect:
        """Cancel every unfinished task of a job (``ControlService.cancel_job``)."""
        job_id = parse_id(id)
        await control.cancel_job(job_id)
        return await _next(request, f"/ui/jobs/{job_id}")

    @post("/logout", status_code=303, opt={"dashboard_scope": Scope.READ.value})
    async def logout(
        self, request: Request[Any, Any, Any], sessions: NamedDependency[SessionService]
    ) -> Redirect:
        """End the session (on every orchestrator: it is deleted from the store) and forget
        its cookie."""
        await sessions.close(request.cookies.get(COOKIE))
        response = Redirect(LOGIN_PATH, status_code=303)
        response.delete_cookie(COOKIE, path="/ui")
        return response


class LoginController(Controller):
    """``GET``/``POST /ui/login``: open to everyone (the gate does not run here)."""

    path = LOGIN_PATH
    include_in_schema = False

    @get("/")
    async def form(
        self,
        request: Request[Any, Any, Any],
        sessions: NamedDependency[SessionService],
        next: Query[str | None] = None,
    ) -> Template:
        """The login form, with its CSRF token (the cookie's, when it is still valid)."""
        login_tokens = await _login_tokens(sessions)
        return _login_page(request, login_tokens, safe_next(next), None, 200)

    @post("/", status_code=303)
    async def login(
        self,
        request: Request[Any, Any, Any],
        sessions: NamedDependency[SessionService],
    ) -> Response[Any]:
        """Check the form's CSRF token against its cookie (else 403 and a fresh form, before
        the token is even looked at), then the posted ``token`` (it needs the ``read``
        scope); open a session in the store and set its cookie (HttpOnly, SameSite=Strict,
        Secure over https, path ``/ui``), ending the session the browser had before, if any.
        A token that does not authenticate renders the form again with 401, one without
        ``read`` with 403."""
        form = await request.form()
        target = safe_next(form.get("next"))
        login_tokens = await _login_tokens(sessions)
        if not login_tokens.accepts(request.cookies.get(LOGIN_COOKIE), form.get("csrf")):
            return _login_page(request, login_tokens, target, CSRF_REFUSED, 403, fresh=True)
        secret = form.get("token")
        try:
            opened = await sessions.open(
                secret.strip() if isinstance(secret, str) else None, scope=Scope.READ
            )
        except Unauthenticated:
            message = "That token does not authenticate."
            return _login_page(request, login_tokens, target, message, 401)
        except Forbidden:
            message = "That token lacks the 'read' scope the dashboard needs."
            return _login_page(request, login_tokens, target, message, 403)
        await sessions.close(request.cookies.get(COOKIE))  # a session this browser had before
        response = Redirect(target, status_code=303)
        response.delete_cookie(LOGIN_COOKIE, path=LOGIN_PATH)
        response.set_cookie(
            COOKIE,
            opened.cookie,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response


async def _login_tokens(sessions: SessionService) -> LoginTokens:
    """The login form's token signer, on the key every orchestrator shares."""
    return LoginTokens((await sessions.shared_key(LOGIN_KEY)).encode())


def _login_page(
    request: Request[Any, Any, Any],
    login_tokens: LoginTokens,
    target: str,
    error: str | None,
    status: int,
    *,
    fresh: bool = False,
) -> Template:
    """The login form with a CSRF token in its ``csrf`` field and the ``dtq_login_csrf``
    cookie: the browser's current one when this process signed it (several tabs share it),
    else a new one (always a new one with ``fresh``)."""
    token = request.cookies.get(LOGIN_COOKIE)
    if fresh or not login_tokens.signed(token):
        token = login_tokens.issue()
    assert token is not None
    page = Template(
        template_name="login.html",
        context={"next": target, "error": error, "csrf": token},
        status_code=status,
    )
    page.set_cookie(
        LOGIN_COOKIE,
        token,
        path=LOGIN_PATH,
        max_age=LOGIN_COOKIE_AGE,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return page
