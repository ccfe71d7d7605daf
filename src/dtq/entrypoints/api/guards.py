"""The request hook of the submission routes: media type and strict decoding, in one place.

:func:`json_body` builds the ``before_request`` hook a submission route declares. It is the one
place where a request body is judged as JSON; the handler then receives the already-checked
Struct as ``data`` and calls no decoder itself. In order, the hook refuses:

1. a ``Content-Type`` other than ``application/json`` or ``application/<subtype>+json``
   (HTTP 415 ``unsupported_media_type``), before any byte of the body is read;
2. a body that is not JSON (HTTP 400 ``invalid_json``; a string holding a lone UTF-16
   surrogate escape such as ``"\\ud800"``, or a number beyond a 64-bit float such as ``1e999``,
   is named by its path), or larger than ``API_MAX_BODY_BYTES`` (HTTP 413, raised by Litestar
   while the body is read);
3. a value of the wrong JSON type or outside its declared range, or an unknown or missing
   field (HTTP 400 ``validation_error`` naming the field), decoded in msgspec's *strict* mode:
   ``"3"`` or ``3.0`` for an integer field is refused, as ``/schema`` says. Litestar's own (lax)
   conversion of ``data`` runs afterwards on the cached JSON and cannot refuse what strict mode
   accepted;
4. an object with the same key twice (HTTP 400 ``invalid_json``, ``field`` the key's path, in
   the body's own notation): msgspec and Litestar keep the last value silently. Checked after
   the Struct accepted the (last-wins) document, so the path always starts at a real field.

:func:`submission_body` is :func:`json_body` for ``POST /v1/tasks`` and ``POST /v1/jobs``, which
first refuses an ``Idempotency-Key`` header given more than once (HTTP 400 ``validation_error``,
``field`` ``Idempotency-Key``): Litestar would take the first and drop the others silently.
:func:`worker_body` does the same with ``X-Worker-Id`` for the worker protocol's routes that
read it (the claim and the run reports).

:func:`no_input` is the hook of a route that takes neither a query parameter nor a body.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import ClientException, SerializationException

from dtq.domain.errors import ValidationError
from dtq.entrypoints.api.errors import BodyRefused, UnsupportedMediaType
from dtq.entrypoints.api.filters import check_names

BeforeRequest = Callable[[Request[Any, Any, Any]], Awaitable[None]]


class DuplicateKey(ValidationError):
    """A JSON object of the body has the same key twice (HTTP 400)."""

    code = "invalid_json"


class LoneSurrogate(ValidationError):
    """A string of the body holds a UTF-16 surrogate escape that is not half of a pair."""

    code = "invalid_json"


class ByteOrderMark(ValidationError):
    """The body starts with a UTF-8 byte order mark (RFC 8259 §8.1: JSON text must not)."""

    code = "invalid_json"


#: The UTF-8 byte order mark.
_BOM = b"\xef\xbb\xbf"


class NumberOutOfRange(ValidationError):
    """A number of the body is beyond what a 64-bit float holds (``1e999``)."""

    code = "invalid_json"


class NonFiniteNumber(ValidationError):
    """The body holds ``NaN``, ``Infinity`` or ``-Infinity``, which JSON has no syntax for."""

    code = "invalid_json"


#: A code point that only a lone ``\uD800``-``\uDFFF`` escape can put into a decoded string.
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_body(model: type[msgspec.Struct]) -> BeforeRequest:
    """The ``before_request`` hook of a route whose body decodes into ``model``.

    Args:
        model: the request Struct, e.g. ``SubmitTaskRequest``.

    Returns:
        An async hook that returns None (so the handler runs) or raises one of the errors in
        this module's docstring.
    """

    async def guard(request: Request[Any, Any, Any]) -> None:
        require_json_content_type(request)
        raw = await request.body()
        if not raw.strip():
            raise ValidationError("a JSON request body is required (the body is empty)")
        try:
            document = await request.json()
        except SerializationException as exc:  # what Litestar raises for a handler's `data`
            if raw.startswith(_BOM):
                raise ByteOrderMark(
                    "request body is not valid JSON: it starts with a UTF-8 byte order mark"
                    " (EF BB BF), which JSON text must not"
                ) from None
            reject_undecodable_values(raw)
            raise ClientException(str(exc)) from exc
        try:
            msgspec.convert(document, type=model, strict=True)
        except msgspec.ValidationError as exc:
            raise BodyRefused(model, str(exc)) from exc
        reject_duplicate_keys(await request.body(), document)

    return guard


def submission_body(model: type[msgspec.Struct]) -> BeforeRequest:
    """The ``before_request`` hook of a submission route: one ``Idempotency-Key`` at most, then
    :func:`json_body` of ``model``.

    Raises:
        ValidationError: the header is given more than once (``field`` ``Idempotency-Key``).
    """
    return _single_header("Idempotency-Key", json_body(model))


def worker_body(model: type[msgspec.Struct]) -> BeforeRequest:
    """The ``before_request`` hook of a worker protocol route that reads ``X-Worker-Id``: one
    ``X-Worker-Id`` at most, then :func:`json_body` of ``model``.

    Raises:
        ValidationError: the header is given more than once, with the same value or not
            (``field`` ``X-Worker-Id``).
    """
    return _single_header("X-Worker-Id", json_body(model))


def single_header(headers: Any, name: str) -> str | None:
    """The value of the header ``name`` in ``headers`` (Litestar's or Starlette's ``Headers``,
    matched case-insensitively), or None when it is absent.

    Raises:
        ValidationError: the header is given more than once (``field`` ``name``), with the
            same value or not: which one is meant is anyone's guess.
    """
    values = headers.getall(name.lower(), ())
    if len(values) > 1:
        raise ValidationError(f"{name} given more than once", field=name)
    return str(values[0]) if values else None


def _single_header(name: str, body: BeforeRequest) -> BeforeRequest:
    """``body`` after refusing a request that gives the header ``name`` more than once."""

    async def guard(request: Request[Any, Any, Any]) -> None:
        single_header(request.headers, name)
        await body(request)

    return guard


async def no_query(request: Request[Any, Any, Any]) -> None:
    """The ``before_request`` hook of a route that takes no query parameter and reads its body
    itself, or has none (the artifact routes).

    Raises:
        ValidationError: a query parameter (``field`` its name).
    """
    check_names((k for k, _ in request.query_params.multi_items()), frozenset())


async def no_input(request: Request[Any, Any, Any]) -> None:
    """The ``before_request`` hook of a route that takes neither a query parameter nor a body
    (cancel and retry of one task or job, a bulk operation's read, the webhook routes other
    than the create), so that an option the route does not have
    (``?dry_run=true``, ``{"cascade": false}``) is refused rather than ignored while the command
    runs.

    Raises:
        ValidationError: a query parameter (``field`` its name, as the reads'
            :func:`~dtq.entrypoints.api.filters.check_names` refuses it), or a body of any type
            and length above zero (field ``body``).
    """
    check_names((k for k, _ in request.query_params.multi_items()), frozenset())
    if await request.body():
        raise ValidationError(
            "this route takes no body; send the request without one", field="body"
        )


def require_json_content_type(request: Request[Any, Any, Any]) -> None:
    """Refuse a ``Content-Type`` other than JSON; a charset parameter is ignored.

    Litestar decodes a JSON body whatever its declared type. Requiring the JSON media type
    means a web page on another origin cannot make a visitor's browser submit tasks with a
    plain form, ``text/plain`` or a typeless request (those need no CORS preflight).

    Raises:
        UnsupportedMediaType: another or no media type (HTTP 415, ``unsupported_media_type``).
    """
    media_type = request.content_type[0].strip().lower()
    if is_json_media_type(media_type):
        return
    shown = media_type or "missing"
    raise UnsupportedMediaType(detail=f"Content-Type must be application/json, not {shown}")


def is_json_media_type(content_type: str) -> bool:
    """Whether a ``Content-Type`` value (parameters such as ``charset`` allowed) names JSON:
    ``application/json`` or ``application/<subtype>+json``."""
    media_type = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return media_type == "application/json" or (
        kind == "application" and subtype.endswith("+json") and len(subtype) > len("+json")
    )


def reject_undecodable_values(raw: bytes) -> None:
    """Name the value at fault in a body msgspec refused, when it is a string holding a lone
    surrogate escape, a number beyond a 64-bit float, or ``NaN``/``Infinity``/``-Infinity``.

    msgspec reports ``"\\ud800"`` not followed by a low surrogate as "Input data was truncated",
    which sends the client looking for a cut-off body, and ``1e999`` as "Number out of range"
    at a path whose object keys it does not show (``$[...]``). Python's parser accepts both, so
    it finds the value; a body it refuses as well, or one without such a value, keeps msgspec's
    message (in the API's words: :func:`dtq.entrypoints.api.refusals.reason`).

    Raises:
        LoneSurrogate: naming the string's path; a key holding one is named by its own path,
            the surrogate written as its escape (``payload.k\\ud800``).
        NumberOutOfRange: naming the number's path, e.g. ``tasks[0].payload.x``.
        NonFiniteNumber: naming the path of ``NaN``, ``Infinity`` or ``-Infinity`` (msgspec
            says "invalid character" at a byte offset).
    """
    try:
        document = json.loads(
            raw.decode("utf-8"),
            parse_constant=_Constant,
            parse_float=_float_or_literal,
            object_pairs_hook=_Pairs,  # a repeated key must not hide a value
        )
    except (ValueError, RecursionError):
        return
    # in document order, a key just before its value: the first part at fault is named
    stack: list[tuple[Any, str, bool]] = [(document, "", False)]
    while stack:
        value, path, is_key = stack.pop()
        if is_key:
            _check_surrogates(value, "a key", path)
        elif isinstance(value, _Constant):
            raise NonFiniteNumber(
                f"{value} is not a JSON value (JSON has no NaN or infinities: send null, a"
                " string or a finite number)",
                field=path or None,
            )
        elif isinstance(value, _OutOfRange):
            raise NumberOutOfRange(
                f"number out of range: {value[:64]} (a JSON number must fit in a 64-bit float,"
                " at most about 1.8e308)",
                field=path or None,
            )
        elif isinstance(value, str):
            _check_surrogates(value, "a string", path)
        elif isinstance(value, _Pairs):
            for key, item in reversed(value):
                key_path = f"{path}.{key}" if path else key
                stack.append((item, key_path, False))
                stack.append((key, key_path, True))
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]", False) for i, v in reversed(list(enumerate(value))))


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs, repeated keys kept."""

    __slots__ = ()


class _Constant(str):
    """``NaN``, ``Infinity`` or ``-Infinity`` as Python's parser found it (not JSON)."""

    __slots__ = ()


class _OutOfRange(str):
    """The literal of a number beyond a 64-bit float, as :func:`_float_or_literal` kept it."""

    __slots__ = ()


def _float_or_literal(literal: str) -> float | _OutOfRange:
    number = float(literal)
    return _OutOfRange(literal) if math.isinf(number) else number


def _check_surrogates(text: str, what: str, path: str) -> None:
    """Raise :class:`LoneSurrogate` naming ``path`` (surrogates in it shown as ``\\udXXX``,
    so that the error body can be encoded) when ``text`` holds a lone surrogate."""
    if found := _SURROGATE.search(text):
        raise LoneSurrogate(
            f"request body is not valid JSON: {what} holds a lone UTF-16 surrogate escape"
            f" \\u{ord(found[0]):04x} (a surrogate must be half of a pair)",
            field=path.encode("utf-8", "backslashreplace").decode("utf-8") or None,
        )


class _Repeated(dict[str, Any]):
    """An object of the body that had a key twice; ``key`` is the first repeated one."""

    key: str


#: Most containers :func:`_member_count` walks before it leaves a body to the full check.
MEMBER_COUNT_BUDGET = 256


def _member_count(document: Any) -> int | None:
    """The keys of every object in ``document`` (a decoded JSON value), summed; None past
    :data:`MEMBER_COUNT_BUDGET` containers."""
    count = 0
    budget = MEMBER_COUNT_BUDGET
    stack = [document]
    while stack:
        value = stack.pop()
        budget -= 1
        if budget < 0:
            return None
        if isinstance(value, dict):
            count += len(value)
            stack.extend(v for v in value.values() if isinstance(v, dict | list))
        else:
            stack.extend(v for v in value if isinstance(v, dict | list))
    return count


def reject_duplicate_keys(raw: bytes, document: Any = None) -> None:
    """Refuse a JSON document (already known to be valid) in which an object repeats a key.

    Args:
        raw: the document as received.
        document: ``raw`` decoded, when the caller has it: a document whose objects hold as
            many keys in all as ``raw`` has colons is passed without parsing ``raw`` again
            (every member of an object is one colon outside a string; a repeated key or a
            colon inside a string makes the colons more, and then ``raw`` is parsed).

    Raises:
        DuplicateKey: naming the path of the repeated key, e.g. ``tasks[0].name``.
    """
    if isinstance(document, dict | list) and _member_count(document) == raw.count(b":"):
        return
    found = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        obj = dict(items)
        if len(obj) == len(items):
            return obj
        found = True
        repeated = _Repeated(obj)
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                repeated.key = key
                break
            seen.add(key)
        return repeated

    try:
        document = json.loads(raw, object_pairs_hook=pairs)
    except ValueError:  # e.g. an integer literal past the interpreter's digit limit
        return
    if not found:
        return
    stack: list[tuple[Any, str]] = [(document, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, _Repeated):
            field = f"{path}.{value.key}" if path else value.key
            raise DuplicateKey(f"duplicate key {value.key!r} in a JSON object", field=field)
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}" if path else k) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
