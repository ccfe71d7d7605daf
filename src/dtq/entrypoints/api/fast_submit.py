"""``POST /v1/tasks`` without Litestar's per-request machinery, for the requests that need none
of it (issue 17 item 3; ARCHITECTURE.md, "The submit fast path").

:class:`SubmitFastPath` sits between Litestar's exception handler and its router. A request it
takes is answered exactly as the route in :mod:`dtq.entrypoints.api.tasks` answers it, with the
same checks in the same order (bearer token and scope, JSON media type, body size, the strict
body decode and the duplicate-key check of :func:`dtq.entrypoints.api.guards.json_body`, the
``Idempotency-Key`` rules), the same :class:`~dtq.entrypoints.api.middleware.Submission`, the
same body and status. It takes only a request whose input is already known to be good:

* ``POST`` to exactly ``/v1/tasks`` with no query string and no ``root_path``;
* a single ``Host``, ``Content-Type``, ``Content-Length``, ``Idempotency-Key``, ``traceparent``
  and ``Authorization`` header each at most, no ``Transfer-Encoding``, a valid host, a JSON
  media type, a ``Content-Length`` within ``API_MAX_BODY_BYTES`` that the body matches;
* a body that decodes into ``SubmitTaskRequest`` strictly, with no repeated key, and a valid
  ``Idempotency-Key`` when there is one.

Anything else goes to the router unchanged, the body (if it was read) replayed first, so every
error, including its wording, comes from the one implementation. Errors that arise while the
fast path serves a request (401/403 of the token, 408 of a slow body, the submit's 409/503...)
are raised to Litestar's exception handler with the route's handlers in scope, as the router
would have left them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec
from litestar._asgi.utils import is_valid_host
from litestar.enums import ScopeType
from litestar.utils.scope.state import ScopeState

from dtq.application.tokens import TokenService
from dtq.entrypoints.api.auth import authorize, required_scope
from dtq.entrypoints.api.guards import DuplicateKey, is_json_media_type, reject_duplicate_keys
from dtq.entrypoints.api.middleware import Submission
from dtq.entrypoints.api.schemas import (
    IDEMPOTENCY_KEY_MAX,
    IDEMPOTENCY_KEY_PATTERN,
    SubmitTaskRequest,
)
from dtq.entrypoints.api.tasks import submit_one

if TYPE_CHECKING:
    from litestar import Litestar
    from litestar.handlers import HTTPRouteHandler
    from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

__all__ = ["PATH", "SubmitFastPath"]

#: The route the fast path serves (``POST`` only).
PATH = "/v1/tasks"

#: Headers the fast path reads; a request repeating one of them goes to the router.
_READ = frozenset(
    {
        b"host",
        b"content-type",
        b"content-length",
        b"idempotency-key",
        b"traceparent",
        b"authorization",
    }
)
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
_JSON = [(b"content-type", b"application/json")]
_ENCODER = msgspec.json.Encoder()


class SubmitFastPath:
    """The ASGI layer serving plain ``POST /v1/tasks`` requests itself (module docstring).

    Args:
        router: Litestar's router (``app.asgi_router``): everything else goes there.
        app: the constructed application, whose ``POST /v1/tasks`` handler lends its exception
            handlers and its place in the scope.
        submission: the same object the route is given.
        tokens: the token service when ``API_AUTH=tokens``, else None (no check).
        metrics_auth: ``METRICS_AUTH`` (passed to :func:`required_scope`).
        max_body: ``API_MAX_BODY_BYTES``.
    """

    def __init__(
        self,
        router: ASGIApp,
        app: Litestar,
        submission: Submission,
        *,
        tokens: TokenService | None,
        metrics_auth: bool,
        max_body: int,
    ) -> None:
        self._router = router
        self._handler = _post_handler(app, PATH)
        self._exception_handlers = self._handler.resolve_exception_handlers()
        self._submission = submission
        self._tokens = tokens
        self._needed = required_scope("POST", PATH, metrics_auth=metrics_auth)
        self._max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve ``scope`` here when it qualifies, else hand it to the router."""
        if (
            scope["type"] != ScopeType.HTTP
            or scope["path"] != PATH
            or scope["method"] != "POST"
            or scope["query_string"]
            or scope.get("root_path")
        ):
            await self._router(scope, receive, send)
            return
        headers = self._headers(scope)
        if headers is None:
            await self._router(scope, receive, send)
            return
        self._route(scope)
        if self._tokens is not None and self._needed is not None:
            state = scope.setdefault("state", {})
            await authorize(self._tokens, state, headers.authorization, self._needed)
        received: list[ReceiveMessage] = []
        body = await _read_body(receive, headers.length, received)
        data = None if body is None else _decode(body)
        key = headers.idempotency_key
        if data is None or (key is not None and not _valid_key(key)):
            await self._router(scope, _replay(received, receive), send)
            return
        answer, status = await submit_one(self._submission, data, key, headers.traceparent)
        payload = _ENCODER.encode(answer)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*_JSON, (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload, "more_body": False})

    def _headers(self, scope: Scope) -> _Headers | None:
        """The headers the fast path reads, or None when the request should go to the router."""
        found: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            if name in _READ:
                if name in found:
                    return None
                found[name] = value
            elif name == b"transfer-encoding":
                return None
        host = found.get(b"host")
        length = found.get(b"content-length")
        if (
            (host is not None and not is_valid_host(host))  # else the router's 400
            or length is None
            or not length.isdigit()
            or int(length) > self._max_body
            or not is_json_media_type(found.get(b"content-type", b"").decode("latin-1"))
        ):
            return None
        return _Headers(found, int(length))

    def _route(self, scope: Scope) -> None:
        """Leave in ``scope`` what the router would have: the route, its template and its
        exception handlers (read by the metrics, the token check and the error handler)."""
        ScopeState.from_scope(scope).exception_handlers = self._exception_handlers
        scope["route_handler"] = self._handler
        scope["path_template"] = PATH
        scope["path_params"] = {}


class _Headers:
    """The request headers the fast path reads (already known not to repeat)."""

    __slots__ = ("authorization", "idempotency_key", "length", "traceparent")

    def __init__(self, found: dict[bytes, bytes], length: int) -> None:
        self.length = length
        self.authorization = _text(found.get(b"authorization"))
        self.idempotency_key = _text(found.get(b"idempotency-key"))
        self.traceparent = _text(found.get(b"traceparent"))


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


async def _read_body(receive: Receive, length: int, received: list[ReceiveMessage]) -> bytes | None:
    """The whole body, or None when it is not what ``Content-Length`` said or the client left;
    every message taken from ``receive`` is appended to ``received`` (for :func:`_replay`)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > length:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if size != length:
        return None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _decode(body: bytes) -> SubmitTaskRequest | None:
    """The request as the route's guard accepts it (JSON, strictly typed, no repeated key), or
    None when the guard would refuse it."""
    try:
        document = msgspec.json.decode(body)
        data = msgspec.convert(document, type=SubmitTaskRequest, strict=True)
        reject_duplicate_keys(body, document)
    except (msgspec.DecodeError, msgspec.ValidationError, DuplicateKey, RecursionError):
        return None
    return data


def _valid_key(key: str) -> bool:
    return 0 < len(key) <= IDEMPOTENCY_KEY_MAX and _IDEMPOTENCY_KEY.match(key) is not None


def _replay(received: list[ReceiveMessage], receive: Receive) -> Receive:
    """A ``receive`` that gives ``received`` again, in order, then reads on from ``receive``."""
    pending = list(received)

    async def replayed() -> Any:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def _post_handler(app: Litestar, path: str) -> HTTPRouteHandler:
    """The ``POST`` handler of ``path`` in ``app``.

    Raises:
        LookupError: ``app`` has no such route.
    """
    from litestar.routes import HTTPRoute

    for route in app.routes:
        if isinstance(route, HTTPRoute) and route.path == path:
            found = route.route_handler_map.get("POST")
            if found is not None:
                return found[0]
    raise LookupError(f"no POST {path} route")
