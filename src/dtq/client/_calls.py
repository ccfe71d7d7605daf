"""What the sync and async clients share: each API call as a :class:`Call` (method, path,
query, body, how to decode the answer), the error mapping, and the retry schedule.

Neither client does anything but send a ``Call`` with its own httpx client and apply
:func:`outcome` to the answer, so the two cannot drift apart.
"""

from __future__ import annotations

import email.utils
import math
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from dtq.client.config import idempotency_key_problem
from dtq.client.errors import ApiError, InvalidRequest, error_for

T = TypeVar("T")


class Paged(Protocol):
    """A page of a keyset-paged route: its ``next_cursor`` (None on the last page)."""

    @property
    def next_cursor(self) -> str | None: ...


P = TypeVar("P", bound=Paged)

#: Statuses a call is retried on (when the server says so with Retry-After, or by backoff).
RETRY_STATUSES = frozenset({429, 503})

#: Longest wait between two tries, whatever Retry-After says (seconds).
MAX_RETRY_WAIT = 30.0

_json = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how to read its answer.

    Attributes:
        method, path: the route (``path`` starts with ``/``).
        decode: bytes of a 2xx body -> the typed result (None for 204).
        params: query parameters (None values are dropped).
        json: the JSON body, or None for none.
        headers: extra headers (the Idempotency-Key of a submit).
        safe_to_resend: a transport failure (no answer at all) may be retried: true for reads,
            for submits (they carry an Idempotency-Key) and for idempotent commands.
    """

    method: str
    path: str
    decode: Callable[[bytes | None], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    safe_to_resend: bool = True

    def query(self) -> dict[str, str]:
        """The query parameters to send: None dropped, lists joined by commas, datetimes as
        RFC 3339."""
        out: dict[str, str] = {}
        for key, value in (self.params or {}).items():
            if value is None:
                continue
            if isinstance(value, (list, tuple, set, frozenset)):
                out[key] = ",".join(str(v) for v in value)
            elif isinstance(value, datetime):
                out[key] = value.isoformat()
            else:
                out[key] = str(value)
        return out


def struct(type_: type[T]) -> Callable[[bytes | None], T]:
    """A decoder of a 2xx body into ``type_`` (a msgspec Struct of the API's schemas)."""
    decoder = msgspec.json.Decoder(type_)

    def decode(content: bytes | None) -> T:
        if content is None:
            raise ApiError(204, "no_content", "the orchestrator answered 204 with no body")
        return decoder.decode(content)

    return decode


def idempotency_key(given: str | None) -> dict[str, str]:
    """The Idempotency-Key header of a submit: ``given``, or a fresh random one, so a retried
    submit can never create the job twice.

    Raises:
        InvalidRequest: ``given`` cannot be sent as given (``config.idempotency_key_problem``:
            empty, too long, outside printable ASCII, a space at either end).
    """
    if given is not None and (problem := idempotency_key_problem(given)) is not None:
        raise InvalidRequest(f"Idempotency-Key: {problem}")
    return {"Idempotency-Key": given if given is not None else f"dtq-client-{uuid.uuid4()}"}


def encode_body(value: Any) -> bytes | None:
    """``value`` as a JSON request body (None: no body).

    Raises:
        InvalidRequest: some part of it would not come back as given, naming its path
            (``payload.x``): a value JSON has no form for (NaN or an infinity, a set, a tuple,
            bytes, a datetime or any other object), a key that is not a string, or a string holding
            a lone UTF-16 surrogate, which JSON in UTF-8 cannot carry.
    """
    if value is None:
        return None
    check_json(value)
    try:
        return msgspec.json.encode(value)
    except UnicodeEncodeError:
        # Found again with its path only now: encoding each string up front would cost every
        # request a second pass over its text.
        check_json(value, text=True)
        raise InvalidRequest(_SURROGATE) from None


#: Why a string holding a lone surrogate is refused.
_SURROGATE = "a lone UTF-16 surrogate escape (a surrogate must be half of a pair)"


#: The Python types a JSON body is made of; msgspec would also encode others by converting
#: them (a set as an array, bytes as base64, NaN as null), which changes what was given.
_SCALARS = (str, int, bool, type(None))


def check_json(value: Any, *, text: bool = False) -> None:
    """Check that ``value`` is made only of dicts with string keys, lists, strings, integers,
    finite floats, booleans and None (a tuple would come back as a list: the same rule as a
    handler's result, ``domain.payload.check_result``); with ``text``, also that no string or
    key holds a lone UTF-16 surrogate (UTF-8 has no form for one).

    Raises:
        InvalidRequest: naming the path of the first part that is not (``payload.x[2]``; a
            key's problem is named at its object's path).
    """
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if text and not _utf8(item):
                _refuse(path, _SURROGATE)
            continue
        if isinstance(item, _SCALARS):
            continue
        if isinstance(item, float):
            if math.isfinite(item):
                continue
            _refuse(path, f"{item!r} is not a JSON number")
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    _refuse(path, f"a key must be a string, got {type(key).__name__} {key!r}")
                if text and not _utf8(key):
                    _refuse(path, f"key {key!r}: {_SURROGATE}")
                stack.append((child, f"{path}.{key}" if path else key))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
        else:
            _refuse(path, f"{type(item).__name__} is not a JSON type")


def _utf8(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _refuse(path: str, reason: str) -> None:
    where = f"{path}: " if path else ""
    raise InvalidRequest(f"{where}{reason} (it would not be sent as given)")


def outcome(call: Call[T], status: int, content: bytes) -> T:
    """The result of ``call`` for an answer, or raise its :class:`ApiError`."""
    if 200 <= status < 300:
        return call.decode(content if status != 204 else None)
    try:
        body: object = _json.decode(content) if content else None
    except msgspec.DecodeError:
        body = None
    raise error_for(status, body)


def retry_wait(attempt: int, retry_after: str | None, *, now: datetime | None = None) -> float:
    """Seconds to wait before try ``attempt + 1`` (``attempt`` >= 1): ``Retry-After`` when the
    server sent one (delta-seconds or an HTTP date), else 0.25 s doubling per try with jitter;
    capped at :data:`MAX_RETRY_WAIT`."""
    if retry_after:
        value = retry_after.strip()
        if value.isdigit():
            return min(float(value), MAX_RETRY_WAIT)
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            delta = (when - (now or datetime.now(UTC))).total_seconds()
            return min(max(delta, 0.0), MAX_RETRY_WAIT)
    base = min(0.25 * 2 ** (attempt - 1), MAX_RETRY_WAIT)
    return random.uniform(base / 2, base)


#: Task statuses that end a task (``completed``, ``failed``, ``cancelled``).
_TERMINAL = frozenset({"completed", "failed", "cancelled"})


def finished(job: Any) -> bool:
    """True when a ``JobBody`` is terminal and its counts show no unfinished task."""
    if str(job.status) not in _TERMINAL:
        return False
    return all(n == 0 for status, n in job.counts.items() if status not in _TERMINAL)


@dataclass(frozen=True, slots=True)
class _Pages(Generic[P]):
    """How to ask for one page of a keyset-paged route, given the cursor (None: the first)."""

    call: Callable[[str | None], Call[P]]


def pages(call: Callable[[str | None], Call[P]]) -> _Pages[P]:
    """The pages of a route, for ``Client._follow`` / ``AsyncClient._follow``."""
    return _Pages(call)
