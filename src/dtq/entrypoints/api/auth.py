"""Bearer-token authentication of the API: the scope rule, the guard, the OpenAPI scheme.

With ``API_AUTH=tokens`` every ``/v1`` route needs ``Authorization: Bearer <secret>`` of a token
holding the scope :func:`required_scope` names for the route's method and path template. That
function is the one place the mapping lives, as a rule rather than a table, so a route added
later gets a scope without an edit here:

=======================================  ==========
route                                    scope
=======================================  ==========
anything under ``/v1/worker/``           ``worker``
``GET``/``HEAD``/``OPTIONS`` under /v1   ``read``
``POST /v1/jobs``, ``/v1/tasks``,        ``submit``
``/v1/artifacts``
any other method and path under ``/v1``  ``admin``
``GET /metrics``                         ``read`` with ``METRICS_AUTH=true``, else open
everything else (``/healthz``,           open
``/schema``)
=======================================  ==========

:func:`auth_guard` is registered once as an app-level Litestar guard: it runs after routing
(so it sees the path template) and before the body is read or any hook runs. No token, a token
that is not valid, expired or revoked -> 401 ``unauthenticated`` with ``WWW-Authenticate:
Bearer``; a valid token without the scope -> 403 ``forbidden`` naming the scope (the error table
in :mod:`~dtq.entrypoints.api.errors`). The secret never reaches a log line, a metric label or
an error body: errors carry fixed messages, and the cache is keyed by the secret's hash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar.openapi.spec import Components, SecurityScheme
from litestar.routes import HTTPRoute

from dtq.application.tokens import Principal, TokenService
from dtq.domain.tokens import Scope, Unauthenticated
from dtq.entrypoints.api import responses
from dtq.entrypoints.api.guards import single_header

if TYPE_CHECKING:
    from litestar import Litestar
    from litestar.connection import ASGIConnection
    from litestar.handlers.base import BaseRouteHandler
    from litestar.types import Guard

#: Name of the security scheme in ``/schema`` (``components.securitySchemes``).
BEARER_SCHEME = "bearer"

#: The submission routes (method, path template): the ``submit`` scope.
SUBMIT_ROUTES = frozenset({("POST", "/v1/jobs"), ("POST", "/v1/tasks"), ("POST", "/v1/artifacts")})
#: Methods that only read: the ``read`` scope under ``/v1`` (OPTIONS reveals the allowed methods).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def required_scope(method: str, path: str, *, metrics_auth: bool = False) -> Scope | None:
    """The scope a request needs, by its method and route template; None for an open route.

    Args:
        method: the HTTP method, upper case.
        path: the route's path template, e.g. ``/v1/tasks/{id}`` (``scope["path_template"]``).
        metrics_auth: ``METRICS_AUTH``: ``/metrics`` needs ``read``.
    """
    if _under(path, "/metrics"):
        return Scope.READ if metrics_auth else None
    if not _under(path, "/v1"):
        return None
    if _under(path, "/v1/worker"):
        return Scope.WORKER
    if method in READ_METHODS:
        return Scope.READ
    if (method, path) in SUBMIT_ROUTES:
        return Scope.SUBMIT
    return Scope.ADMIN


def bearer_secret(header: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer <secret>`` header; None when there is none.

    Raises:
        Unauthenticated: the header uses another scheme or has no credentials.
    """
    if header is None:
        return None
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise Unauthenticated("use the header Authorization: Bearer <token>")
    return credentials.strip()


def auth_guard(tokens: TokenService, *, metrics_auth: bool) -> Guard:
    """The app-level guard enforcing :func:`required_scope` with ``tokens``.

    On success the token's :class:`~dtq.application.tokens.Principal` is left in the request
    state as ``principal`` (its name is safe to log; the secret is not kept). A request that
    already has one there (the submit fast path checked its token before reading its body, then
    handed it to the route) is not authenticated again: its token is checked once, before the
    body, whichever path serves it.

    Raises (from the guard):
        ValidationError: the ``Authorization`` header is given more than once (HTTP 400).
        Unauthenticated: HTTP 401.
        Forbidden: HTTP 403.
        BackendUnavailable: the database could not be asked (HTTP 503).
    """

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        scope = connection.scope
        method = str(scope.get("method", "GET"))
        needed = required_scope(method, scope["path_template"], metrics_auth=metrics_auth)
        if needed is None:
            return
        authorization = single_header(connection.headers, "Authorization")
        state = scope.setdefault("state", {})
        await authorize(tokens, state, authorization, needed)

    return guard


async def authorize(
    tokens: TokenService, state: dict[str, Any], authorization: str | None, needed: Scope
) -> None:
    """Require a token holding ``needed``, checked once per request.

    Args:
        tokens: the token service.
        state: the request's ASGI ``scope["state"]``; the token's principal is left there as
            ``principal``, and one already there is taken instead of asking again.
        authorization: the ``Authorization`` header, or None.
        needed: the route's scope (:func:`required_scope`).

    Raises:
        Unauthenticated: HTTP 401.
        Forbidden: HTTP 403.
        BackendUnavailable: the database could not be asked (HTTP 503).
    """
    principal = state.get("principal")
    if not isinstance(principal, Principal):
        principal = await tokens.authenticate(bearer_secret(authorization))
    principal.require(needed)
    state["principal"] = principal


def security_components() -> Components:
    """The ``components`` of ``/schema``: the bearer scheme."""
    return Components(
        security_schemes={
            BEARER_SCHEME: SecurityScheme(
                type="http",
                scheme="bearer",
                bearer_format="dtq_<43 characters>",
                description=(
                    "An API token from `dtq token create`; each operation lists the scope it "
                    "needs (submit, read, admin, worker)."
                ),
            )
        }
    )


def document_security(app: Litestar, *, metrics_auth: bool) -> None:
    """Mark every operation of ``app`` with the scope :func:`required_scope` gives it and its
    401/403 responses (before ``/schema`` is first generated)."""
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for method, (handler, _) in route.route_handler_map.items():
            needed = required_scope(method, route.path_format, metrics_auth=metrics_auth)
            if needed is None:
                continue
            handler.security = [{BEARER_SCHEME: [needed.value]}]
            handler.responses = {**(handler.responses or {}), **responses.AUTH}
