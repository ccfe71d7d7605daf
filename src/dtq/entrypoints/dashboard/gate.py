"""Who may see the dashboard (issue 16 item 3): the login check and the CSRF check of every
``/ui`` route except the login page and the static files.

With ``API_AUTH=tokens`` a request needs the ``dtq_session`` cookie of a live session
(:mod:`~dtq.entrypoints.dashboard.sessions`; one lookup through ``SessionService.resolve``,
cached for a second) whose token is still valid and holds the route's scope: ``read`` for a
page, ``admin`` for an action (a handler may name another in ``opt["dashboard_scope"]``:
logout needs only a session). No session: a page answers ``303``
to ``/ui/login?next=<path>`` (an htmx request: ``401`` with ``HX-Redirect``), an action ``401``.
A missing scope: ``403``. The live-update stream (``opt["dashboard_stream"]``) answers ``401``
without a redirect: ``EventSource`` cannot follow one to a login form. With ``API_AUTH=none``
nobody logs in.

Every state-changing request (any method but ``GET``, ``HEAD``, ``OPTIONS``) must carry the
session's CSRF token (with ``API_AUTH=none``: one random token every orchestrator on the
database shares, ``SessionService.shared_key(ANONYMOUS_KEY)``) as the form
field ``csrf`` or the ``X-CSRF-Token`` header (htmx requests: ``hx-headers`` on ``<body>``),
else ``403`` before its handler runs, so nothing changes. The synchronizer token, with the
cookie's ``SameSite=Strict``, makes the actions CSRF-safe; the login form has its own
pre-session token (:mod:`~dtq.entrypoints.dashboard.csrf`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from litestar import Request, Response
from litestar.response import Redirect, Template

from dtq.application.sessions import SessionService
from dtq.domain.tokens import Scope
from dtq.entrypoints.dashboard.sessions import ANONYMOUS_KEY, COOKIE, csrf_matches

#: Where the login page lives.
LOGIN_PATH = "/ui/login"
#: The header an htmx request may carry the session's CSRF token in (instead of the form field).
CSRF_HEADER = "X-CSRF-Token"
#: Methods that change nothing (no CSRF token needed).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: What a request without the right CSRF token is told (403).
CSRF_REFUSED = (
    "Refused: this request did not carry the dashboard's CSRF token for your session (it is"
    " missing, or from an older page or another session). Nothing was changed; reload the"
    " page and try again."
)


def safe_next(value: object, default: str = "/ui") -> str:
    """A redirect target inside the dashboard: ``value`` when it is a ``/ui`` path, else
    ``default`` (never another host: no ``//``, no scheme, no backslash)."""
    if not isinstance(value, str) or not (value == "/ui" or value.startswith("/ui/")):
        return default
    if "//" in value or "\\" in value or any(ord(c) < 32 for c in value):
        return default
    return value


def error_page(status: int, title: str, message: str) -> Template:
    """The dashboard's HTML error page (``error.html``) with ``status``."""
    return Template(
        template_name="error.html",
        context={"title": title, "message": message, "status": status},
        status_code=status,
    )


class Gate:
    """The ``before_request`` hook of the protected ``/ui`` routes.

    Args:
        sessions: the shared sessions (and, with ``API_AUTH=none``, the shared CSRF token).
        tokens_on: ``API_AUTH=tokens``.
    """

    def __init__(self, *, sessions: SessionService, tokens_on: bool) -> None:
        self.sessions = sessions
        self.tokens_on = tokens_on

    async def __call__(self, request: Request[Any, Any, Any]) -> Response[Any] | None:
        """None lets the request through (with ``request.state.csrf`` and, with tokens,
        ``request.state.principal`` set); a response refuses it."""
        opt = request.route_handler.opt
        unsafe = request.method not in SAFE_METHODS
        needed = Scope(opt.get("dashboard_scope", "admin" if unsafe else "read"))
        request.state.principal = None
        if self.tokens_on:
            refused = await self._authenticate(request, needed)
            if refused is not None:
                return refused
        else:
            request.state.csrf = await self.sessions.shared_key(ANONYMOUS_KEY)
        if unsafe:
            sent: object = request.headers.get(CSRF_HEADER)
            if sent is None:
                sent = (await request.form()).get("csrf")
            if not csrf_matches(request.state.csrf, sent):
                return error_page(403, "Forbidden", CSRF_REFUSED)
        return None

    async def _authenticate(
        self, request: Request[Any, Any, Any], needed: Scope
    ) -> Response[Any] | None:
        session = await self.sessions.resolve(request.cookies.get(COOKIE))
        if session is None:
            return self._to_login(request)
        principal = session.principal
        if needed not in principal.scopes:
            return error_page(
                403, "Forbidden", f"This needs a token with the {needed.value!r} scope."
            )
        request.state.csrf = session.csrf
        request.state.principal = principal
        return None

    def _to_login(self, request: Request[Any, Any, Any]) -> Response[Any]:
        target = f"{LOGIN_PATH}?next={quote(safe_next(request.url.path))}"
        if request.route_handler.opt.get("dashboard_stream"):
            return Response(
                "Log in first.", status_code=401, media_type="text/plain; charset=utf-8"
            )
        if request.method != "GET":
            return error_page(401, "Log in first", "Your session has ended; log in again.")
        if request.headers.get("hx-request"):
            return Response(b"", status_code=401, headers={"HX-Redirect": target})
        return Redirect(target, status_code=303)
